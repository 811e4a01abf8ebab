"""The FastAPI app: the page, the JSON API, and every failure as a status and one line (messages.py).

    GET    /                             the page (static files of this package; nothing else on disk is served)
    GET    /api/health                   device, precision, attention backend, loaded models, queue, checkpoints
    GET    /api/options                  choices, defaults and limits for the page's controls
    POST   /api/tryon                    multipart try-on, answered when done: images as data: URLs
    POST   /api/jobs                     the same request, answered at once with a job id (the page uses this)
    GET    /api/jobs/{id}                place in line, stage and step, then the result (file URLs) or the error
    DELETE /api/jobs/{id}                cancel: a waiting job leaves the line, a running one stops at its next step;
                                         the job is gone (410 afterwards)
    GET    /api/jobs/{id}/files/{name}   one of that job's PNGs
    GET    /openapi.json                 the schema of these routes, with examples: every status and constraint
                                         (contract.py)

A /api/tryon whose client goes away is cancelled at the next denoising step; so is every job when the server
stops (its waiting clients get 503).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import shutil
import stat
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect

from ootd import __version__
from ootd.app.console import one_line
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.settings import SETTINGS
from ootd.errors import NoPersonError, OotdError, UsageError
from ootd.models import ModelSource
from ootd.serve import contract, schema
from ootd.serve.access import CLIENT_GONE, AccessLog
from ootd.serve.forms import FILES, TEXT_FIELDS, FieldError, build_spec
from ootd.serve.limits import Auth, BodyLimit, Limits, RequireAuth
from ootd.serve.messages import classify, error_response
from ootd.serve.origins import ANY, Access, BrowserGuard
from ootd.serve.service import Finished, TryOnService, checkpoints_note
from ootd.serve.worker import CANCELLED, DONE, FAILED, Cancelled, Job, QueueFull, ShuttingDown, Worker
from ootd.settings import AUTO_CATEGORY, Category

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
POLL_S = 0.1  # how often a waiting /api/tryon looks whether its client is still there
DELETED_KEPT = 4096  # cancelled jobs remembered as gone (410) rather than unknown (404)


def _data_url(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def result_json(job: Job, base_url: str | None) -> dict[str, Any]:
    """A finished job's answer: images as data: URLs (`base_url` None) or as absolute URLs of this server."""
    done: Finished = job.result

    def ref(name: str) -> str:
        if base_url is None:
            return _data_url(done.files[name])
        return f"{base_url}api/jobs/{job.id}/files/{quote(name)}"

    seconds = job.seconds()
    timings = done.timings.to_json(4, **seconds, total=seconds["queue"] + seconds["run"])  # as --json
    settings = {**done.settings, "fit": str(job.spec.config.fit),
                "mask": "uploaded" if job.spec.job.inputs.garments[0].mask is not None else "auto"}
    return {
        "images": [ref(name) for name in done.names], "names": done.names, "seed": done.seed,
        "mask": ref(done.mask), "masked_person": ref(done.masked_person), "person_mask": ref(done.person_mask),
        "model_type": done.model_type, "timings": timings, "settings": settings,
        **{f"person_mask{number}": ref(name) for number, name in enumerate(done.more_masks, 2)},
        "preservation": done.preservation.to_json() if done.preservation is not None else None,
        **({"replica": done.replica} if done.replica is not None else {}),
    }


class Api:
    """The routes, over one server's config, service (the pipelines) and worker (the device's queue)."""

    def __init__(self, config: RunConfig, limits: Limits, service: TryOnService, worker: Worker,
                 jobs_root: Path) -> None:
        self.config, self.limits, self.service, self.worker, self.jobs_root = config, limits, service, worker, jobs_root
        checkpoints = Path(config.checkpoints)
        # what error messages call this server's folders instead of naming them
        self.roots = {str(checkpoints): "<checkpoints>", str(checkpoints.resolve()): "<checkpoints>",
                      str(jobs_root.parent): "<temporary folder>"}
        self._note: Any = ...  # not computed yet
        self.deleted: OrderedDict[str, None] = OrderedDict()  # jobs cancelled by DELETE: gone (410), newest last

    def register(self, app: FastAPI) -> None:
        app.add_api_route("/", self.page, methods=["GET"], include_in_schema=False)
        app.add_api_route("/favicon.ico", self.favicon, methods=["GET"], include_in_schema=False)
        app.add_api_route("/api/health", self.health, methods=["GET"], summary="Device, models, queue, checkpoints")
        app.add_api_route("/api/options", self.options, methods=["GET"], summary="Choices, defaults and limits")
        app.add_api_route("/api/tryon", self.tryon, methods=["POST"], **schema.tryon_docs(self.limits))
        app.add_api_route("/api/jobs", self.create_job, methods=["POST"], status_code=202,
                          **schema.jobs_docs(self.limits))
        app.add_api_route("/api/jobs/{job_id}", self.job_status, methods=["GET"], **schema.job_docs())
        app.add_api_route("/api/jobs/{job_id}", self.cancel_job, methods=["DELETE"], status_code=202,
                          summary="Cancel a job: it leaves the line, or stops at its next step")
        app.add_api_route("/api/jobs/{job_id}/files/{name}", self.job_file, methods=["GET"],
                          summary="One PNG of a finished job", response_class=FileResponse)
        app.mount("/static", StaticFiles(directory=STATIC), name="static")

    async def submit(self, request: Request) -> Job:
        """Read and check the form (into a new job folder), then take a place in line; on failure, no trace."""
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != "multipart/form-data":
            raise HTTPException(415, f"the body must be multipart/form-data (files and fields), not {kind or 'none'}")
        self.worker.check_room()
        job_id = uuid.uuid4().hex
        folder = self.jobs_root / job_id
        try:
            async with _form(request) as form:
                spec = await run_in_threadpool(build_spec, form, self.config, folder, self.limits,
                                               self.service.models)
            job = Job(spec, folder, id=job_id)
            self.worker.submit(job)
            return job
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def error(self, exc: BaseException) -> JSONResponse:
        return error_response(exc, self.roots)

    async def page(self) -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def favicon(self) -> FileResponse:
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    async def health(self) -> dict[str, Any]:
        note = await run_in_threadpool(self.checkpoints_note)
        return {"status": "ok", "version": __version__, **self.service.describe(),
                "models_loaded": self.service.loaded(), "queue": self.worker.status(),
                "checkpoints": {"released": note is None, "note": note}}

    def checkpoints_note(self) -> str | None:
        """Computed once (config files and weight headers only): the tree does not change under a server."""
        if self._note is ...:
            self._note = checkpoints_note(self.config)
        return self._note

    async def options(self) -> dict[str, Any]:
        return page_options(self.config, self.limits)

    async def tryon(self, request: Request) -> Response:
        job = await self.submit(request)
        loop, finished = asyncio.get_running_loop(), asyncio.Event()
        job.when_finished(lambda: loop.call_soon_threadsafe(finished.set))
        while not finished.is_set():
            if self.worker.stopping:  # the job is being cancelled; its client need not wait for that
                return self.error(ShuttingDown())
            if await request.is_disconnected():
                self.worker.cancel(job, Cancelled("cancelled: the client went away"))
                logger.info("the client of request %s went away: cancelled at its next step", job.id)
                return Response(status_code=CLIENT_GONE)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), POLL_S)
        if job.state != DONE:
            return self.error(job.error)
        return JSONResponse(await run_in_threadpool(result_json, job, None))

    async def create_job(self, request: Request) -> dict[str, Any]:
        job = await self.submit(request)
        return {"id": job.id, "state": job.state, "position": self.worker.position(job)}

    async def job_status(self, request: Request, job_id: str) -> JSONResponse:
        job = self._job(job_id)
        body: dict[str, Any] = {"id": job.id, "state": job.state, "position": self.worker.position(job),
                                "stage": job.stage, "done": job.done, "total": job.total}
        if job.state == DONE:
            body.update(result_json(job, str(request.base_url)))
        elif job.state in (FAILED, CANCELLED):
            body["status"], body["error"], _ = classify(job.error, self.roots)
            body["needs_mask"] = isinstance(job.error, NoPersonError)
        return JSONResponse(body)

    async def cancel_job(self, job_id: str) -> dict[str, Any]:
        """The job is gone for its client from now on (410); the worker stops it and forgets it as usual."""
        job = self._job(job_id, gone_ok=True)
        if job is None:  # deleted before: DELETE is idempotent
            return {"id": job_id, "state": CANCELLED}
        self.worker.cancel(job, Cancelled("cancelled by its client"))
        self.deleted[job.id] = None
        while len(self.deleted) > DELETED_KEPT:
            self.deleted.popitem(last=False)
        return {"id": job.id, "state": job.state}

    async def job_file(self, job_id: str, name: str) -> FileResponse:
        job = self._job(job_id)
        path = job.result.files.get(name) if job.state == DONE else None
        try:
            found = path.stat() if path is not None else None
        except OSError:  # removed with its job meanwhile
            found = None
        if found is None or not stat.S_ISREG(found.st_mode):
            raise HTTPException(404, f"no file {name!r} in job {job_id}")
        return ResultFile(path, media_type="image/png", stat_result=found)

    def _job(self, job_id: str, gone_ok: bool = False) -> Job | None:
        if job_id in self.deleted:
            if gone_ok:
                return None
            raise HTTPException(410, f"job {job_id} was cancelled by its client: it is gone, with its files")
        job = self.worker.get(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r} (finished jobs are kept for a while, then deleted)")
        return job


@contextlib.asynccontextmanager
async def _form(request: Request) -> AsyncIterator[Any]:
    """The request's form, at most the fields and files the form has (more: 422, as the document says);
    a body that is not well-formed multipart stays Starlette's 400."""
    try:
        async with request.form(max_files=len(FILES), max_fields=len(TEXT_FIELDS)) as form:
            yield form
    except HTTPException as exc:
        if exc.status_code == 400 and str(exc.detail).startswith("Too many"):
            raise FieldError(f"too many parts: the form has {len(FILES)} files and {len(TEXT_FIELDS)} other "
                             "fields") from None
        raise


class ResultFile(FileResponse):
    """A job's PNG, with Starlette's answers to a Range header it refuses (malformed: 400; outside the file: 416,
    with its Content-Range) as {"error": "one line"}, like every other failure (Starlette words them in plain
    text)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        refused: dict[str, Any] = {}

        async def answer(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                refused.update(message)  # its body says why
                return
            if not refused:
                await send(message)
                return
            status, headers = refused["status"], dict(refused.get("headers") or ())
            reason = message.get("body", b"").decode("utf-8", "replace").strip().rstrip(".")
            if status == 416:
                size = headers.get(b"content-range", b"").decode("latin-1").rpartition("/")[2]
                error = f"range not satisfiable: the file has {size} bytes"
                extra = {"Content-Range": f"bytes */{size}"}
            else:
                error, extra = f"bad Range header: {reason or 'malformed'}", {}
            await JSONResponse({"error": one_line(error)}, status_code=status, headers=extra)(scope, receive, send)

        await super().__call__(scope, receive, answer)


def create_app(config: RunConfig, workdir: Path, limits: Limits | None = None, auth: Auth | None = None,
               models: ModelSource | None = None, access: Access | None = None, engine: Any = None) -> FastAPI:
    """The app around one worker thread. `workdir`: this process's temporary folder (jobs live under it).
    `models` replaces loading from the config (tests hand in preloaded pipelines); `access`: the host names
    and origins allowed (default: a loopback server's); `engine`: another engine's `service` and `worker` (the
    Ray engine's, ray_engine.py) instead of this process's pipelines and device thread."""
    limits = limits or Limits()
    access = access or Access()
    if engine is None:
        service = TryOnService(config, models, one_model=limits.one_model)
        worker = Worker(service.run, limits.max_queue, limits.keep_jobs)
    else:
        service, worker = engine.service, engine.worker
    jobs_root = Path(workdir) / "jobs"
    jobs_root.mkdir(parents=True, exist_ok=True)

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # noqa: ANN202
        worker.start()
        try:
            yield
        finally:
            await run_in_threadpool(worker.stop)

    app = FastAPI(title="ootd", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Virtual try-on: a person photo and a garment photo in, that person wearing it out. "
                              "Every failure is {\"error\": \"one line\"}.")
    app.state.worker, app.state.service = worker, service
    api = Api(config, limits, service, worker, jobs_root)
    _add_error_handlers(app, api)
    api.register(app)
    contract.publish(app, config, limits, auth is not None)
    # the last added runs first: the access log sees every answer, the guards act before any body is read
    app.add_middleware(BodyLimit, limit=limits.max_upload_bytes)
    if auth is not None:
        app.add_middleware(RequireAuth, auth=auth)
    if access.origins:  # answers readable by the allowed sites' pages, and their preflight requests answered
        app.add_middleware(CORSMiddleware, allow_origins=["*"] if ANY in access.origins else sorted(access.origins),
                           allow_methods=["GET", "POST", "DELETE"], allow_headers=["authorization"],
                           allow_credentials=ANY not in access.origins)
    app.add_middleware(BrowserGuard, access=access)
    app.add_middleware(AccessLog)
    return app


def page_options(config: RunConfig, limits: Limits) -> dict[str, Any]:
    """What the page's controls offer and start from: the server's own defaults, never restated in the page."""
    model_types = {}
    for category in Category:
        try:
            model_types[category.value] = config.model_type_for(category).value
        except UsageError:
            model_types[category.value] = None
    sampling = config.sampling
    return {
        "categories": [*(c.value for c in Category), AUTO_CATEGORY], "model_types": model_types,
        "resolutions": list(SETTINGS["resolution"].choices), "schedulers": list(SETTINGS["scheduler"].choices),
        "fits": list(SETTINGS["fit"].choices),
        "defaults": {"samples": sampling.num_samples, "steps": sampling.steps, "scale": sampling.guidance_scale,
                     "resolution": str(sampling.resolution), "scheduler": str(sampling.scheduler),
                     "fit": str(config.fit)},
        "limits": {"steps": limits.max_steps, "samples": limits.max_samples},
        "max_upload_bytes": limits.max_upload_bytes,
    }


def _add_error_handlers(app: FastAPI, api: Api) -> None:
    """Every answer that is not a success is {"error": "one line"}; tracebacks go to the server log only."""

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of the path, not only the first route's
            headers["Allow"] = ", ".join(contract.allowed_methods(app, request))
        return JSONResponse({"error": one_line(exc.detail)}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse({"error": one_line(f"{where}: {first.get('msg', 'invalid')}")}, status_code=422)

    @app.exception_handler(ClientDisconnect)
    async def client_left(request: Request, _: ClientDisconnect) -> Response:
        client = request.client.host if request.client else "a client"
        logger.info("%s went away during %s %s; nothing was kept", client, request.method, request.url.path)
        return Response(status_code=CLIENT_GONE)

    async def known(_: Request, exc: Exception) -> JSONResponse:
        return api.error(exc)

    for kind in (OotdError, QueueFull, Cancelled):
        app.add_exception_handler(kind, known)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.error("unexpected error", exc_info=exc)
        return api.error(exc)

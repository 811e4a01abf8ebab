"""The FastAPI app: the page, the JSON API and the mapping of every failure to a status and one line.

    GET  /                        the page (static files of this package; nothing else on disk is served)
    GET  /api/health              device, precision, attention backend, loaded models, queue
    GET  /api/options             choices and defaults for the page's controls
    POST /api/tryon               multipart try-on, answered when done: images as data: URLs
    POST /api/jobs                the same request, answered at once with a job id (the page uses this)
    GET  /api/jobs/{id}           place in line, stage and step, then the result (file URLs) or the error
    GET  /api/jobs/{id}/files/{name}   one of that job's PNGs

Statuses: 400 unusable image or impossible combination, 413 too large, 422 bad field, 503 busy (Retry-After),
out of memory or models that cannot load; 500 only for a fault of the server itself, also as one line.
"""

from __future__ import annotations

import base64
import logging
import shutil
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ootd import __version__
from ootd.app.console import one_line
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.loader import ModelSource
from ootd.errors import CheckpointError, DeviceError, InputImageError, NoPersonError, OotdError, UsageError
from ootd.serve.forms import FILES, TEXT_FIELDS, BadRequest, FieldError, build_spec
from ootd.serve.limits import Auth, BodyLimit, Limits, RequireAuth
from ootd.serve.service import Finished, TryOnService
from ootd.serve.worker import DONE, FAILED, Job, QueueFull, ShuttingDown, Worker
from ootd.settings import RESOLUTIONS, Category, FitMode, SchedulerName

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
OOM_HINT = "try resolution 384x512 or fewer samples"


def classify(exc: BaseException) -> tuple[int, str, dict[str, str]]:
    """An exception -> (HTTP status, one-line message, extra headers)."""
    if isinstance(exc, QueueFull):
        return 503, one_line(exc), {"Retry-After": str(exc.retry_after)}
    if isinstance(exc, FieldError):
        return 422, one_line(exc), {}
    if isinstance(exc, BadRequest | InputImageError | NoPersonError | UsageError):
        return 400, one_line(exc), {}
    if isinstance(exc, ShuttingDown):
        return 503, one_line(exc), {"Retry-After": "5"}
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower():
        return 503, f"out of memory: {one_line(exc)[:200]}; {OOM_HINT}", {}
    if isinstance(exc, CheckpointError | DeviceError):
        return 503, f"the server cannot run this model: {one_line(exc)}", {}
    if isinstance(exc, OotdError):
        return 500, one_line(exc), {}
    return 500, f"internal error: {type(exc).__name__}: {one_line(exc)[:300]} (details in the server log)", {}


def error_response(exc: BaseException) -> JSONResponse:
    status, message, headers = classify(exc)
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _data_url(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def result_json(job: Job, inline: bool) -> dict[str, Any]:
    """A finished job's answer; images as data: URLs (`inline`) or as URLs of this server."""
    done: Finished = job.result

    def ref(name: str) -> str:
        return _data_url(done.files[name]) if inline else f"api/jobs/{job.id}/files/{name}"

    seconds = job.seconds()
    timings = {**done.timings, **seconds, "total": seconds["queue"] + seconds["run"]}
    settings = {**done.settings, "fit": str(job.spec.config.fit),
                "mask": "uploaded" if job.spec.request.mask is not None else "auto"}
    return {
        "images": [ref(name) for name in done.names], "names": done.names, "seed": done.seed,
        "mask": ref(done.mask), "masked_person": ref(done.masked_person), "person_mask": ref(done.person_mask),
        "model_type": done.model_type, "timings": timings, "settings": settings,
    }


class Api:
    """The routes, over one server's config, service (the pipelines) and worker (the device's queue)."""

    def __init__(self, config: RunConfig, limits: Limits, service: TryOnService, worker: Worker,
                 jobs_root: Path) -> None:
        self.config, self.limits, self.service, self.worker, self.jobs_root = config, limits, service, worker, jobs_root

    def register(self, app: FastAPI) -> None:
        app.add_api_route("/", self.page, methods=["GET"], include_in_schema=False)
        app.add_api_route("/api/health", self.health, methods=["GET"])
        app.add_api_route("/api/options", self.options, methods=["GET"])
        app.add_api_route("/api/tryon", self.tryon, methods=["POST"])
        app.add_api_route("/api/jobs", self.create_job, methods=["POST"], status_code=202)
        app.add_api_route("/api/jobs/{job_id}", self.job_status, methods=["GET"])
        app.add_api_route("/api/jobs/{job_id}/files/{name}", self.job_file, methods=["GET"])
        app.mount("/static", StaticFiles(directory=STATIC), name="static")

    async def submit(self, request: Request) -> Job:
        """Read and check the form (into a new job folder), then take a place in line; on failure, no trace."""
        self.worker.check_room()
        job_id = uuid.uuid4().hex
        folder = self.jobs_root / job_id
        try:
            async with request.form(max_files=len(FILES), max_fields=len(TEXT_FIELDS)) as form:
                spec = await run_in_threadpool(build_spec, form, self.config, folder)
            job = Job(spec, folder, id=job_id)
            self.worker.submit(job)
            return job
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    async def page(self) -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def health(self) -> dict[str, Any]:
        return {"status": "ok", "version": __version__, **self.service.describe(),
                "models_loaded": self.service.loaded(), "queue": self.worker.status()}

    async def options(self) -> dict[str, Any]:
        return page_options(self.config, self.limits)

    async def tryon(self, request: Request) -> JSONResponse:
        job = await self.submit(request)
        await run_in_threadpool(job.wait)
        if job.state == FAILED:
            return error_response(job.error)
        return JSONResponse(await run_in_threadpool(result_json, job, True))

    async def create_job(self, request: Request) -> dict[str, Any]:
        job = await self.submit(request)
        return {"id": job.id, "state": job.state, "position": self.worker.position(job)}

    async def job_status(self, job_id: str) -> JSONResponse:
        job = self._job(job_id)
        body: dict[str, Any] = {"id": job.id, "state": job.state, "position": self.worker.position(job),
                                "stage": job.stage, "done": job.done, "total": job.total}
        if job.state == DONE:
            body.update(result_json(job, inline=False))
        elif job.state == FAILED:
            body["status"], body["error"], _ = classify(job.error)
        return JSONResponse(body)

    async def job_file(self, job_id: str, name: str) -> FileResponse:
        job = self._job(job_id)
        path = job.result.files.get(name) if job.state == DONE else None
        if path is None or not path.is_file():
            raise HTTPException(404, f"no file {name!r} in job {job_id}")
        return FileResponse(path, media_type="image/png")

    def _job(self, job_id: str) -> Job:
        job = self.worker.get(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r} (finished jobs are kept for a while, then deleted)")
        return job


def create_app(config: RunConfig, workdir: Path, limits: Limits | None = None, auth: Auth | None = None,
               models: ModelSource | None = None) -> FastAPI:
    """The app around one worker thread. `workdir`: this process's temporary folder (jobs live under it).
    `models` replaces loading from the config (tests hand in preloaded pipelines)."""
    limits = limits or Limits()
    service = TryOnService(config, models, one_model=limits.one_model)
    worker = Worker(service.run, limits.max_queue, limits.keep_jobs)
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
                  openapi_url=None)
    app.state.worker, app.state.service = worker, service
    _add_error_handlers(app)
    Api(config, limits, service, worker, jobs_root).register(app)
    app.add_middleware(BodyLimit, limit=limits.max_upload_bytes)
    if auth is not None:
        app.add_middleware(RequireAuth, auth=auth)  # added last: runs first, before any body is read
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
        "categories": [c.value for c in Category], "model_types": model_types,
        "resolutions": list(RESOLUTIONS), "schedulers": list(SchedulerName.words()), "fits": list(FitMode.words()),
        "defaults": {"samples": sampling.num_samples, "steps": sampling.steps, "scale": sampling.guidance_scale,
                     "resolution": str(sampling.resolution), "scheduler": str(sampling.scheduler),
                     "fit": str(config.fit)},
        "max_upload_bytes": limits.max_upload_bytes,
    }


def _add_error_handlers(app: FastAPI) -> None:
    """Every answer that is not a success is {"error": "one line"}; tracebacks go to the server log only."""

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": one_line(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse({"error": one_line(f"{where}: {first.get('msg', 'invalid')}")}, status_code=422)

    @app.exception_handler(OotdError)
    async def ootd_error(_: Request, exc: OotdError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(QueueFull)
    async def busy(_: Request, exc: QueueFull) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(ShuttingDown)
    async def stopping(_: Request, exc: ShuttingDown) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.error("unexpected error", exc_info=exc)
        return error_response(exc)

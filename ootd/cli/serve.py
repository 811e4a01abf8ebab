"""`ootd serve`: the try-on page and HTTP API (the work is in ootd/serve; this only turns options into calls).

The sampling options set the page's starting values and the API's defaults; hardware options as for `ootd run`.
`--engine ray` runs the try-ons on Ray Serve replicas (ootd/serve/ray_engine.py) behind the same page and API.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ootd.cli.errors import guarded_command
from ootd.cli.options import LOGGING_OPTIONS, Shared, choices, options_of, with_options
from ootd.cli.options import SERVE as SERVE_COMMAND
from ootd.errors import UsageError
from ootd.serve.limits import Limits
from ootd.serve.ray_engine import RayOptions
from ootd.serve.server import DEFAULT_HOST, DEFAULT_PORT
from ootd.settings import EngineName

if TYPE_CHECKING:
    from ootd.app.tryon.config import RunConfig

RAY_DEFAULTS = RayOptions()

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd serve   (then open http://127.0.0.1:7860/)\n\n"
    "  ootd serve --host 0.0.0.0 --auth ann:s3cret --allow-host tryon.example --device cuda:1\n\n"
    "  ootd serve --engine ray --address auto --replicas 4   (one replica per GPU of a Ray cluster)\n\n"
    "  curl -F person=@person.jpg -F garment=@shirt.jpg -F category=upper http://127.0.0.1:7860/api/tryon"
)
SERVE = "Server"
ENGINE = "Engine"
SERVE_OPTIONS = options_of(SERVE_COMMAND)  # not the seed (each request's own) nor what a server has no use for (output)
NEEDS = ("fastapi", "uvicorn", "python_multipart")  # the `serve` extra
RAY_NEEDS = ("ray", "ray.serve", "aiohttp")  # the `ray-serve` extra


def check_extra(engine: EngineName = EngineName.LOCAL) -> None:
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"ootd serve needs the serve extra ({', '.join(missing)} missing): "
                         "pip install 'ootd[serve]' (in a checkout: pip install -e '.[serve]')")
    if engine is EngineName.RAY and not all(_installed(name) for name in RAY_NEEDS):
        raise UsageError("ootd serve --engine ray needs Ray Serve: pip install 'ootd[ray-serve]' "
                         "(in a checkout: pip install -e '.[ray-serve]')")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package missing
        return False


def _serve_opt(*names: str, panel: str = SERVE, **kwargs: Any) -> Any:
    return typer.Option(*names, rich_help_panel=panel, **kwargs)


HostOpt = Annotated[str, _serve_opt("--host", help="Address to listen on; anything but loopback needs --auth.")]
PortOpt = Annotated[int, _serve_opt("--port", help="Port (0: any free one).")]
AuthOpt = Annotated[str | None, _serve_opt(
    "--auth", metavar="USER:PASSWORD|TOKEN", envvar="OOTD_SERVE_AUTH", show_default=False,
    help="Require HTTP Basic USER:PASSWORD, or a bearer TOKEN (also accepted as the Basic password). Also from "
         "$OOTD_SERVE_AUTH.")]
NoAuthOpt = Annotated[bool, _serve_opt(
    "--insecure-no-auth", help="Allow a non-loopback --host without --auth (only behind something that "
                               "authenticates).")]
MaxUploadOpt = Annotated[str, _serve_opt("--max-upload", help="Largest request body (all files together), e.g. "
                                                              "20MiB.")]
MaxQueueOpt = Annotated[int, _serve_opt("--max-queue", help="Requests that may wait behind the running one; more "
                                                            "get 503 with Retry-After.")]
OneModelOpt = Annotated[bool, _serve_opt("--one-model", help="Hold one model type at a time: less memory, but "
                                                             "switching between hd and dc garments reloads.")]
MaxStepsOpt = Annotated[int, _serve_opt("--max-steps", metavar="N", help="Most denoising steps one request may "
                                                                         "ask for (more: 422).")]
MaxSamplesOpt = Annotated[int, _serve_opt("--max-samples", metavar="N", help="Most pictures one request may ask "
                                                                             "for (more: 422).")]
AllowHostOpt = Annotated[list[str] | None, _serve_opt(
    "--allow-host", metavar="NAME", show_default=False,
    help="Also answer requests for this host name (repeatable; * for any): the server's name behind a proxy or on "
         "a network. Others get 421, against DNS rebinding.")]
AllowOriginOpt = Annotated[list[str] | None, _serve_opt(
    "--allow-origin", metavar="ORIGIN", show_default=False,
    help="Let pages of this site (https://shop.example; repeatable; * for any) send jobs and read answers. "
         "Requests that change things from other sites' pages get 403.")]
EngineOpt = Annotated[str, _serve_opt(
    "--engine", metavar=choices(EngineName), panel=ENGINE,
    help="Where the try-ons run: this process's device, or Ray Serve replicas (the ray-serve extra), behind the "
         "same page and API.")]
AddressOpt = Annotated[str | None, _serve_opt(
    "--address", metavar="auto|HOST:PORT", panel=ENGINE, show_default=False,
    help="--engine ray: join this Ray cluster (default: start one on this machine).")]
ReplicasOpt = Annotated[int | None, _serve_opt(
    "--replicas", panel=ENGINE, show_default=False,
    help=f"--engine ray: replicas, each holding one pipeline on one device (default: {RAY_DEFAULTS.replicas}).")]
GpusOpt = Annotated[float | None, _serve_opt(
    "--gpus-per-replica", panel=ENGINE, show_default=False,
    help="--engine ray: GPUs per replica (default: 1 if the cluster has GPUs, else 0).")]
QueuedOpt = Annotated[int | None, _serve_opt(
    "--max-queued-per-replica", panel=ENGINE, metavar="K", show_default=False,
    help=f"--engine ray: requests that may wait per replica; more get 503 with Retry-After (default: "
         f"{RAY_DEFAULTS.max_queued_per_replica}; --max-queue is the local engine's).")]


@guarded_command
@with_options(SERVE_OPTIONS, LOGGING_OPTIONS)
def serve_command(
    host: HostOpt = DEFAULT_HOST,
    port: PortOpt = DEFAULT_PORT,
    auth: AuthOpt = None,
    insecure_no_auth: NoAuthOpt = False,
    max_upload: MaxUploadOpt = f"{Limits.max_upload_bytes // 2**20}MiB",
    max_queue: MaxQueueOpt = Limits.max_queue,
    one_model: OneModelOpt = Limits.one_model,
    max_steps: MaxStepsOpt = Limits.max_steps,
    max_samples: MaxSamplesOpt = Limits.max_samples,
    allow_host: AllowHostOpt = None,
    allow_origin: AllowOriginOpt = None,
    engine: EngineOpt = EngineName.LOCAL.value,
    address: AddressOpt = None,
    replicas: ReplicasOpt = None,
    gpus_per_replica: GpusOpt = None,
    max_queued_per_replica: QueuedOpt = None,
    *,
    shared: Shared,
) -> None:
    """Serve the try-on page and the HTTP API; models load on first use and stay loaded."""
    engine_name = EngineName.parse(engine, "engine")
    check_extra(engine_name)
    from ootd.app.tryon.config import parse_size
    from ootd.serve.limits import Auth
    from ootd.serve.origins import Access
    from ootd.serve.server import serve

    ray_given = {"address": address, "replicas": replicas, "gpus_per_replica": gpus_per_replica,
                 "max_queued_per_replica": max_queued_per_replica}
    ray_given = {name: value for name, value in ray_given.items() if value is not None}
    if engine_name is EngineName.LOCAL and ray_given:
        raise UsageError("--address, --replicas, --gpus-per-replica and --max-queued-per-replica need --engine ray")
    config = shared.config(check=False)  # no seed: each request draws its own, unless it gives one
    limits = Limits(max_upload_bytes=parse_size(max_upload), max_queue=max_queue, one_model=one_model,
                    max_steps=max_steps, max_samples=max_samples)
    access = Access.for_address(host, allow_host or (), allow_origin or ())
    run_engine = _ray_engine(config, ray_given, limits) if engine_name is EngineName.RAY else None
    serve(config, host, port, limits, Auth.parse(auth) if auth is not None else None, insecure_no_auth,
          access=access, access_log=not shared.quiet, announce=typer.echo, engine=run_engine)


def _ray_engine(config: RunConfig, given: dict[str, Any], limits: Limits) -> Callable[..., Any]:
    """The Ray Serve engine of these options (checked), to start with the server."""
    from ootd.serve.ray_engine import ray_engine

    ray_options = replace(RAY_DEFAULTS, **given)
    ray_options.validate()
    return partial(ray_engine, config, ray_options, one_model=limits.one_model, keep=limits.keep_jobs)

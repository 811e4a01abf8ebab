"""`ootd serve`: the try-on page and HTTP API (the work is in ootd/serve; this only turns options into calls).

The sampling options set the page's starting values and the API's defaults; hardware options as for `ootd run`.
`--engine ray` runs the try-ons on Ray Serve replicas (ootd/serve/ray_engine.py) behind the same page and API.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Annotated, Any

import typer

from ootd.cli.errors import guarded_command
from ootd.cli.options import LOGGING_OPTIONS, RUN_OPTIONS, choices, config_from, with_options
from ootd.errors import UsageError
from ootd.serve.limits import Limits
from ootd.serve.ray_engine import RayOptions
from ootd.serve.server import DEFAULT_HOST, DEFAULT_PORT
from ootd.settings import EngineName

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
PER_RUN = ("output", "save_intermediates", "overwrite", "seed")  # per request (seed) or meaningless for a server
SERVE_OPTIONS = {name: option for name, option in RUN_OPTIONS.items() if name not in PER_RUN}
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


@with_options(SERVE_OPTIONS, LOGGING_OPTIONS)
@guarded_command
def serve_command(
    host: Annotated[str, typer.Option("--host", help="Address to listen on; anything but loopback needs --auth.",
                                      rich_help_panel=SERVE)] = DEFAULT_HOST,
    port: Annotated[int, typer.Option("--port", help="Port (0: any free one).", rich_help_panel=SERVE)] = DEFAULT_PORT,
    auth: Annotated[str | None, typer.Option(
        "--auth", metavar="USER:PASSWORD|TOKEN", envvar="OOTD_SERVE_AUTH", rich_help_panel=SERVE,
        show_default=False, help="Require HTTP Basic USER:PASSWORD, or a bearer TOKEN (also accepted as the Basic "
                                 "password). Also from $OOTD_SERVE_AUTH.")] = None,
    insecure_no_auth: Annotated[bool, typer.Option(
        "--insecure-no-auth", rich_help_panel=SERVE,
        help="Allow a non-loopback --host without --auth (only behind something that authenticates).")] = False,
    max_upload: Annotated[str, typer.Option(
        "--max-upload", rich_help_panel=SERVE, help="Largest request body (all files together), e.g. 20MiB.",
    )] = f"{Limits.max_upload_bytes // 2**20}MiB",
    max_queue: Annotated[int, typer.Option(
        "--max-queue", rich_help_panel=SERVE,
        help="Requests that may wait behind the running one; more get 503 with Retry-After.")] = Limits.max_queue,
    one_model: Annotated[bool, typer.Option(
        "--one-model", rich_help_panel=SERVE,
        help="Hold one model type at a time: less memory, but switching between hd and dc garments reloads.",
    )] = Limits.one_model,
    max_steps: Annotated[int, typer.Option(
        "--max-steps", rich_help_panel=SERVE, metavar="N",
        help="Most denoising steps one request may ask for (more: 422).")] = Limits.max_steps,
    max_samples: Annotated[int, typer.Option(
        "--max-samples", rich_help_panel=SERVE, metavar="N",
        help="Most pictures one request may ask for (more: 422).")] = Limits.max_samples,
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", rich_help_panel=SERVE, metavar="NAME", show_default=False,
        help="Also answer requests for this host name (repeatable; * for any): the server's name behind a proxy "
             "or on a network. Others get 421, against DNS rebinding.")] = None,
    allow_origin: Annotated[list[str] | None, typer.Option(
        "--allow-origin", rich_help_panel=SERVE, metavar="ORIGIN", show_default=False,
        help="Let pages of this site (https://shop.example; repeatable; * for any) send jobs and read answers. "
             "Requests that change things from other sites' pages get 403.")] = None,
    engine: Annotated[str, typer.Option(
        "--engine", metavar=choices(EngineName), rich_help_panel=ENGINE,
        help="Where the try-ons run: this process's device, or Ray Serve replicas (the ray-serve extra), behind "
             "the same page and API.")] = EngineName.LOCAL.value,
    address: Annotated[str | None, typer.Option(
        "--address", metavar="auto|HOST:PORT", rich_help_panel=ENGINE, show_default=False,
        help="--engine ray: join this Ray cluster (default: start one on this machine).")] = None,
    replicas: Annotated[int | None, typer.Option(
        "--replicas", rich_help_panel=ENGINE, show_default=False,
        help=f"--engine ray: replicas, each holding one pipeline on one device (default: "
             f"{RAY_DEFAULTS.replicas}).")] = None,
    gpus_per_replica: Annotated[float | None, typer.Option(
        "--gpus-per-replica", rich_help_panel=ENGINE, show_default=False,
        help="--engine ray: GPUs per replica (default: 1 if the cluster has GPUs, else 0).")] = None,
    max_queued_per_replica: Annotated[int | None, typer.Option(
        "--max-queued-per-replica", rich_help_panel=ENGINE, metavar="K", show_default=False,
        help=f"--engine ray: requests that may wait per replica; more get 503 with Retry-After (default: "
             f"{RAY_DEFAULTS.max_queued_per_replica}; --max-queue is the local engine's).")] = None,
    **options: Any,
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
    config = config_from({**options, "seed": None})
    limits = Limits(max_upload_bytes=parse_size(max_upload), max_queue=max_queue, one_model=one_model,
                    max_steps=max_steps, max_samples=max_samples)
    access = Access.for_address(host, allow_host or (), allow_origin or ())
    run_engine = None
    if engine_name is EngineName.RAY:
        from functools import partial

        from ootd.serve.ray_engine import ray_engine

        ray_options = replace(RAY_DEFAULTS, **ray_given)
        ray_options.validate()
        run_engine = partial(ray_engine, config, ray_options, one_model=one_model, keep=limits.keep_jobs)
    serve(config, host, port, limits, Auth.parse(auth) if auth is not None else None, insecure_no_auth,
          access=access, access_log=not options.get("quiet"), announce=typer.echo, engine=run_engine)

"""For front ends on a terminal (`ootd`, `run/run_ootd.py`): every failure as one stderr line and an exit code,
and logging levels per -v/-q.

Exit codes: 0 success, 1 failure, 2 usage error (the typed errors in ootd/errors.py carry them), 130
interrupted, 143 terminated (SIGTERM is handled like Ctrl-C: ootd/app/signals.py). The library writes outputs
atomically, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import logging
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ootd.errors import OotdError

EXIT_INTERRUPTED = 130
# Libraries whose chatter stays quiet unless ootd itself logs at DEBUG.
LIBRARY_LOGGERS = ("diffusers", "transformers", "huggingface_hub", "onnxruntime", "PIL", "urllib3", "httpx")


def one_line(value: object) -> str:
    return " ".join(str(value).split())


def echo_err(message: str) -> None:
    print(message, file=sys.stderr)


def _is_out_of_memory(exc: BaseException) -> bool:
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def run_guarded(fn: Callable[[], int | None], *, debug: bool = False,
                passthrough: tuple[type[BaseException], ...] = ()) -> int:
    """Run `fn` and turn every way it can fail into one stderr line and an exit code (`fn`'s own int, else 0).

    OotdError: its message and its exit code (2 usage, 1 otherwise). KeyboardInterrupt: 130; SIGTERM: 143. A
    full device: "no space left on device (PATH)" and 1. Anything else: "internal error" and 1. `passthrough`
    exceptions are re-raised (a front end's own control flow).
    """
    from ootd.app.signals import as_no_space, flush_stdout, sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():
            code = fn()
            flush_stdout()  # a full stdout device is this command's failure, not one at interpreter exit
    except passthrough:
        raise
    except OSError as exc:  # a full device is one line wherever it hits (stdout, a library's own write)
        full = as_no_space(exc)
        if full is None:
            return _internal(exc, debug)
        if debug:
            traceback.print_exc()
        echo_err(f"error: {full}")
        return full.exit_code
    except OotdError as exc:
        if debug:
            traceback.print_exc()
        echo_err(f"error: {one_line(exc)}")
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated: 143)
        if debug:
            traceback.print_exc()
        echo_err(getattr(exc, "message", "interrupted"))
        return getattr(exc, "exit_code", EXIT_INTERRUPTED)
    except Exception as exc:
        return _internal(exc, debug)
    return code if isinstance(code, int) else 0


def _internal(exc: Exception, debug: bool) -> int:
    """A failure nobody foresaw: one line (and the traceback with --debug)."""
    if debug:
        traceback.print_exc()
    hint = "" if debug else " (rerun with --debug for the traceback)"
    if _is_out_of_memory(exc):
        echo_err(f"error: out of memory ({one_line(exc)[:200]}); try --resolution 384x512, fewer --samples, "
                 f"--precision fp16 or --attention chunked{hint}")
        return 1
    echo_err(f"internal error: {type(exc).__name__}: {one_line(exc)}{hint}")
    return 1


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (the test runner swaps it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))

    @property
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # noqa: ANN001
        pass

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace(record.levelname, record.levelname.lower(), 1)


@contextmanager
def console_logging(verbose: bool, quiet: bool) -> Iterator[None]:
    """-v: the ootd logger at DEBUG and library chatter at WARNING; default: ootd warnings only; -q: errors.

    Levels and handlers are restored afterwards (commands also run in-process, e.g. under tests).
    """
    ootd_logger = logging.getLogger("ootd")
    saved = {name: logging.getLogger(name).level for name in ("ootd", *LIBRARY_LOGGERS)}
    saved_propagate = ootd_logger.propagate
    handler = _StderrHandler()
    ootd_logger.addHandler(handler)
    ootd_logger.propagate = False
    ootd_logger.setLevel(logging.DEBUG if verbose else logging.ERROR if quiet else logging.WARNING)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING if verbose else logging.ERROR)
    try:
        with warnings.catch_warnings():
            if not verbose:
                warnings.simplefilter("ignore")
            yield
    finally:
        ootd_logger.removeHandler(handler)
        ootd_logger.propagate = saved_propagate
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)

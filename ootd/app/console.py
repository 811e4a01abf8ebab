"""For front ends on a terminal (`ootd`, `run/run_ootd.py`): every failure as one stderr line and an exit code,
and logging levels per -v/-q.

Exit codes: 0 success, 1 failure, 2 usage error, 3 a setting this machine cannot run (the typed errors in
ootd/errors.py carry them), 130 interrupted, 143 terminated (SIGTERM is handled like Ctrl-C: ootd/app/signals.py).
The library writes outputs atomically, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import logging
import sys
import traceback
import warnings
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

from ootd import IMPORT_NOISE
from ootd.errors import Namer, OotdError, UnsupportedError, escaped, fill, library_name, worded

EXIT_INTERRUPTED = 130
# Libraries whose chatter stays quiet unless ootd itself logs at DEBUG.
LIBRARY_LOGGERS = ("diffusers", "transformers", "huggingface_hub", "onnxruntime", "PIL", "urllib3", "httpx",
                   "torchao", "torch.utils._pytree")  # the last two: importing torchao (the quant extra; its
# known import-time messages are dropped by ootd.IMPORT_NOISE wherever ootd is used, unless --debug)


_library_level = {"level": logging.ERROR}  # what console_logging chose; reapplied after libraries are imported


def quiet_libraries(importing: bool = False) -> None:
    """Library loggers at the chosen level, and their progress bars off unless --debug: importing transformers
    or diffusers resets their levels, and their load reports (tables with ANSI codes) are not for users.
    `importing`: import them first (a caller about to load models), so the levels set here stay."""
    if importing:
        import importlib

        for module in ("transformers.utils.logging", "diffusers.utils.logging"):
            try:
                importlib.import_module(module)
            except ImportError:  # pragma: no cover - both are dependencies
                pass
    level = _library_level["level"]
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    if level > logging.INFO:
        for module in ("transformers.utils.logging", "diffusers.utils.logging"):
            utils = sys.modules.get(module)
            if utils is not None and hasattr(utils, "disable_progress_bar"):
                utils.disable_progress_bar()


def one_line(value: object) -> str:
    """A message as one line: its whitespace (line breaks too) as single spaces, and what is left that a
    terminal would act on (ESC, other control characters, bidirectional overrides) escaped."""
    return escaped(" ".join(str(value).split()))


def echo_err(message: str) -> None:
    print(message, file=sys.stderr)


def _is_out_of_memory(exc: BaseException) -> bool:
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def run_guarded(fn: Callable[[], int | None], *, debug: bool = False,
                passthrough: tuple[type[BaseException], ...] = (), options: Collection[str] | None = None,
                name: Namer = library_name) -> int:
    """Run `fn` and turn every way it can fail into one stderr line and an exit code (`fn`'s own int, else 0).

    OotdError: its message, each setting it names worded by `name` (the front end's word for it: a flag), and its
    exit code (2 usage, 3 unsupported here, 1 otherwise). KeyboardInterrupt: 130;
    SIGTERM: 143. A full device: "no space left on device (PATH)" and 1. Anything else: "internal error" and 1.
    `passthrough` exceptions are re-raised (a front end's own control flow). `options`: the flags of the command
    running, so that a hint (out of memory) names only options it has.
    """
    from ootd.app.signals import as_no_space, as_terminated, flush_stdout, sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():
            code = fn()
            flush_stdout()  # a full stdout device is this command's failure, not one at interpreter exit
    except passthrough:
        raise
    except OSError as exc:  # a full device is one line wherever it hits (stdout, a library's own write)
        full = as_no_space(exc)
        if full is None:
            return _internal(exc, debug, options, name)
        if debug:
            traceback.print_exc()
        echo_err(f"error: {full}")
        return full.exit_code
    except OotdError as exc:
        if debug:
            traceback.print_exc()
        echo_err(f"error: {one_line(worded(exc, name))}")
        return exc.exit_code
    except KeyboardInterrupt as caught:  # Ctrl-C, or SIGTERM (Terminated: 143)
        if debug:
            traceback.print_exc()
        exc = as_terminated(caught)
        echo_err(getattr(exc, "message", "interrupted"))
        return getattr(exc, "exit_code", EXIT_INTERRUPTED)
    except Exception as exc:
        return _internal(exc, debug, options, name)
    return code if isinstance(code, int) else 0


# what helps a run out of memory, each with the setting it needs: a command is offered those it has
OOM_HINTS = (("resolution", "{@resolution} 384x512"), ("samples", "fewer {@samples}"),
             ("precision", "{@precision} fp16"), ("attention", "{@attention} chunked"),
             ("batch_size", "a smaller {@batch_size}"))


def oom_hint(options: Collection[str] | None, name: Namer = library_name) -> str:
    """'; try A, B or C' with the remedies whose setting the command has (all of them when that is not known),
    each setting worded by `name` (a front end's: its flags, which `options` lists)."""
    hints = [fill(words, name) for setting, words in OOM_HINTS
             if options is None or name(setting) in options]
    if not hints:
        return ""
    return "; try " + (hints[0] if len(hints) == 1 else f"{', '.join(hints[:-1])} or {hints[-1]}")


def _internal(exc: Exception, debug: bool, options: Collection[str] | None = None,
              name: Namer = library_name) -> int:
    """A failure nobody foresaw: one line (and the traceback with --debug)."""
    if debug:
        traceback.print_exc()
    hint = "" if debug else " (rerun with --debug for the traceback)"
    if _is_out_of_memory(exc):
        echo_err(f"error: out of memory ({one_line(exc)[:200]}){oom_hint(options, name)}{hint}")
        return 1
    from ootd.hardware.torch_builds import torchvision_problem

    broken = torchvision_problem()  # what transformers's own import errors hide, wherever a model was loaded
    if broken is not None:
        echo_err(f"error: {broken}")
        return UnsupportedError.exit_code
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

    def filter(self, record: logging.LogRecord) -> bool:
        """Each distinct warning once per command (a memory plan made twice warns twice)."""
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.getMessage())
        seen = self.__dict__.setdefault("_seen", set())
        if key in seen:
            return False
        seen.add(key)
        return True

    def format(self, record: logging.LogRecord) -> str:
        """`level: message`, the message one line as errors are (a traceback, with -v, follows on its own)."""
        shown = logging.makeLogRecord({**record.__dict__, "msg": escaped(record.getMessage()), "args": None})
        return super().format(shown).replace(record.levelname, record.levelname.lower(), 1)


@contextmanager
def console_logging(verbose: bool, quiet: bool, debug: bool = False) -> Iterator[None]:
    """-v: the ootd logger at DEBUG, library chatter at ERROR as by default; --debug: libraries at INFO too
    (load reports); default: ootd warnings only; -q: errors.

    Levels and handlers are restored afterwards (commands also run in-process, e.g. under tests).
    """
    ootd_logger = logging.getLogger("ootd")
    saved = {name: logging.getLogger(name).level for name in ("ootd", *LIBRARY_LOGGERS)}
    saved_propagate = ootd_logger.propagate
    handler = _StderrHandler()
    ootd_logger.addHandler(handler)
    ootd_logger.propagate = False
    ootd_logger.setLevel(logging.DEBUG if verbose else logging.ERROR if quiet else logging.WARNING)
    saved_library_level = _library_level["level"]
    _library_level["level"] = logging.INFO if debug else logging.ERROR
    saved_noise = IMPORT_NOISE.show
    IMPORT_NOISE.show = debug  # torchao's import-time chatter: only with --debug
    quiet_libraries()
    try:
        with warnings.catch_warnings():
            if not verbose:
                warnings.simplefilter("ignore")
            yield
    finally:
        ootd_logger.removeHandler(handler)
        ootd_logger.propagate = saved_propagate
        _library_level["level"] = saved_library_level
        IMPORT_NOISE.show = saved_noise
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)

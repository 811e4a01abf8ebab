"""SIGTERM as an interrupt that keeps its exit code, even where a library re-raises it as a plain one."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from ootd.app.signals import Terminated, as_terminated, sigterm_as_interrupt, sigterm_kept


def test_a_sigterm_re_raised_as_a_plain_interrupt_is_still_terminated() -> None:
    with pytest.raises(Terminated), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
    assert isinstance(as_terminated(KeyboardInterrupt()), Terminated)  # what Ray's ray.wait raises instead


def test_ctrl_c_stays_ctrl_c_in_the_next_command() -> None:
    with pytest.raises(Terminated), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
    with sigterm_as_interrupt():  # a new command: what happened before is forgotten
        plain = KeyboardInterrupt()
        assert as_terminated(plain) is plain


def test_a_library_replacing_the_handler_does_not_keep_it() -> None:
    with sigterm_as_interrupt():
        ours = signal.getsignal(signal.SIGTERM)
        with sigterm_kept():
            signal.signal(signal.SIGTERM, lambda *_: None)  # as ray.init does
        assert signal.getsignal(signal.SIGTERM) is ours


def test_a_sigterm_caught_by_a_library_handler_that_exits_is_still_terminated() -> None:
    """Ray's handler, installed by ray.init, exits with 15 at once; under ours it is `Terminated` (exit 143)."""
    with pytest.raises(Terminated), sigterm_as_interrupt(), sigterm_kept():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # as ray.init does
        os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(SystemExit), sigterm_kept():  # without ours: the library's exit stays its own
        raise SystemExit(signal.SIGTERM)
    with pytest.raises(SystemExit), sigterm_as_interrupt(), sigterm_kept():  # another exit code: not a signal
        raise SystemExit(2)

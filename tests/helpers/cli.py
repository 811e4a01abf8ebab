"""`ootd ...` run in this process (CliRunner), and the checks every bad-input test makes of its error."""

from __future__ import annotations

import contextvars
import threading
from typing import Any

from typer.testing import CliRunner

from ootd import cli

HANG_LIMIT_S = 120.0  # an `ootd` command that has not returned by then is a hang


def invoke(*args: object, env: dict[str, str] | None = None) -> Any:
    """`ootd ARGS...` in this process; the models come from an enclosing `use_models`, if any."""
    return CliRunner().invoke(cli.app, [str(a) for a in args], env=env)


def invoke_bounded(*args: object, env: dict[str, str] | None = None, limit: float = HANG_LIMIT_S) -> Any:
    """`invoke` in a thread (with this context, so `use_models` still applies): a hang fails the test after
    `limit` seconds instead of stalling the suite."""
    box: dict[str, Any] = {}
    context = contextvars.copy_context()
    thread = threading.Thread(target=lambda: box.update(r=context.run(invoke, *args, env=env)), daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"ootd {' '.join(str(a) for a in args[:1])} hung for {limit} s"
    return box["r"]


def assert_one_line_error(result: Any, code: int, *fragments: str) -> str:
    """The command failed with `code` and said why in one `error: ...` line holding every fragment, with no
    traceback; returns the line."""
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]

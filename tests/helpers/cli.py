"""`ootd ...` run in this process (CliRunner), and the checks every bad-input test makes of its error."""

from __future__ import annotations

import contextvars
import re
import threading
from typing import Any

import typer
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


# ---------------------------------------------------------------------------------------------- hints

ANOTHER_COMMAND = re.compile(r"`ootd ((?:train |checkpoints )?[a-z]+)([^`]*)`")
ANOTHER_PROGRAM = re.compile(r"python -m [\w.]+[^,;()]*")  # pip's flags, a tool's own: not the command's
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def options_of(path: list[str]) -> set[str]:
    """The flags `ootd PATH` takes, from click's own view of the command (however they come to be declared)."""
    command: Any = typer.main.get_command(cli.app)
    for name in path:
        command = command.commands[name]
    return {n for p in command.params for n in (*p.opts, *p.secondary_opts) if n.startswith("-")} | {"--help"}


def foreign_flags(text: str, path: list[str]) -> list[str]:
    """The flags in `text` that the command they are offered for does not take: `ootd PATH`'s own, or those of
    the command a hint names (`ootd run --mask`)."""
    wrong = []
    for match in ANOTHER_COMMAND.finditer(text):
        other = match.group(1).split()
        wrong += [f"ootd {' '.join(other)} {f}" for f in FLAG.findall(match.group(2)) if f not in options_of(other)]
    rest = ANOTHER_PROGRAM.sub("", ANOTHER_COMMAND.sub("", text))
    own = options_of(path)
    return wrong + [f for f in FLAG.findall(rest) if f not in own]


def assert_hints_are_its_options(result: Any, path: list[str], *fragments: str) -> None:
    """`ootd PATH` said each fragment, and every flag it named is one it (or the command it named) takes."""
    said = result.output
    for fragment in fragments:
        assert fragment in said, said
    assert foreign_flags(said, path) == [], said

"""How the CLI fails: one stderr line and an exit code for every error (ootd/app/console.py), logging per
-v/-q, and click's own usage errors (unknown option, missing value, not a number) as one line too.

Exit codes: 0 success, 1 failure (missing checkpoints, no person found, outputs exist, ...), 2 usage error (bad
option, unusable input image), 3 a setting this machine cannot run (ootd.errors.UnsupportedError), 130
interrupted, 143 terminated. --debug adds the traceback.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import typer
from typer.core import TyperGroup

try:  # typer >= 0.2x carries its own copy of click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover - older typer on top of click
    from click.exceptions import ClickException, NoArgsIsHelpError
    from click.globals import get_current_context

from ootd.app.console import EXIT_INTERRUPTED, console_logging, echo_err, one_line, run_guarded
from ootd.cli.options import cli_name
from ootd.errors import Namer, library_name

LOGGING_PARAMS = ("verbose", "quiet", "debug")


@dataclass(frozen=True)
class FlagNames:
    """How a command words the settings and inputs errors name: by its own options' flags (`ootd train run`'s
    `learning_rate` is `--lr`), else as every command does (`cli_name`). A value, so a batch's Ray workers get it
    too."""

    own: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, name: str) -> str:
        return self.own.get(name) or cli_name(name)

    @classmethod
    def of(cls, command: Callable[..., Any]) -> FlagNames:
        """The flags of `command`'s options (from the typer options in its signature), by parameter name and by
        the name each other long flag makes (batch's `--models/--people`: `people` is `--models` too)."""
        own: dict[str, str] = {}
        for parameter in inspect.signature(command, eval_str=True).parameters.values():
            for meta in getattr(parameter.annotation, "__metadata__", ()):
                # typer.Option("--lr", ...) inside Annotated keeps its first name as `default`
                decls = (getattr(meta, "default", None), *(getattr(meta, "param_decls", None) or ()))
                longs = [d.split("/")[0] for d in decls if isinstance(d, str) and d.startswith("--")]
                if longs:
                    own[parameter.name] = longs[0]
                    for other in longs[1:]:
                        own.setdefault(other[2:].replace("-", "_"), longs[0])
        return cls(own)


def guarded(fn: Callable[[], Any], *, debug: bool = False, name: Namer = library_name) -> int:
    """`run_guarded` for a typer command: its own typer.Exit(code) is its exit code; click's errors pass; an
    error's settings worded by `name`."""

    def call() -> int:
        try:
            fn()
        except typer.Exit as exc:
            return exc.exit_code
        return 0

    return run_guarded(call, debug=debug, passthrough=(ClickException, typer.Abort), options=command_options(),
                       name=name)


def command_options() -> set[str] | None:
    """The flags of the command running now (None outside a command): what its hints may name."""
    context = get_current_context(silent=True)
    if context is None:
        return None
    return {name for param in context.command.params for name in (*param.opts, *param.secondary_opts)
            if name.startswith("-")}


def guarded_command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a command: logging per -v/-q, errors per `guarded`, worded with the command's flags. The logging
    flags are taken here and passed on only to commands that declare them (or take **options)."""
    accepted = inspect.signature(fn).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    names = FlagNames.of(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        flags = {name: kwargs.get(name, False) for name in LOGGING_PARAMS}
        passed = {k: v for k, v in kwargs.items() if takes_all or k in accepted or k not in LOGGING_PARAMS}
        with console_logging(flags["verbose"], flags["quiet"], flags["debug"]):
            code = guarded(lambda: fn(*args, **passed), debug=flags["debug"], name=names)
        if code:
            raise typer.Exit(code)

    return wrapper


class OotdGroup(TyperGroup):
    """Click's own usage errors as one line (`error: ... (see `ootd run --help`)`), exit code 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # noqa: ANN001, ANN201
        tidy_help(self)
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                              **extra)
            code = rv if isinstance(rv, int) else 0
        except NoArgsIsHelpError as exc:  # a group without a command: its help, once (rich printed it already)
            text = exc.format_message()
            if text.strip():
                typer.echo(text)
            code = 0
        except ClickException as exc:
            where = getattr(getattr(exc, "ctx", None), "command_path", None) or "ootd"
            echo_err(f"error: {one_line(exc.format_message())} (see `{where} --help`)")
            code = exc.exit_code
        except typer.Abort:
            echo_err("interrupted")
            code = EXIT_INTERRUPTED
        if standalone_mode:
            sys.exit(code)
        return code


def tidy_help(command: Any) -> None:
    """Flags show no value type in --help (typer would print `<bool>` after them), here and in subcommands; each
    subcommand's line in its group's list is its docstring's first paragraph on one line."""
    params = list(getattr(command, "params", []))
    make_help = getattr(command, "get_help_option", None)
    if callable(make_help) and not getattr(make_help, "_tidied", False):
        def help_option(ctx: Any, _make: Any = make_help) -> Any:
            option = _make(ctx)
            if option is not None:
                option.metavar = ""
            return option

        help_option._tidied = True  # type: ignore[attr-defined]
        command.get_help_option = help_option
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for sub in (getattr(command, "commands", None) or {}).values():
        if getattr(sub, "short_help", None) is None and getattr(sub, "help", None):
            sub.short_help = first_paragraph(sub.help)
        tidy_help(sub)


def first_paragraph(text: str) -> str:
    """A docstring's first paragraph on one line: `ootd --help` lists it, and in rich markup mode typer keeps the
    docstring's own line breaks, which then fall mid-sentence."""
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())

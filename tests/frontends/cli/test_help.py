"""`--help` against docs/commands.md, so the two cannot drift: every command in the docs' table, every option a
command's help shows documented in its section (or in the common options it points to), every option the docs'
tables list taken by the command, every word of a choice listed in its row; `ootd --help` one line per command
whatever the docstrings' line breaks; the test extras the docs name are the ones scripts/test.sh installs."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from ootd import cli
from ootd.app.tryon.settings import API, RUN, SETTINGS
from tests.helpers import REPO

DOCS = (REPO / "docs" / "commands.md").read_text()
COMMON = "Common options"
LOGGING = ("--verbose", "--quiet", "--debug")  # every command's; documented once, in the common options
CHOICES = re.compile(r"^\[([\w-]+(?:\|[\w-]+)+)\]$")  # a metavar that lists every valid word


def sections(text: str) -> dict[str, str]:
    """Each `## ` section's text, its `### ` subsections included, by heading."""
    found: dict[str, str] = {}
    for part in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        heading, _, body = part.partition("\n")
        found[heading.strip()] = body
    return found


def table_rows(text: str) -> list[tuple[str, str]]:
    """(first cell, whole row) of each table row whose first cell names an option."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| `-"):
            rows.append((line.split(" | ")[0], line))
    return rows


def long_names(text: str) -> set[str]:
    return set(re.findall(r"--[a-z][a-z0-9-]*", text))


def commands() -> list[tuple[list[str], Any]]:
    """Every command under `ootd` (`checkpoints verify` as two words), as click sees it."""
    def walk(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
        subs = getattr(command, "commands", None)
        if not subs:
            return [(path, command)]
        return [found for name, sub in subs.items() for found in walk(sub, [*path, name])]

    return walk(typer.main.get_command(cli.app), [])


def shown_help(path: list[str]) -> str:
    result = CliRunner().invoke(cli.app, [*path, "--help"], env={"COLUMNS": "300"})  # no row wraps
    assert result.exit_code == 0, result.output
    return result.output


def options_of(command: Any) -> list[Any]:
    return [p for p in command.params if p.param_type_name == "option" and not p.hidden]


SECTIONS = sections(DOCS)
COMMANDS = commands()


def test_the_docs_table_lists_every_command_and_the_top_help_gives_each_one_line() -> None:
    table = DOCS.split("\n## ", 1)[0]
    for path, _ in COMMANDS:
        name = "ootd " + " ".join(path)
        assert f"[`{name}`](#{name.replace(' ', '-')})" in table, f"{name} is not in docs/commands.md's table"
        assert f"`{name}`" in SECTIONS, f"docs/commands.md has no section for {name}"
    top = shown_help([])
    rows = [line for line in top.splitlines() if line.startswith("│")]
    panel = rows[rows.index(next(r for r in rows if re.match(r"│ run\s", r))):]
    for line in panel:  # a row that starts without a command name continues the one above: a broken sentence
        assert re.match(r"│ [a-z]+\s+\S", line), f"`ootd --help` breaks a command's line: {line.strip()!r}"


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_each_commands_help_and_its_docs_section_name_the_same_options(path: list[str], command: Any) -> None:
    name = "ootd " + " ".join(path)
    section = SECTIONS[f"`{name}`"]
    common = SECTIONS[COMMON] if "(#common-options)" in section else ""
    rows = table_rows(section) + table_rows(common)
    run_rows = table_rows(SECTIONS["`ootd run`"]) + table_rows(SECTIONS[COMMON])
    shown = shown_help(path)
    taken: set[str] = set()
    for option in options_of(command):
        names = [n for n in (*option.opts, *option.secondary_opts) if n.startswith("--")]
        taken.update(names)
        assert any(n in shown for n in names), f"{name} --help does not show {names[0]}"
        documented = section + common + (SECTIONS[COMMON] if names[0] in LOGGING else "")
        assert any(re.search(re.escape(n) + r"(?![\w-])", documented) for n in names), \
            f"{name}'s {names[0]} is not in docs/commands.md"
        words = CHOICES.match(option.metavar or "")
        if words:
            row = next((r for first, r in rows if set(names) & long_names(first)), section)
            if "as for `ootd run`" in row:
                row = next(r for first, r in run_rows if set(names) & long_names(first))
            missing = [w for w in words.group(1).split("|") if not re.search(rf"(?<![\w-]){w}(?![\w-])", row)]
            assert not missing, f"{name}'s {names[0]} {option.metavar}: the docs do not name {missing}"
    for first, _ in table_rows(section):
        extra = long_names(first) - taken
        assert not extra, f"docs/commands.md lists {sorted(extra)} for {name}, which has no such option"


def test_the_common_options_are_those_of_run_and_batch() -> None:
    by_name = {" ".join(path): {n for o in options_of(c) for n in (*o.opts, *o.secondary_opts)} for path, c in COMMANDS}
    for first, _ in table_rows(SECTIONS[COMMON]):
        for option in long_names(first):
            assert option in by_name["run"] and option in by_name["batch"], option


def test_the_test_extras_in_the_docs_are_the_ones_scripts_test_sh_installs() -> None:
    script = (REPO / "scripts" / "test.sh").read_text()
    installed = re.search(r'EXTRAS="(\[[^\]]*\])"', script).group(1)
    said = re.findall(r"`bash scripts/test\.sh[^`]*` installs everything \(`(\[[^\]]*\])`\)", DOCS)
    assert said == [installed], (said, installed)


def test_the_docs_tables_state_each_declared_setting_its_default_and_bounds() -> None:
    """The options tables against the declarations (ootd/app/tryon/settings.py): every setting `ootd run` offers
    has its row, the common options' default column says its default, and a row states its bounds."""
    common = {name: row for first, row in table_rows(SECTIONS[COMMON]) for name in long_names(first)}
    own = {name: row for first, row in table_rows(SECTIONS["`ootd run`"]) for name in long_names(first)}
    for one in SETTINGS.offered_by(RUN):
        row = common.get(one.flag) or own.get(one.flag)
        assert row, f"{one.flag} has no row in docs/commands.md"
        if one.flag in common:
            assert one.default_words() in row.split(" | ")[1], (one.flag, one.default_words(), row)
        elif one.kind is not bool:
            assert one.default_words() in row, (one.flag, one.default_words(), row)
        if one.bounds() is not None:
            assert one.bounds() in row, (one.flag, one.bounds(), row)


def test_the_api_docs_name_every_field_the_form_takes() -> None:
    row = next(line for line in SECTIONS["`ootd serve`"].splitlines() if line.startswith("| `POST /api/tryon`"))
    missing = [one.name for one in SETTINGS.offered_by(API) if f"`{one.name}`" not in row]
    assert not missing, f"docs/commands.md's POST /api/tryon row does not name {missing}"


@pytest.mark.parametrize("group", [[], ["train"], ["checkpoints"]], ids=["ootd", "train", "checkpoints"])
def test_a_group_without_a_command_prints_its_help_once(group: list[str]) -> None:
    result = CliRunner().invoke(cli.app, group)
    assert result.exit_code == 0, result.output
    assert result.output.count("Usage:") == 1 and result.output.count("Commands") == 1, result.output

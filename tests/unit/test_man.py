"""The man pages: lint-clean, one per subcommand, and in step with the code.

In step means: every subcommand has its page and every page a subcommand; every option string
and alias of a subcommand is in its page and every global option in ibtool(8); every JSON key
a plugin's FIELDS declare is in bold in the OUTPUT section of its page; every ExitCode is in
the EXIT STATUS section of ibtool(8), with its name; and every example marked

    .\\" verified: TREE [+stderr]
    .nf
    $ ibtool ARGS
    OUTPUT
    .fi

is what `ibtool --root TREE ARGS` prints on standard output (and, with +stderr, then on
standard error), exiting non-zero exactly when OUTPUT shows an error (health and doctor: with
the Nagios code their output names). TREE is a builder of
tests/fixtures/sysfs_trees.py or gpu_trees.py, or `rxe` for the tree captured from a real
kernel.

The lint runs groff and mandoc. A missing tool skips the lint tests on a workstation and fails
them under CI, whose `make test` installs both (tests/testbed/testbed deps).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from ibtool.cli import build_parser, main
from ibtool.errors import ExitCode
from ibtool.plugin.commands import CommandRegistry
from ibtool.views import render
from tests.fixtures import gpu_trees, sysfs_trees
from tests.unit.own_commands import own_commands

MAN = Path(__file__).resolve().parents[2] / "man"
PAGES = sorted(MAN.glob("*.8"))
MAIN_PAGE = MAN / "ibtool.8"
SECTIONS = (
    "NAME",
    "SYNOPSIS",
    "DESCRIPTION",
    "OPTIONS",
    "OUTPUT",
    "EXAMPLES",
    "EXIT STATUS",
    "SEE ALSO",
)


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if under_ci():
            pytest.fail(f"{name} is not installed: the man pages cannot be linted under CI")
        pytest.skip(f"{name} is not installed")
    return path


# -- roff ---------------------------------------------------------------------------------------

_ESCAPES = [
    (r"\-", "-"),
    (r"\~", " "),
    (r"\(aq", "'"),
    (r"\(dq", '"'),
    (r"\(bu", "*"),
    (r"\&", ""),
    (r"\e", "\\"),
]


def plain(roff: str) -> str:
    """Roff text as a reader sees it: escapes resolved, font changes dropped."""
    text = re.sub(r"\\f[BIRP]", "", roff)
    for escape, char in _ESCAPES:
        text = text.replace(escape, char)
    return text


def unknown_escapes(roff: str) -> list[str]:
    """The escapes plain() does not resolve, which would make it lie about a line."""
    text = re.sub(r"\\f[BIRP]", "", roff)
    for escape, _ in _ESCAPES:
        text = text.replace(escape, "")
    return re.findall(r"\\.", text)


def sections(page: Path) -> dict[str, str]:
    """`.SH` title -> the section's roff source."""
    parts = re.split(r'^\.SH "?([^"\n]+?)"?$', page.read_text(), flags=re.M)
    return {title: body for title, body in zip(parts[1::2], parts[2::2])}


_BOLD_ARGS = {".B": 0, ".BR": 0, ".BI": 0, ".RB": 1, ".IB": 1}  # macro -> first bold argument


def bold_words(roff: str) -> set[str]:
    """The words set in bold: arguments of .B, .BR, .RB, .BI, .IB and \\fB...\\fR spans."""
    spans = re.findall(r"\\fB(.*?)\\f[RPI]", roff)
    for line in roff.splitlines():
        macro, _, rest = line.partition(" ")
        if macro in _BOLD_ARGS:
            args = re.findall(r'"([^"]*)"|(\S+)', rest)
            args = [quoted or bare for quoted, bare in args]
            step = 1 if macro == ".B" else 2
            spans += args[_BOLD_ARGS[macro] :: step]
    return {w for span in spans for w in re.findall(r"[\w-]+", plain(span))}


def has_token(text: str, token: str) -> bool:
    """`token` as a whole word of `text`: -p is not found in --pretty nor in -pno:x."""
    return re.search(rf"(?<![\w-]){re.escape(token)}(?![\w-])", text) is not None


# -- the registry, as cli.main builds it --------------------------------------------------------


@pytest.fixture(scope="module")
def loaded():
    """ibtool's own plugins and their commands (tests/unit/own_commands.py)."""
    return own_commands()


@pytest.fixture(scope="module")
def registry(loaded) -> CommandRegistry:
    return loaded[1]


@pytest.fixture(scope="module")
def parser(registry) -> argparse.ArgumentParser:
    return build_parser(registry)


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def documented_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every option of a parser but the hidden ones (help=SUPPRESS) and the subcommands."""
    return [
        a
        for a in parser._actions
        if a.help != argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)
    ]


def page_of(name: str) -> Path:
    return MAN / f"ibtool-{name}.8"


# -- lint ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_groff_lints_clean(page):
    proc = subprocess.run(
        [tool("groff"), "-man", "-ww", "-z", str(page)], capture_output=True, text=True
    )
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_formatted_at_80_columns_without_a_warning(page):
    # What man(1) does on a terminal and lintian's manpage-has-errors-from-man check runs
    # (MANWIDTH=80): a word that cannot be broken, such as a long path in bold, is a warning
    # there and not under -z.
    proc = subprocess.run(
        [tool("groff"), "-man", "-Tutf8", "-ww", "-rLL=80n", "-rLT=80n", str(page)],
        capture_output=True,
        text=True,
    )
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_mandoc_lints_clean(page):
    # -W warning: no message of level WARNING, ERROR or UNSUPP is acceptable. STYLE messages
    # (input lines over 80 bytes: the examples' real output lines) are below that level.
    proc = subprocess.run(
        [tool("mandoc"), "-Tlint", "-W", "warning", str(page)], capture_output=True, text=True
    )
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_page_has_the_sections_and_names_itself(page):
    text = page.read_text()
    titles = list(sections(page))
    assert [s for s in SECTIONS if s not in titles] == []
    assert (titles[0], titles[-1]) == ("NAME", "SEE ALSO")
    name = page.stem
    th = re.search(r"^\.TH (\S+) 8 ", text, re.M)
    assert th is not None and plain(th.group(1)) == name.upper()
    assert plain(sections(page)["NAME"]).strip().startswith(f"{name} - ")


# -- one page per subcommand ----------------------------------------------------------------------


def test_every_subcommand_has_its_page(registry):
    assert [n for n in sorted(registry.commands) if not page_of(n).exists()] == []


def test_every_subcommand_page_is_a_subcommand(registry):
    pages = {p.stem.removeprefix("ibtool-") for p in PAGES if p != MAIN_PAGE}
    assert sorted(pages - set(registry.commands)) == []


def test_ibtool_8_lists_every_object_and_its_page(registry):
    s = sections(MAIN_PAGE)
    objects, see_also = plain(s["OBJECTS"]), plain(s["SEE ALSO"])
    missing = []
    for command in registry.commands.values():
        missing += [n for n in (command.name, *command.aliases) if not has_token(objects, n)]
        if f"ibtool-{command.name} (8)" not in see_also:
            missing.append(f"ibtool-{command.name}(8) in SEE ALSO")
    assert missing == []


# -- options ------------------------------------------------------------------------------------


def test_every_option_and_alias_of_a_subcommand_is_in_its_page(registry, parser):
    undocumented = {}
    for name, sub in subparsers(parser).items():
        if name not in registry.commands:
            continue  # an alias: checked with its command
        command = registry.commands[name]
        text = plain(page_of(name).read_text())
        synopsis = plain(sections(page_of(name))["SYNOPSIS"])
        missing = [n for n in (name, *command.aliases) if not has_token(synopsis, n)]
        for action in documented_actions(sub):
            missing += [o for o in action.option_strings if not has_token(text, o)]
            missing += [str(c) for c in action.choices or () if not has_token(text, str(c))]
        if missing:
            undocumented[page_of(name).name] = missing
    assert undocumented == {}


def test_every_global_option_is_in_ibtool_8(parser):
    options = plain(sections(MAIN_PAGE)["OPTIONS"])
    strings = [o for a in documented_actions(parser) for o in a.option_strings]
    assert {"-V", "--version", "-h", "--help", "-j", "--root"} <= set(strings)
    assert [o for o in [*strings, "-p no:"] if not has_token(options, o)] == []


# -- output -------------------------------------------------------------------------------------


def test_every_json_key_is_in_the_output_section(loaded):
    plugins, registry = loaded
    undocumented = {}
    for command in registry.commands.values():
        if command.plugin == "core":  # `plugins`: its fields live in cli; ask for its JSON
            out = io.StringIO()
            assert main(["-j", "plugins"], stdout=out, stderr=io.StringIO()) == 0
            keys = {k for record in json.loads(out.getvalue()) for k in record}
        else:
            module = plugins.pm.get_plugin(command.plugin)
            # Field lists the module holds, or holds in a table (res: FIELDS_OF per object).
            values = list(vars(module).values())
            values += [v for d in values if isinstance(d, dict) for v in d.values()]
            keys = {
                f.key
                for value in values
                if isinstance(value, list) and value and isinstance(value[0], render.Field)
                for f in value
            }
        # A plugin whose JSON is not declared as render.Field lists (ping) is not checked here.
        output = bold_words(sections(page_of(command.name))["OUTPUT"])
        missing = sorted(keys - output)
        if missing:
            undocumented[command.name] = missing
    assert undocumented == {}


# -- exit status --------------------------------------------------------------------------------


def test_every_exit_code_is_in_ibtool_8_with_its_name():
    section = sections(MAIN_PAGE)["EXIT STATUS"]
    entries = dict(re.findall(r"^\.TP\n\.B (\d+)\n(.*?)(?=^\.TP$|\Z)", section, re.M | re.S))
    assert sorted(int(v) for v in entries) == sorted(int(code) for code in ExitCode)
    assert [c.name for c in ExitCode if not has_token(plain(entries[str(c.value)]), c.name)] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_exit_status_a_page_names_is_an_exit_code(page):
    section = plain(sections(page)["EXIT STATUS"])
    named = {int(n) for n in re.findall(r"(?<![\w.^/(-])(\d+)(?![\w.^/)-])", section)}
    assert sorted(named - {int(code) for code in ExitCode}) == []


# -- examples -----------------------------------------------------------------------------------


def verified_examples() -> list:
    """(tree, with stderr, argv, expected lines) of every verified example, with the page and
    line of its command as the id."""
    examples = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            m = re.fullmatch(r'\.\\" verified: (\S+)( \+stderr)?', line)
            if not m:
                continue
            assert lines[i + 1] == ".nf", f"{page.name}:{i + 1}: .nf must follow the marker"
            end = lines.index(".fi", i + 2)
            block = lines[i + 2 : end]
            assert [e for x in block for e in unknown_escapes(x)] == [], f"{page.name}:{i + 3}"
            command, *expected = (plain(x) for x in block)
            assert command.startswith("$ ibtool "), f"{page.name}:{i + 3}: {command}"
            argv = shlex.split(command.removeprefix("$ ibtool "))
            examples.append(
                pytest.param(
                    m.group(1), bool(m.group(2)), argv, expected, id=f"{page.name}:{i + 3}"
                )
            )
    return examples


EXAMPLES = verified_examples()


def test_the_pages_have_verified_examples():
    assert {e.id.split(":")[0] for e in EXAMPLES} >= {
        "ibtool-dev.8",
        "ibtool-port.8",
        "ibtool-gids.8",
    }


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    built: dict[str, Path] = {"rxe": sysfs_trees.CAPTURED_RXE}

    def tree(name: str) -> Path:
        if name not in built:
            builder = sysfs_trees if name in sysfs_trees.TREES else gpu_trees
            assert name in builder.TREES, f"no fixture tree {name!r}"
            built[name] = builder.build(name, tmp_path_factory.mktemp(name))
        return built[name]

    return tree


@pytest.mark.parametrize(("tree", "with_stderr", "argv", "expected"), EXAMPLES)
def test_example_output_is_what_ibtool_prints(trees, tree, with_stderr, argv, expected):
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(trees(tree)), *argv], stdout=out, stderr=err)
    got = out.getvalue().splitlines() + (err.getvalue().splitlines() if with_stderr else [])
    assert got == expected
    if argv[0] == "health":  # a Nagios plugin: its first line names the exit status
        status = expected[0].split()[1]
        assert code == ["OK", "WARNING", "CRITICAL", "UNKNOWN"].index(status), err.getvalue()
        return
    if argv[0] == "doctor":  # Nagios' codes too: its last line names the worst verdict
        status = expected[-1].split()[1]
        assert code == {"PASS": 0, "SKIP": 0, "WARN": 1, "FAIL": 2}[status], err.getvalue()
        return
    fails = any(line.startswith("ibtool: error:") for line in expected)
    assert (code != 0) == fails, err.getvalue()

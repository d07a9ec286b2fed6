"""Man pages: one per subcommand, lint-clean, and in step with the code's options and exit codes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ibtool.cli import _global_options, _plugins_command, _register_commands, build_parser
from ibtool.commands import CommandRegistry
from ibtool.errors import ExitCode
from ibtool.plugins import build_plugins

MAN = Path(__file__).resolve().parents[2] / "man"
PAGES = sorted(MAN.glob("*.8"))


def registry() -> CommandRegistry:
    plugins = build_plugins(environ={"IBTOOL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    reg = CommandRegistry()
    _register_commands(plugins, reg, warn=lambda m: None)
    _plugins_command(reg, plugins)
    return reg


def roff_text(page: Path) -> str:
    """The page's text with roff's escaped hyphens made plain: what a reader searches."""
    return page.read_text().replace("\\-", "-")


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{tool} is not installed: the man pages cannot be linted")
        pytest.skip(f"{tool} is not installed")
    return path


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_groff_lints_clean(page):
    proc = subprocess.run(
        [need("groff"), "-man", "-ww", "-z", str(page)], capture_output=True, text=True
    )
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_mandoc_lints_clean(page):
    proc = subprocess.run(
        [need("mandoc"), "-Tlint", "-W", "warning", str(page)], capture_output=True, text=True
    )
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")


def test_every_subcommand_has_its_page():
    missing = [n for n in registry().commands if not (MAN / f"ibtool-{n}.8").exists()]
    assert missing == []


def _option_strings(parser) -> set[str]:
    hidden = {a for a in parser._actions if a.help == "==SUPPRESS=="}
    return {s for a in parser._actions if a not in hidden for s in a.option_strings}


def test_every_option_of_every_subcommand_is_documented_in_its_page():
    reg = registry()
    parser = build_parser(reg)
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    import argparse

    globals_parser = argparse.ArgumentParser(add_help=False)
    _global_options(globals_parser, suppress=False)
    global_options = _option_strings(globals_parser)
    for name, command in reg.commands.items():
        text = roff_text(MAN / f"ibtool-{name}.8")
        own = _option_strings(sub.choices[name]) - global_options - {"-h", "--help"}
        undocumented = sorted(o for o in own if not re.search(rf"(?<![\w-]){re.escape(o)}\b", text))
        assert undocumented == [], f"ibtool-{name}.8"
        for alias in command.aliases:
            assert re.search(rf"\b{alias}\b", text), f"alias {alias} missing in ibtool-{name}.8"


def test_every_global_option_is_in_ibtool_8():
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    _global_options(p, suppress=False)
    text = roff_text(MAN / "ibtool.8")
    for option in [*_option_strings(p), "-V", "--version", "-p no:"]:
        assert option in text, option


def test_every_exit_code_is_in_the_exit_status_section():
    text = roff_text(MAN / "ibtool.8")
    section = text.split(".SH EXIT STATUS", 1)[1].split(".SH", 1)[0]
    documented = {int(v) for v in re.findall(r"^\.B (\d+)$", section, re.M)}
    assert documented == {int(code) for code in ExitCode}

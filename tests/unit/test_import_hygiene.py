"""Headless sysfs commands never pay for textual, rich, pyroute2 or pyverbs.

pyroute2's package import alone costs about 0.25 s on these machines; the TUI stack more.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CAPTURED = Path(__file__).resolve().parent.parent / "fixtures/captured/rxe-pair"
HEAVY = ("textual", "rich", "pyroute2", "pyverbs")

PROBE = """
import sys, io, json
from ibtool.cli import main
code = main(sys.argv[1:], stdout=io.StringIO(), stderr=io.StringIO())
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(json.loads({heavy!r})))
print(json.dumps(heavy))
"""


def loaded_heavy_modules(*argv: str) -> list[str]:
    code = PROBE.replace("{heavy!r}", repr(json.dumps(HEAVY)))
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["dev"],
        ["port"],
        ["gids"],
        ["-j", "gids"],
        ["gids", "--best"],
        ["plugins"],
        ["counters"],  # --root: sysfs only, no netlink STAT_GET
        ["-j", "counters", "--errors"],
    ],
)
def test_headless_commands_import_no_heavy_module(argv, tmp_path):
    assert loaded_heavy_modules("--root", str(tmp_path), *argv) == []
    # and on a real tree (the testbed's rxe pair), where the commands have data to show
    assert loaded_heavy_modules("--root", str(CAPTURED), *argv) == []


def test_details_imports_pyverbs_only_when_it_is_there(tmp_path):
    # --root trees have no verbs; -d must still not drag in the TUI or netlink stacks.
    loaded = loaded_heavy_modules("--root", str(tmp_path), "-d", "dev")
    assert "textual" not in loaded and "pyroute2" not in loaded


NETLINK_PROBE = """
import sys, json
loaded = []
sys.addaudithook(lambda event, args: event == 'import' and loaded.append(args[0]))
import ibtool.sources.netlink.messages
light = sorted({m for m in loaded if m.split('.')[0] == 'pyroute2'})
left = sorted(m for m in sys.modules if m.split('.')[0] == 'pyroute2')
import pyroute2
print(json.dumps([light, left, hasattr(pyroute2, 'IPRoute'), hasattr(pyroute2, 'netlink')]))
"""


def test_netlink_layer_loads_pyroute2_netlink_without_the_package_init():
    # pyroute2/__init__.py imports ~380 modules (about 10 s in the testbed guest); the NLDEV
    # layer needs pyroute2.netlink and its Marshal only, and must not spoil a later real import.
    out = subprocess.run(
        [sys.executable, "-c", NETLINK_PROBE], capture_output=True, text=True, check=True
    ).stdout
    light, left, real_package, has_netlink = json.loads(out.strip().splitlines()[-1])
    assert "pyroute2.netlink.marshal" in light
    assert "pyroute2.iproute" not in light and "pyroute2.ndb.main" not in light
    assert len(light) < 15, light
    assert left == []
    assert real_package and has_netlink


def test_the_dashboard_without_a_terminal_says_so_and_imports_no_textual(tmp_path):
    # A pipe is not a terminal: one usage error (exit 2) naming what to use instead.
    assert loaded_heavy_modules("--root", str(CAPTURED), "tui") == []
    done = subprocess.run(
        [sys.executable, "-m", "ibtool", "--root", str(CAPTURED), "tui"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("ibtool: error: ibtool tui needs a terminal")
    assert "ibtool counters --watch" in done.stderr


# -- start-up: what a headless command must not import (issue 43) ------------------------------

# Modules no headless command reading sysfs needs, each a price paid at every start if one
# slipped into an import at a module's top: the distributions' metadata and the email parser it
# reads it with (the plugins are found from a cache), the MAD libraries' ctypes, the network and
# process machinery of the data path, the exporter and the mesh, and the TUI's stack.
NEVER_AT_START = (
    "importlib.metadata",
    "email",
    "zipfile",
    "ctypes",
    "socket",
    "selectors",
    "ssl",
    "http",
    "asyncio",
    "subprocess",
    "tempfile",
    "platform",
    "traceback",
    "datetime",
    "decimal",
    "tomllib",
    "textual",
    "rich",
    "pyroute2",
    "pyverbs",
)
# --version answers before any plugin or command is loaded: not even these. (Not typing: on
# Python 3.9, importlib.util, which finds pyverbs without importing it, imports it through
# importlib.abc.)
NEVER_FOR_VERSION = (*NEVER_AT_START, "pluggy", "dataclasses", "inspect", "json")

STARTED = """
import sys, io
from ibtool.cli import main
main(sys.argv[1:], stdout=io.StringIO(), stderr=io.StringIO())
loaded = sorted(sys.modules)
import json
print(json.dumps(loaded))
"""


def started_modules(environ: dict, *argv: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", STARTED, *argv],
        capture_output=True,
        text=True,
        check=True,
        env=environ,
    ).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def top_level(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in modules))


@pytest.fixture
def cached(tmp_path) -> dict:
    """An environment whose plugin cache is this test's (written by a first start)."""
    import os

    environ = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    environ.pop("IBTOOL_DISABLE_PLUGIN_AUTOLOAD", None)
    started_modules(environ, "--root", str(CAPTURED), "plugins")
    assert (tmp_path / "cache" / "ibtool").is_dir()
    return environ


@pytest.mark.parametrize(
    "argv",
    [
        ["dev"],
        ["port"],
        ["-j", "port"],
        ["gids"],
        ["gids", "--best"],
        ["counters"],
        ["-j", "counters", "--errors"],
        ["plugins"],
        ["port", "show", "nosuch0"],  # an error's way out too
        ["port", "--no-such-option"],
    ],
)
def test_a_headless_command_imports_nothing_it_does_not_use(argv, cached):
    loaded = started_modules(cached, "--root", str(CAPTURED), *argv)
    assert top_level(loaded, NEVER_AT_START) == []


def test_version_imports_no_plugin_nor_command_machinery(cached):
    loaded = started_modules(cached, "--version")
    assert top_level(loaded, NEVER_FOR_VERSION) == []
    assert not any(m.startswith("ibtool_plugins") for m in loaded)


def test_the_check_sees_a_heavy_import(cached, tmp_path):
    # A plugin importing email at its top, through IBTOOL_PLUGINS: the same probe names it.
    (tmp_path / "heavy_plugin.py").write_text("import email.parser\n")
    environ = dict(cached, IBTOOL_PLUGINS="heavy_plugin", PYTHONPATH=str(tmp_path))
    loaded = started_modules(environ, "--root", str(CAPTURED), "dev")
    assert "email" in top_level(loaded, NEVER_AT_START)


def test_a_cold_plugin_cache_is_the_one_start_that_reads_the_metadata(tmp_path):
    import os

    environ = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    environ.pop("IBTOOL_DISABLE_PLUGIN_AUTOLOAD", None)
    first = started_modules(environ, "--root", str(CAPTURED), "dev")
    second = started_modules(environ, "--root", str(CAPTURED), "dev")
    assert "importlib.metadata" in first
    assert "importlib.metadata" not in second

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

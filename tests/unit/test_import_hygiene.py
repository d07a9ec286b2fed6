"""Headless sysfs commands never pay for textual, rich, pyroute2 or pyverbs.

pyroute2's package import alone costs about 0.25 s on these machines; the TUI stack more.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
    [["--version"], ["dev"], ["port"], ["gids"], ["-j", "gids"], ["gids", "--best"], ["plugins"]],
)
def test_headless_commands_import_no_heavy_module(argv, tmp_path):
    assert loaded_heavy_modules("--root", str(tmp_path), *argv) == []


def test_details_imports_pyverbs_only_when_it_is_there(tmp_path):
    # --root trees have no verbs; -d must still not drag in the TUI or netlink stacks.
    loaded = loaded_heavy_modules("--root", str(tmp_path), "-d", "dev")
    assert "textual" not in loaded and "pyroute2" not in loaded

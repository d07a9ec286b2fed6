"""The fabric the dashboard's fabric screen is tested on: a snapshot saved with `snapshot save
FILE --fabric` on the simulated NARROW fabric of tests/fabric (ibsim + opensm: two leaves of
three HCAs, two spines, leaf01/1 and leaf01/2 at 1X), with error counters set through ibsim's
console: 57 SymbolErrorCounter and 3 LinkErrorRecoveryCounter at leaf02/2 (node005's cable),
4 PortRcvErrors at spine01/1 (leaf01's uplink). The TUI's tests read the file, never the
simulator.

Made again with `python -m tests.tui.fabric_fixture` (ibsim-utils, opensm and infiniband-diags
installed), which writes FIXTURE.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/captured/snapshot/fabric.json.gz"
HOST = "node003 mlx5_0"
FAULTS = (
    'PerformanceSet "leaf02"[2] PortCounters.SymbolErrorCounter=57',
    'PerformanceSet "leaf02"[2] PortCounters.LinkErrorRecoveryCounter=3',
    'PerformanceSet "spine01"[1] PortCounters.PortRcvErrors=4',
)


def make(path: Path) -> None:
    from tests.fabric.conftest import NARROW, need_the_simulator
    from tests.fabric.ibsim import SimFabric
    from tests.fabric.test_fabric import ibtool

    need_the_simulator()
    with tempfile.TemporaryDirectory() as work, SimFabric(NARROW, Path(work)) as sim:
        for line in FAULTS:
            sim.console(line)
        for _ in range(100):  # ibsim applies a console line when it reads it: until it has
            r = ibtool(sim, "-j", "fabric", "errors", "--no-state", host=HOST)
            said = json.loads(r.stdout)["ports"] if r.returncode in (0, 1) else []
            if sum(len(p["findings"]) for p in said) == len(FAULTS):
                break
        r = ibtool(sim, "snapshot", "save", str(path), "--fabric", host=HOST)
        if r.returncode != 0:
            raise SystemExit(r.stderr)
        print(r.stdout.strip())


if __name__ == "__main__":
    make(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE)

#!/usr/bin/env python3
"""Benchmark: `ibtool mesh` naming the cable on a simulated 648-HCA fat tree.

ibsim serves a two-level fat tree (36 leaves of 18 HCAs, 18 spines of 36 ports) with opensm as
its subnet manager (tests/fabric/ibsim.py). A mesh of every HCA's port 1 over `--rounds` rounds
is shaped there as tests/fabric/test_fabric_mesh.py shapes it: the pairs whose route (either
way) crosses one leaf's uplink fail. Then the cable analysis runs as the coordinator runs it
(ibtool.mesh.cables.name_cables: the port that reaches the subnet, its scan, the routes of the
failing pairs and of a sample of the passing ones, the cable's counters). Printed: its wall and
CPU seconds, the routes it walked, the forwarding-table SMPs they cost, and its verdict.

Usage: .venv/bin/python bench/bench_mesh_cables.py [--leaves 36] [--hcas 18] [--spines 18]
       [--rounds 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fabric.ibsim import SimFabric, fat_tree, missing  # noqa: E402

MESH = """
import json, sys, time
from ibtool.host import Host
from ibtool.mesh.analysis import analyse
from ibtool.mesh.cables import name_cables
from ibtool.mesh.schedule import plan
from ibtool.model.fabric import NodeType
from ibtool.model.mesh import Endpoint, MeshResult, PairState, PairTable, Settings
from ibtool.sources import mad

broken, rounds = tuple(json.loads(sys.argv[1])), int(sys.argv[2])
host = Host()
fabric = host.fabric()
hcas = sorted(fabric.by_type(NodeType.CA), key=lambda n: n.description)
eps = [
    Endpoint(n.description.split()[0], n.description.split()[1], 1, 0, "192.0.2.1", "ACTIVE",
             "InfiniBand", lid=n.ports[1].lid, guid=n.guid)
    for n in hcas
]
schedule = plan(eps, False, rounds)
pairs = [p for r in range(schedule.rounds) for p in schedule.pairs(r)]
lids = {(eps[s].lid, eps[d].lid) for s, d in pairs} | {(eps[d].lid, eps[s].lid) for s, d in pairs}
routes = host.fabric_routes(fabric, sorted(lids))

def crosses(route):
    return any(broken in ((h.node.description, h.port.number), (h.far.description,
               h.far_port.number)) for h in route.hops)

table = PairTable(schedule.rounds, len(eps))
failing = 0
for r in range(schedule.rounds):
    for s, d in schedule.pairs(r):
        bad = crosses(routes[eps[s].lid, eps[d].lid]) or crosses(routes[eps[d].lid, eps[s].lid])
        failing += bad
        table.record(r, s, d, PairState.PROBED, 20, 0 if bad else 20, None if bad else 9.0,
                     None if bad else 11.0, None if bad else 14.0, False, None)
result = MeshResult(Settings(20, 64, "send", 100.0, 2.0, False, 10.0, 18521, "local"), eps,
                    table, schedule.rounds, {})
analyse(result, schedule)
asked, walked = [], []
lft_block, fabric_routes = mad.lft_block, host.fabric_routes
mad.lft_block = lambda handle, lid, block, *rest: asked.append(lid) or lft_block(
    handle, lid, block, *rest)
host.fabric_routes = lambda f, p, b=None: walked.append(len(p)) or fabric_routes(f, p, b)
wall, cpu = time.monotonic(), time.process_time()
name_cables(host, result, lambda line: print(line, file=sys.stderr), thresholds={})
wall, cpu = time.monotonic() - wall, time.process_time() - cpu
print(json.dumps({
    "endpoints": len(eps), "pairs": len(pairs), "failing": failing,
    "switches": len(fabric.by_type(NodeType.SWITCH)), "wall": wall, "cpu": cpu,
    "routes": sum(walked), "lft_smps": len(asked),
    "verdicts": [f"{v.level.name} {v.culprit.value} {v.subject}: {v.why}"
                 for v in result.verdicts[:3]],
}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, default=36)
    ap.add_argument("--hcas", type=int, default=18)
    ap.add_argument("--spines", type=int, default=18)
    ap.add_argument("--rounds", type=int, default=64)
    a = ap.parse_args()
    gone = missing()
    if gone:
        print(f"no simulated fabric here: {', '.join(gone)} missing", file=sys.stderr)
        return 2
    broken = ["leaf03", a.hcas + 2]  # leaf03's uplink to spine02
    with tempfile.TemporaryDirectory() as tmp:
        with SimFabric(fat_tree(a.leaves, a.hcas, a.spines), Path(tmp)) as sim:
            env = {**sim.env(), "PYTHONPATH": str(REPO)}
            r = subprocess.run(
                [sys.executable, "-c", MESH, json.dumps(broken), str(a.rounds)], env=env,
                capture_output=True, text=True, timeout=1800, cwd=tmp,
            )  # fmt: skip
    if r.returncode:
        print(r.stderr, file=sys.stderr)
        return 1
    got = json.loads(r.stdout)
    print(
        f"{got['endpoints']} endpoints, {got['pairs']} pairs ({got['failing']} failing through "
        f"{broken[0]}/{broken[1]}), {got['switches']} switches"
    )
    print(
        f"cable analysis: {got['wall']:.2f} s wall, {got['cpu']:.2f} s CPU; {got['routes']} "
        f"routes walked for {got['lft_smps']} forwarding-table SMPs"
    )
    for line in got["verdicts"]:
        print(line[:300])
    return 0


if __name__ == "__main__":
    sys.exit(main())

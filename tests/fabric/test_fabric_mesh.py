"""`ibtool mesh` names the cable on a simulated fat tree: the routes opensm programmed for every
HCA pair walked through the switches' forwarding tables (the Host's walk, under umad2sim), the
pairs whose route crosses one spine port failed, the mesh's analysis run on them, and the cable
verdict it adds read back."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.fabric.test_fabric import CHECKOUT
from tests.fabric.test_fabric_errors import put

# leaf03's uplink to spine02 (tests.fabric.ibsim.fat_tree: a leaf's HCAs on its first ports,
# then one port a spine; a spine's port N to leaf N)
BROKEN = ("leaf03", 4)
FAR = ("spine02", 3)

# Run on the fabric's first node: the mesh of every HCA's port 1, every ordered pair probed
# once (one rail: every shift), 20 pings each, none answered where its pings' route or its
# answers' crosses BROKEN; then the analysis and the cable verdict, as `ibtool mesh` runs them.
MESH = """
import json, sys
from ibtool.host import Host
from ibtool.mesh.analysis import analyse
from ibtool.mesh.cables import name_cables
from ibtool.mesh.schedule import plan
from ibtool.model.fabric import NodeType
from ibtool.model.mesh import Endpoint, MeshResult, PairState, PairTable, Settings
from ibtool.views.mesh import verdict_json

broken = tuple(json.loads(sys.argv[1]))
host = Host()
fabric = host.fabric()
hcas = sorted(fabric.by_type(NodeType.CA), key=lambda n: n.description)
eps = [
    Endpoint(n.description.split()[0], n.description.split()[1], 1, 0, f"192.0.2.{k + 1}",
             "ACTIVE", "InfiniBand", lid=n.ports[1].lid, guid=n.guid)
    for k, n in enumerate(hcas)
]
routes = host.fabric_routes(fabric, [(a.lid, b.lid) for a in eps for b in eps if a is not b])
# a few as `fabric route` walks one (umad2sim runs out of ports opened and closed again
# within one process: not all 56)
single = all(host.fabric_route(fabric, str(s), str(d)).hops == r.hops
             for (s, d), r in list(routes.items())[::14])

def crosses(route):
    return any(broken in ((h.node.description, h.port.number), (h.far.description,
               h.far_port.number)) for h in route.hops)

schedule = plan(eps, False, None)
table = PairTable(schedule.rounds, len(eps))
failing = passing = 0
for r in range(schedule.rounds):
    for s, d in schedule.pairs(r):
        bad = crosses(routes[eps[s].lid, eps[d].lid]) or crosses(routes[eps[d].lid, eps[s].lid])
        failing, passing = failing + bad, passing + (not bad)
        table.record(r, s, d, PairState.PROBED, 20, 0 if bad else 20, None if bad else 9.0,
                     None if bad else 11.0, None if bad else 14.0, False, None)
settings = Settings(20, 64, "send", 100.0, 2.0, False, 10.0, 18521, "local")
result = MeshResult(settings, eps, table, schedule.rounds, {})
analyse(result, schedule)
from ibtool.sources import mad
asked = []
lft_block = mad.lft_block
mad.lft_block = lambda handle, lid, block, *rest: asked.append((lid, block)) or lft_block(
    handle, lid, block, *rest)
name_cables(host, result, lambda line: print(line, file=sys.stderr), thresholds={})
names = [e.name for e in eps]
print(json.dumps({
    "failing": failing,
    "passing": passing,
    "broken_routes": sum(1 for r in routes.values() if r.broken),
    "as_fabric_route": single,
    "switches": len(fabric.by_type(NodeType.SWITCH)),
    "lft_smps": asked,
    "verdicts": [verdict_json(v, names) for v in result.verdicts],
}))
"""


def mesh(sim) -> dict:
    env = {**sim.env(), "PYTHONPATH": CHECKOUT}
    r = subprocess.run(
        [sys.executable, "-c", MESH, json.dumps(BROKEN)], env=env, capture_output=True,
        text=True, timeout=120, cwd=sim.dir,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_spine_port_the_failing_routes_cross_is_named_with_its_counts_and_errors(tree):
    put(tree, (*FAR, "SymbolErrorCounter"), 500)
    try:
        got = mesh(tree)
    finally:
        put(tree, (*FAR, "SymbolErrorCounter"), 0)
    assert got["broken_routes"] == 0
    assert got["as_fabric_route"]  # each route walked among many as `fabric route` walks it
    failing, passing = got["failing"], got["passing"]
    assert failing + passing == 8 * 7 and 2 <= failing < passing
    (cable,) = [v for v in got["verdicts"] if v["culprit"] == "cable"]
    assert cable["subject"] == "leaf03/4 <-> spine02/3"
    assert cable["level"] == "FAIL"
    assert cable["why"].startswith(
        f"on {failing} of {failing} failing paths, 0 of {passing} passing"
    )
    assert "spine02/3: SymbolErrorCounter 500 > 0" in cable["why"]
    c = cable["cable"]
    assert [(e["node"], e["port"]) for e in c["ends"]] == [BROKEN, FAR]
    assert (c["failing"], c["failing_walked"], c["failing_total"]) == (failing, failing, failing)
    assert (c["passing"], c["passing_walked"], c["passing_total"]) == (0, passing, passing)
    assert c["ties"] == [] and c["unread"] == []
    assert c["errors"] == [
        {"end": "spine02/3", "counter": "SymbolErrorCounter", "value": 500, "threshold": 0,
         "saturated": False}
    ]  # fmt: skip
    # every route of every pair walked both ways for the cable: each switch's one block of
    # its forwarding table (LIDs under 64) asked once for them all
    assert len(got["lft_smps"]) == len(set(map(tuple, got["lft_smps"]))) <= got["switches"]
    assert cable["next"][0].startswith(f"ibtool fabric --via {c['via']} route ")
    # its pairs' path verdicts folded into it, the endpoint every failing pair of which it
    # explains said in it
    assert not [v for v in got["verdicts"] if v["culprit"] == "path"]
    assert got["verdicts"][0] is not None and got["verdicts"][0]["culprit"] == "cable"

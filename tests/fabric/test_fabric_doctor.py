"""`ibtool doctor` on InfiniBand, on simulated fabrics: the SM its port names, this end's cable
and the peer's, and the LID route hop by hop against ibtracert's; a fault at the switch end of
the peer's cable named on that cable and not on this end's; the SM killed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.fabric import oracle
from tests.fabric.conftest import SMALL, need_the_simulator
from tests.fabric.ibsim import SimFabric
from tests.fabric.test_fabric import CHECKOUT, diags, ibtool

HERE, THERE = "node001 mlx5_0", "node005 mlx5_0"  # leaf01's and leaf02's: across a spine


def lid_of(sim, host: str) -> int:
    """The LID of `host`'s port, as ibaddr there says it ("... LID start 9 end 9")."""
    words = diags(sim, "ibaddr", "-L", host=host).split()
    return int(words[words.index("start") + 1], 0)


def doctor_to(sim, lid: int, host: str = HERE) -> dict:
    env = {**sim.env(host), "PYTHONPATH": CHECKOUT}
    r = subprocess.run([sys.executable, "-m", "tests.fabric.doctor_peer", str(lid), THERE],
                       env=env, capture_output=True, text=True, timeout=120,
                       cwd=sim.dir)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_route_to_the_peer_is_ibtracerts_hop_by_hop(small):
    src, dst = lid_of(small, HERE), lid_of(small, THERE)
    got = doctor_to(small, dst)
    route = got["fabric"]["route"]
    theirs = oracle.tracert(diags(small, "ibtracert", str(src), str(dst), host=HERE))
    assert [(h["out"]["port"], h["into"]["port"]) for h in route["hops"]] == [
        (out, far) for out, _, far, _ in theirs
    ]
    assert [int(h["into"]["port_guid"], 16) for h in route["hops"]] == [
        int(g, 16) for _, g, _, _ in theirs
    ]
    assert (route["source"]["lid"], route["dest"]["lid"], route["broken"]) == (src, dst, None)
    checks = got["checks"]
    assert {c: checks[c]["status"] for c in ("sm", "cable", "peer_cable", "lid_route")} == {
        "sm": "PASS", "cable": "PASS", "peer_cable": "PASS", "lid_route": "PASS"
    }  # fmt: skip
    assert checks["lid_route"]["evidence"] == (
        f"LID {src} -> LID {dst}: 4 links through 3 switches, every link ACTIVE at what its "
        "ends enable"
    )
    # the text shows each hop below the route's line
    at = next(i for i, line in enumerate(got["text"]) if " lid_route " in line)
    hops = got["text"][at + 1 : at + 5]
    assert hops[0].split() == ["1:", "node001", "mlx5_0/1", "->", "leaf01/1", "(LID",
                               f"{lid_of(small, 'leaf01')}),", "4X", "SDR", "ACTIVE"]  # fmt: skip
    assert hops[-1].split()[-6:] == ["mlx5_0/1", "(LID", f"{dst}),", "4X", "SDR", "ACTIVE"]
    assert got["warnings"] == []


@pytest.fixture
def symbols(counted):
    """SymbolErrorCounter 500 at the switch end of the peer's cable, put back after."""
    src, dst = lid_of(counted, HERE), lid_of(counted, THERE)
    port = doctor_to(counted, dst)["fabric"]["route"]["hops"][-1]["out"]["port"]
    counted.console(f'PerformanceSet "leaf02"[{port}] PortCounters.SymbolErrorCounter=500')
    leaf = str(lid_of(counted, "leaf02"))
    _until(lambda: oracle.perfquery(diags(counted, "perfquery", leaf, str(port)))
           ["SymbolErrorCounter"] == 500)  # fmt: skip
    yield counted, src, dst, port
    counted.console(f'PerformanceSet "leaf02"[{port}] PortCounters.SymbolErrorCounter=0')
    _until(lambda: oracle.perfquery(diags(counted, "perfquery", leaf, str(port)))
           ["SymbolErrorCounter"] == 0)  # fmt: skip


def _until(ready, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "ibsim did not take the counter"
        time.sleep(0.05)


def test_symbol_errors_at_the_peers_switch_port_are_named_on_the_peers_cable_only(symbols):
    sim, _, dst, port = symbols
    got = doctor_to(sim, dst)
    peer, mine = got["checks"]["peer_cable"], got["checks"]["cable"]
    assert peer["status"] == "WARN"
    assert peer["evidence"] == (
        f"{THERE}/1 <-> leaf02/{port}: 4X SDR ACTIVE; leaf02/{port} SymbolErrorCounter 500"
    )
    assert peer["fix"].startswith("SymbolErrorCounter: bit errors on the wire: reseat or replace")
    assert f"perfquery -R {lid_of(sim, 'leaf02')} {port}" in peer["fix"]
    assert (mine["status"], mine["fix"]) == ("PASS", None)
    assert "SymbolErrorCounter" not in mine["evidence"]
    assert got["fabric"]["peer_cable"]["errors"] == ["SymbolErrorCounter"]
    assert got["fabric"]["cable"]["errors"] == []
    # from the peer's side it is this end's own cable
    back = doctor_to(sim, lid_of(sim, HERE), host=THERE)
    assert back["checks"]["cable"]["status"] == "WARN"
    assert back["checks"]["peer_cable"]["status"] == "PASS"


def test_doctor_on_an_infiniband_port_asks_the_sm_and_judges_its_cable(small):
    r = ibtool(small, "-j", "doctor", "--no-probe", host=HERE)
    answer = json.loads(r.stdout)
    checks = {c["check"]: c for c in answer["checks"]}
    assert checks["sm"]["status"] == "PASS" and checks["sm"]["evidence"].startswith(
        "SM LID 1: spine01, MASTER, priority 0"
    )
    assert checks["cable"]["status"] == "PASS"
    assert checks["cable"]["evidence"].startswith("ibsim0/1 <-> leaf01/1: 4X SDR ACTIVE")
    assert (checks["peer_cable"]["evidence"], checks["lid_route"]["evidence"]) == (
        "no peer given", "no peer given"
    )  # fmt: skip
    fabric = answer["fabric"]
    assert (fabric["sm_lid"], fabric["sm"]["state"], fabric["route"]) == (1, "MASTER", None)
    assert fabric["cable"]["far"]["node"] == "leaf01" and fabric["peer_cable"] is None
    names = [c["check"] for c in answer["checks"]]
    assert names[names.index("rate") + 1 : names.index("gid")] == [
        "sm", "cable", "peer_cable", "lid_route"
    ]  # fmt: skip


def test_the_sm_killed_is_a_failed_sm_check_with_its_fix(tmp_path):
    need_the_simulator()
    with SimFabric(SMALL, tmp_path) as sim:
        sim.stop_sm()
        r = ibtool(sim, "doctor", "--no-probe", host=HERE)
        lines = r.stdout.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("FAIL  sm "))
        assert lines[at] == (
            "FAIL  sm         ibsim0/1's SM LID is 1, and nothing there answers for its "
            "SMInfo: the subnet manager has stopped or hangs"
        )
        assert lines[at + 1].split() == ["fix:", "start", "or", "restart", "the", "SM", "behind",
                                         "LID", "1", "(smpquery", "nodedesc", "1", "names",
                                         "its", "node);", "a", "standby", "takes", "over",
                                         "only", "once", "it", "sees", "the", "master",
                                         "gone"]  # fmt: skip
        assert r.returncode == 2
        # the cable is still judged: the links stay up without an SM
        assert any(line.startswith("PASS  cable      ibsim0/1 <-> leaf01/1") for line in lines)


def test_no_sm_ever_leaves_the_port_in_init_and_the_sm_check_says_so(tmp_path):
    need_the_simulator()
    with SimFabric(SMALL, tmp_path, sm=False) as sim:
        r = ibtool(sim, "doctor", "--no-probe", host=HERE)
        lines = r.stdout.splitlines()
        at = lines.index(
            "FAIL  sm         ibsim0/1 is INIT: its link is up and no subnet manager has "
            "brought it further"
        )
        assert lines[at + 1].split()[:6] == ["fix:", "start", "a", "subnet", "manager", "on"]
        cable = next(line for line in lines if line.startswith("FAIL  cable "))
        assert "4X SDR INIT; not ACTIVE" in cable
        assert r.returncode == 2

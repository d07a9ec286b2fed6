"""`ibtool health`'s fabric check on a simulated fabric, run on one node at a time (SIM_HOST):
the far end of that node's cable, its error counters' growth between two runs, the link's
width against what both ends enable, and the subnet manager."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.fabric.conftest import SMALL, need_the_simulator
from tests.fabric.ibsim import SimFabric
from tests.fabric.test_fabric import ibtool, said

# tests.fabric.ibsim.fat_tree: node00N sits on leaf01/N (N = 1..3), node00(3+N) on leaf02/N
NODES = [f"node{i:03d} mlx5_0" for i in range(1, 7)]


def health(fabric, host, *argv):
    r = ibtool(fabric, "-j", "health", "--check", "fabric", *argv, host=host)
    assert r.returncode in (0, 1, 2, 3), r.stderr
    assert said(r) == [], r.stderr
    return r.returncode, json.loads(r.stdout)


def not_ok(answer) -> list[tuple[str, str, str]]:
    return [(r["status"], r["subject"], r["summary"]) for r in answer["results"]
            if r["status"] != "OK"]  # fmt: skip


def test_a_fault_at_the_switch_end_is_named_by_that_node_only(counted, tmp_path):
    states = {n: tmp_path / f"{n.split()[0]}.json" for n in NODES}
    for n in NODES:  # the baseline
        code, answer = health(counted, n, "--state", str(states[n]))
        assert code == 0, answer
        cable, sm = answer["results"]
        assert cable["summary"].endswith("4X SDR, first run: baseline taken")
        assert sm["summary"].startswith("subnet manager spine01 (LID 1): master")
    counted.console('PerformanceSet "leaf02"[2] PortCounters.SymbolErrorCounter=500')
    counted.console('PerformanceSet "leaf02"[2] PortCounters.LinkDownedCounter=1')
    try:
        found = {n: health(counted, n, "--state", str(states[n])) for n in NODES}
    finally:
        counted.console('PerformanceSet "leaf02"[2] PortCounters.SymbolErrorCounter=0')
        counted.console('PerformanceSet "leaf02"[2] PortCounters.LinkDownedCounter=0')
    named = {n: not_ok(a) for n, (_, a) in found.items() if not_ok(a)}
    assert list(named) == ["node005 mlx5_0"]  # leaf02/2's node, and no other
    assert found["node005 mlx5_0"][0] == 1  # WARNING
    assert sorted(named["node005 mlx5_0"]) == [
        ("WARNING", "ibsim0/1", "cable to leaf02/2: SymbolErrorCounter +500 since the last run "
                                "(warning 10)"),
        ("WARNING", "ibsim0/1", "cable to leaf02/2: link went down once since the last run "
                                "(flap)"),
    ]  # fmt: skip
    # the next run: cleared on the switch, a new baseline and no alarm
    code, answer = health(counted, "node005 mlx5_0", "--state", str(states["node005 mlx5_0"]))
    assert code == 0
    assert (
        "SymbolErrorCounter reset since the last run: new baseline"
        in (answer["results"][0]["summary"])
    )


def test_a_switch_end_enabled_narrow_is_named_and_a_cable_at_1x_on_both_is_not(narrow):
    # leaf01/2 enables only 1X, node002's end 1X and 4X; leaf01/1 and node001 both only 1X
    code, answer = health(narrow, "node002 mlx5_0", "--no-state")
    assert code == 1
    assert not_ok(answer) == [(
        "WARNING", "ibsim0/1",
        "cable to leaf01/2: leaf01/2 enables at most 1X; it supports 4X and ibsim0/1 enables it; "
        "enable 4X on leaf01/2 (ibportstate's width, or the SM's or firmware's setting for that "
        "port), then retrain it",
    )]  # fmt: skip
    code, answer = health(narrow, "node001 mlx5_0", "--no-state")
    assert code == 0, answer
    assert answer["results"][0]["summary"] == (
        "cable to leaf01/1: 1X SDR, no state kept: error counters not compared"
    )


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A small tree of this module's own: its SM is stopped and started again."""
    need_the_simulator()
    with SimFabric(SMALL, tmp_path_factory.mktemp("health")) as fabric:
        yield fabric


def test_the_sm_gone_is_critical_and_its_return_is_ok(own, tmp_path):
    state = str(tmp_path / "state.json")
    code, answer = health(own, "node004 mlx5_0", "--state", state)
    assert code == 0
    own.stop_sm()
    try:
        code, answer = health(own, "node004 mlx5_0", "--state", state, "--config", "/dev/null")
        assert code == 2  # CRITICAL
        assert not_ok(answer) == [(
            "CRITICAL", "ibsim0/1", "the subnet manager at LID 1 does not answer; check the SM "
            "(systemctl status opensm on its node; ibtool fabric sm)",
        )]  # fmt: skip
        # the cable itself is fine: its far end still answers, by directed route
        assert answer["results"][0]["status"] == "OK"
    finally:
        own.start_sm()
    code, answer = health(own, "node004 mlx5_0", "--state", state)
    assert code == 0
    assert answer["results"][1]["summary"].startswith("subnet manager spine01 (LID 1): master")


def test_a_bad_option_of_its_table_is_unknown_naming_it(own, tmp_path):
    config = tmp_path / "health.toml"
    config.write_text("[checks.fabric]\ntimeout = 0\n")
    code, answer = health(own, "node001 mlx5_0", "--no-state", "--config", str(config))
    assert code == 3
    assert not_ok(answer) == [
        ("UNKNOWN", "", "far ends not checked: [checks.fabric] timeout must be a number from 1 "
                        "to 60000"),
    ]  # fmt: skip
    config.write_text("[checks.fabric]\nsm = false\nsm_idle = 60\n")
    code, answer = health(own, "node001 mlx5_0", "--no-state", "--config", str(config))
    assert code == 0 and len(answer["results"]) == 1  # the cable, no SM


def test_its_verdict_in_the_textfile_and_nagios(narrow, tmp_path):
    prom = tmp_path / "ibtool.prom"
    r = ibtool(narrow, "health", "--check", "fabric", "--no-state", "--textfile", str(prom),
               host="node002 mlx5_0")  # fmt: skip
    assert r.returncode == 1
    assert r.stdout.startswith("IBTOOL WARNING - ibsim0/1: cable to leaf01/2: leaf01/2 enables")
    text = prom.read_text()
    assert 'ibtool_health_subject_status{check="fabric",subject="ibsim0/1"} 1.0' in text
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                               capture_output=True)  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr

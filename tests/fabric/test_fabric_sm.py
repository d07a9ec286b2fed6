"""`ibtool fabric sm` on simulated fabrics, SM for SM against sminfo: one master, a standby
beside it, the master killed. Each test has a fabric of its own: they start and stop SMs."""

from __future__ import annotations

import json
import re

import pytest

from tests.fabric.conftest import SMALL, need_the_simulator
from tests.fabric.ibsim import SimFabric
from tests.fabric.test_fabric import ibtool, said

# sminfo: "sminfo: sm lid 1 sm guid 0x200000, activity count 312 priority 0 state 3 SMINFO_MASTER"
SMINFO = re.compile(
    r"sm lid (\d+) sm guid 0x([0-9a-f]+), activity count (\d+) priority (\d+) state (\d+)"
)
STATES = {0: "NOT_ACTIVE", 1: "DISCOVERING", 2: "STANDBY", 3: "MASTER"}


@pytest.fixture
def fabric(tmp_path):
    need_the_simulator()
    with SimFabric(SMALL, tmp_path) as sim:
        yield sim


def sminfo(sim, lid: int | None = None) -> dict:
    r = sim.run(["sminfo"] + ([str(lid)] if lid else []), host="node003 mlx5_0")
    assert r.returncode == 0, r.stderr
    lid_, guid, activity, priority, state = SMINFO.search(r.stdout).groups()
    return {"lid": int(lid_), "guid": int(guid, 16), "activity": int(activity),
            "priority": int(priority), "state": STATES[int(state)]}  # fmt: skip


def ours(sim, *argv) -> tuple[int, dict]:
    r = ibtool(sim, "-j", "fabric", "sm", *argv, host="node003 mlx5_0")
    assert r.returncode in (0, 1, 2), r.stderr
    return r.returncode, json.loads(r.stdout)


def same(sm: dict, theirs: dict, read_before: bool = True) -> None:
    assert (sm["lid"], int(sm["guid"], 16), sm["priority"], sm["state"]) == (
        theirs["lid"], theirs["guid"], theirs["priority"], theirs["state"]
    )  # fmt: skip
    if read_before:  # ours was read first: theirs has moved as far or further
        assert sm["activity"] <= theirs["activity"]


def test_one_master_answering_and_active_is_sminfos(fabric):
    code, answer = ours(fabric)
    assert code == 0 and answer["status"] == "OK" and answer["findings"] == []
    (sm,) = answer["sms"]
    same(sm, sminfo(fabric))
    assert (sm["node"], sm["port"]) == ("spine01", 0)  # the net file's first node runs it
    assert answer["local_sm_lid"] == sm["lid"]
    assert answer["activity"]["moved"] > 0


def test_a_standby_beside_the_master_is_listed_as_sminfo_sees_it(fabric):
    # spine02's GUID is above spine01's: at equal priority the master stays where it is
    fabric.start_sm(priority=0, host="spine02", until=b"STANDBY")
    code, answer = ours(fabric)
    assert code == 0, answer["findings"]
    master, standby = answer["sms"]
    same(master, sminfo(fabric))
    same(standby, sminfo(fabric, standby["lid"]))
    assert (master["state"], standby["state"], standby["node"]) == ("MASTER", "STANDBY", "spine02")


def test_the_master_killed_is_no_master_critical_and_its_port_named(fabric):
    fabric.stop_sm()
    r = ibtool(fabric, "fabric", "sm", "--wait", "1", host="node003 mlx5_0")
    assert r.returncode == 2  # Nagios' CRITICAL
    lines = r.stdout.splitlines()
    assert "CRITICAL no master subnet manager (1 SM port seen, 0 answering)" in lines
    assert (
        "WARNING spine01/0 (LID 1) says an SM runs behind it, and its SMInfo did not answer"
    ) in lines
    assert said(r) == []  # what did not answer is in the answer, not libibmad's noise


def test_wait_0_leaves_the_activity_unread(fabric):
    code, answer = ours(fabric, "--wait", "0")
    assert code == 0 and answer["activity"] is None


def test_wait_is_for_sm_only(fabric):
    r = ibtool(fabric, "fabric", "links", "--wait", "1")
    assert r.returncode == 2 and "--wait is for ibtool fabric sm" in r.stderr

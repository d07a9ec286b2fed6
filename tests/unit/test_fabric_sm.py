"""`ibtool fabric sm`'s verdicts on records: what a simulated fabric cannot be made to show (a
master alive but idle, two masters, a standby that outranks the master, a port whose SM LID
names the old master). The answers against sminfo on ibsim are in tests/fabric."""

from __future__ import annotations

from ibtool.model.fabric import FabricNode, NodeType, SmState, SubnetManager, judge_sms
from ibtool.model.health import Status

SPINE = FabricNode(0x200000, NodeType.SWITCH, "spine01", 36, {})
HOST = FabricNode(0x100000, NodeType.CA, "node001 mlx5_0", 1, {})


def sm(node, lid, state, priority=0, port=0):
    return SubnetManager(node, port, lid, node.guid, priority, state, 1000)


def kinds(found):
    return [(f.status, f.kind) for f in found]


def test_one_master_moving_and_named_by_this_port_is_all_right():
    assert judge_sms([sm(SPINE, 1, SmState.MASTER)], [], 1, 12, 0.1) == []


def test_no_master_is_critical():
    found = judge_sms([sm(SPINE, 1, SmState.STANDBY)], [], 1, None, 0.0)
    assert kinds(found) == [(Status.CRITICAL, "no_master")]
    assert found[0].what == "no master subnet manager (1 SM port seen, 1 answering)"


def test_two_masters_are_critical_and_both_named():
    (f,) = judge_sms([sm(SPINE, 1, SmState.MASTER), sm(HOST, 7, SmState.MASTER, port=1)],
                     [], 1, None, 0.0)  # fmt: skip
    assert (f.status, f.kind) == (Status.CRITICAL, "two_masters")
    assert f.what == "2 masters: spine01/0 (LID 1), node001 mlx5_0/1 (LID 7)"


def test_a_master_whose_activity_does_not_move_is_critical():
    (f,) = judge_sms([sm(SPINE, 1, SmState.MASTER)], [], 1, 0, 10.0)
    assert (f.status, f.kind) == (Status.CRITICAL, "master_idle")
    assert f.what == "the master spine01/0 (LID 1) kept its activity count at 1000 for 10 s"


def test_a_port_whose_sm_lid_is_not_the_masters():
    (f,) = judge_sms([sm(SPINE, 1, SmState.MASTER)], [], 9, 5, 0.1)
    assert (f.status, f.kind) == (Status.CRITICAL, "sm_lid_wrong")


def test_a_standby_of_higher_priority_than_the_master_is_a_warning():
    found = judge_sms(
        [sm(SPINE, 1, SmState.MASTER, 3), sm(HOST, 7, SmState.STANDBY, 14, port=1)], [], 1, 5, 0.1
    )
    assert kinds(found) == [(Status.WARNING, "standby_outranks")]


def test_an_sm_port_that_does_not_answer_is_named():
    found = judge_sms([sm(SPINE, 1, SmState.MASTER)], [(HOST, 1, 7)], 1, 5, 0.1)
    assert kinds(found) == [(Status.WARNING, "sm_silent")]
    assert found[0].what.startswith("node001 mlx5_0/1 (LID 7) says an SM runs behind it")

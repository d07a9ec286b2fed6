"""--slurm-drain: ibtool drains the node when CRITICAL and resumes only its own drain, through a
scontrol that answers as Slurm 22.05 does."""

from __future__ import annotations

import subprocess

import pytest

from ibtool.errors import IbtoolError, UnsupportedError
from ibtool.health import slurm
from tests.fixtures import slurm_nodes


class Scontrol:
    """scontrol(1): `show node` answers with the node's line, `update` is recorded."""

    def __init__(self, line: str, *, returncode: int = 0, stderr: str = ""):
        self.line, self.returncode, self.stderr = line, returncode, stderr
        self.updates: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess:
        assert argv[0] == "scontrol"
        if argv[1] == "update":
            self.updates.append(argv[2:])
        out = self.line + "\n" if argv[1] == "show" else ""
        return subprocess.CompletedProcess(argv, self.returncode, out, self.stderr)


def test_the_states_and_reasons_slurm_prints():
    idle = slurm.parse_node(slurm_nodes.IDLE)
    assert idle == slurm.NodeState(frozenset({"IDLE", "NOT_RESPONDING"}), None)
    ours = slurm.parse_node(slurm_nodes.DRAINED_BY_IBTOOL)
    assert ours.drained and ours.ours and ours.reason == "ibtool: rxe0/1: state DOWN"
    admin = slurm.parse_node(slurm_nodes.DRAINED_BY_ADMIN)
    assert admin.flags == {"IDLE", "DRAIN", "NOT_RESPONDING"}
    assert admin.reason == "disk replacement, ticket=42 Foo=bar" and not admin.ours


def test_critical_drains_with_the_summary_as_reason():
    scontrol = Scontrol(slurm_nodes.IDLE)
    done = slurm.apply(True, "rxe0/1: state DOWN", "vm", scontrol)
    assert done == "slurm: drained node vm: ibtool: rxe0/1: state DOWN"
    assert scontrol.updates == [["NodeName=vm", "State=DRAIN", "Reason=ibtool: rxe0/1: state DOWN"]]


def test_the_same_drain_is_not_done_twice():
    scontrol = Scontrol(slurm_nodes.DRAINED_BY_IBTOOL)
    assert slurm.apply(True, "rxe0/1: state DOWN", "vm", scontrol) is None
    assert scontrol.updates == []


def test_a_new_problem_replaces_ibtools_own_reason():
    scontrol = Scontrol(slurm_nodes.DRAINED_BY_IBTOOL)
    slurm.apply(True, "rxe1/1: state DOWN", "vm", scontrol)
    assert scontrol.updates[0][-1] == "Reason=ibtool: rxe1/1: state DOWN"


def test_an_administrators_drain_is_left_alone_either_way():
    scontrol = Scontrol(slurm_nodes.DRAINED_BY_ADMIN)
    assert slurm.apply(True, "rxe0/1: state DOWN", "vm", scontrol) == (
        "slurm: node vm drained by someone else (disk replacement, ticket=42 Foo=bar): left alone"
    )
    assert slurm.apply(False, "all OK", "vm", scontrol) is None
    assert scontrol.updates == []


def test_healthy_again_resumes_only_ibtools_drain():
    scontrol = Scontrol(slurm_nodes.DRAINED_BY_IBTOOL)
    assert slurm.apply(False, "all OK", "vm", scontrol) == (
        "slurm: resumed node vm, which ibtool had drained for: rxe0/1: state DOWN"
    )
    assert scontrol.updates == [["NodeName=vm", "State=RESUME"]]
    idle = Scontrol(slurm_nodes.IDLE)
    assert slurm.apply(False, "all OK", "vm", idle) is None and idle.updates == []


def test_a_long_summary_is_cut_to_a_reason_slurm_keeps_whole():
    scontrol = Scontrol(slurm_nodes.IDLE)
    slurm.apply(True, "x" * 300 + "\nsecond line", "vm", scontrol)
    reason = scontrol.updates[0][-1][len("Reason=") :]
    assert len(reason) == slurm.REASON_MAX and reason.endswith("...")


def test_without_scontrol_one_error_saying_what_to_do():
    def missing(argv):
        raise FileNotFoundError(2, "No such file or directory", "scontrol")

    with pytest.raises(UnsupportedError, match="needs scontrol") as e:
        slurm.apply(True, "x", "vm", missing)
    assert "drop --slurm-drain" in e.value.hint


def test_a_failing_scontrol_is_its_first_line():
    scontrol = Scontrol(
        "",
        returncode=1,
        stderr="slurm_load_node error: Unable to contact slurm controller (connect failure)\n",
    )
    with pytest.raises(IbtoolError, match=r"^scontrol: slurm_load_node error: Unable to contact"):
        slurm.apply(False, "all OK", "vm", scontrol)


def test_the_node_name_is_slurmds_or_the_short_host_name():
    assert slurm.node_name({"SLURMD_NODENAME": "n042"}) == "n042"
    import socket

    assert slurm.node_name({}) == socket.gethostname().split(".")[0]

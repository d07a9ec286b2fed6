"""`ibtool health --slurm-drain` as Slurm's HealthCheckProgram on a real one-node cluster: the
node drained with the reason when rxe0's link goes down, resumed when it is back; an
administrator's drain left alone."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tests.integration import faults
from tests.integration.slurm import reason_of, slurm_node, state_of

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def program(tmp_path_factory, testbed) -> str:
    """The HealthCheckProgram (slurmd runs it without arguments): ibtool health on the ports."""
    tmp_path = tmp_path_factory.mktemp("slurm")
    path = tmp_path / "ibtool-health-slurm"
    pythonpath = os.environ.get("PYTHONPATH", "")
    path.write_text(
        "#!/bin/sh\n"
        f"cd {REPO} && PYTHONPATH={pythonpath} exec {sys.executable} -m ibtool health "
        f"--slurm-drain --check port --state {tmp_path}/health.json >/dev/null 2>&1\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture(scope="module")
def node(program) -> str:
    """One Slurm for the module (it takes a while to start under emulation), running the
    health check every 5 s."""
    with slurm_node(program, interval=5) as name:
        yield name


def test_a_down_link_drains_the_node_and_its_return_resumes_it(node, testbed):
    assert "DRAIN" not in state_of(node)
    with faults.link_down(testbed):
        faults.wait_for(
            lambda: "DRAIN" in state_of(node), f"{node} drained by the health check", 300
        )
        reason = reason_of(node)
        assert reason.startswith(f"ibtool: {testbed['device']}/1: state DOWN"), reason
    faults.wait_for(lambda: "DRAIN" not in state_of(node), f"{node} resumed", 300)


def port_seen(program: str, device: str) -> str | None:
    """The state of DEVICE/1 the health check saw at its last run (its state file)."""
    state = Path(program).with_name("health.json")
    try:
        return json.loads(state.read_text())["checks"]["port"]["data"]["ports"][f"{device}/1"][
            "state"
        ]
    except (OSError, ValueError, KeyError):
        return None


def test_an_administrators_drain_is_left_alone(node, program, testbed):
    device = testbed["device"]
    faults.sh("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=new cable")
    try:
        with faults.link_down(testbed):
            faults.wait_for(lambda: port_seen(program, device) == "DOWN", "a CRITICAL run", 300)
            assert reason_of(node) == "new cable"
        faults.wait_for(lambda: port_seen(program, device) == "ACTIVE", "an OK run", 300)
        assert "DRAIN" in state_of(node) and reason_of(node) == "new cable"
    finally:
        faults.sh("scontrol", "update", f"NodeName={node}", "State=RESUME")

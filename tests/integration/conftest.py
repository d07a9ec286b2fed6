"""Integration tests run inside the SoftRoCE testbed VM (IBTOOL_TESTBED=1), nowhere else.

Outside it they skip with the reason; under CI=true a skipped integration test is a failure,
so CI cannot go green without the kernel checks. The fault fixtures change the guest's
network and RDMA state and always restore it.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

IN_TESTBED = os.environ.get("IBTOOL_TESTBED") == "1"


def pytest_runtest_setup(item):
    if item.get_closest_marker("integration") and not IN_TESTBED:
        reason = "needs the SoftRoCE testbed VM: run `make integration`"
        if os.environ.get("CI") == "true":
            pytest.fail(f"integration test outside the testbed under CI: {reason}")
        pytest.skip(reason)


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.fixture(scope="session")
def testbed() -> dict[str, str]:
    """The guest topology, as tests/testbed/guest.sh exported it."""
    return {
        k[len("IBTOOL_TB_") :].lower(): v
        for k, v in os.environ.items()
        if k.startswith("IBTOOL_TB_")
    }


def port_state(device: str = "rxe0", port: int = 1) -> str:
    try:
        with open(f"/sys/class/infiniband/{device}/ports/{port}/state") as f:
            return f.read().split(":", 1)[1].strip()
    except OSError:
        return "ABSENT"


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(name="wait_for")
def wait_for_fixture():
    return wait_for


@pytest.fixture
def link_down(testbed):
    """The rxe port's netdev taken down (port DOWN), brought back up afterwards."""
    netdev = testbed["netdev"]
    sh("ip", "link", "set", netdev, "down")
    try:
        wait_for(lambda: port_state() == "DOWN", "rxe0/1 DOWN")
        yield netdev
    finally:
        sh("ip", "link", "set", netdev, "up")
        wait_for(lambda: port_state() == "ACTIVE", "rxe0/1 ACTIVE again")


@pytest.fixture
def netem(testbed):
    """Packet loss and delay on the rxe netdev: call it with a netem spec."""
    netdev = testbed["netdev"]
    added = []

    def apply(spec: str = "loss 10% delay 1ms") -> None:
        sh("tc", "qdisc", "replace", "dev", netdev, "root", "netem", *spec.split())
        added.append(spec)

    try:
        yield apply
    finally:
        if added:
            sh("tc", "qdisc", "del", "dev", netdev, "root")


def _recreate_rxe(testbed) -> None:
    if port_state(testbed["device"]) == "ABSENT":
        sh("rdma", "link", "add", testbed["device"], "type", "rxe", "netdev", testbed["netdev"])
    wait_for(lambda: port_state(testbed["device"]) == "ACTIVE", "rxe0/1 ACTIVE again")


@pytest.fixture
def rxe_deleted(testbed):
    """rxe0 deleted with `rdma link delete`, recreated afterwards."""
    sh("rdma", "link", "delete", testbed["device"])
    try:
        yield testbed["device"]
    finally:
        _recreate_rxe(testbed)


@pytest.fixture
def rxe_unloaded(testbed):
    """The rdma_rxe module unloaded (every rxe device gone), reloaded and rxe0 recreated."""
    sh("rdma", "link", "delete", testbed["device"])
    sh("modprobe", "-r", "rdma_rxe")
    try:
        yield
    finally:
        sh("modprobe", "rdma_rxe")
        _recreate_rxe(testbed)

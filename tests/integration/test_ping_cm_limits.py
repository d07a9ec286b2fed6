"""`ibtool ping --server --cm`'s limits on a real kernel: the source of each connection request
read from the kernel's rdma_cm ids (RDMA netlink), a source outside --allow and one over
--max-rate rejected with their reason, and nothing built for either."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.integration.test_ping import user_objects

pytestmark = pytest.mark.integration
PORT = 18631


def test_the_cm_server_refuses_a_source_outside_allow_and_one_over_max_rate(testbed, running):
    # On the testbed a client's source address follows its route (table 77): an ibtool
    # client to ipv4 comes from peer_ipv4, and rping -I picks ipv4 itself.
    addr, allowed = testbed["ipv4"], testbed["peer_ipv4"]
    server = running(
        "ping", "--server", "--cm", "--bind", addr, "--port", str(PORT),
        "--allow", f"{allowed}/32", "--max-rate", "0.01",
    )  # fmt: skip
    server.wait_for_lines(lambda lines: lines, timeout=90)

    def ping() -> subprocess.CompletedProcess:
        argv = ["ping", "--cm", addr, "--port", str(PORT), "-c", "2", "-i", "0"]
        return subprocess.run(
            [sys.executable, "-m", "ibtool", *argv], capture_output=True, text=True, timeout=180
        )

    served = ping()  # the one token of its burst
    assert served.returncode == 0, served.stderr
    over = ping()  # the next one in 100 s
    assert (over.returncode, over.stderr) == (
        1,
        f"ibtool: error: the ping server at {addr}:{PORT} refused this client: connection over "
        "--max-rate 0.01/s\n",
    )
    outside = subprocess.run(
        ["rping", "-c", "-I", addr, "-a", addr, "-p", str(PORT), "-C", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = outside.stdout + outside.stderr
    assert outside.returncode != 0 and "RDMA_CM_EVENT_REJECTED" in said, outside
    lines = server.wait_for_lines(lambda lines: len(lines) >= 5, timeout=60)
    assert [line.rstrip("\n") for line in lines[1:]] == [
        f"client 1 connected on {testbed['device']}/1: mode send size 64, mtu 1024, sl 0, tclass 0",
        "client 1 done: 2 pings answered",
        f"refused {allowed}: connection over --max-rate 0.01/s",
        f"refused {addr}: connection not in --allow",
    ]
    # Nothing of the refused requests: the listener's id is the server's only rdma_cm id.
    assert not user_objects("qp")
    assert [c["pid"] for c in user_objects("cm_id")] == [server.proc.pid]
    rc, out, err = server.finish(signal.SIGINT, timeout=60)
    assert (rc, err) == (130, "ibtool: interrupted\n"), out

"""`ibtool ping --compat rping` against librdmacm's own rping (rdmacm-utils), both ways, over
rdma_cm on the testbed's rxe devices: the counts and sizes each side sees, a Ctrl-C of the ibtool
side, and no QP or rdma_cm id left behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from tests.integration.running import Running
from tests.integration.test_ping import roce_v2_packets, user_objects

pytestmark = pytest.mark.integration


def nothing_left() -> bool:
    return not user_objects("qp") and not user_objects("cm_id")


def rping_listening(pid: int) -> bool:
    """Whether process `pid` has a listening rdma_cm id (`rdma res show cm_id`)."""
    out = subprocess.run(
        ["rdma", "-j", "res", "show", "cm_id"], capture_output=True, text=True, check=True
    ).stdout
    return any(c.get("pid") == pid and "LISTEN" in json.dumps(c) for c in json.loads(out or "[]"))


@pytest.fixture
def stock_rping(wait_for):
    """Start librdmacm's rping with these arguments; a server (-s) is waited for until it
    listens. Whatever still runs at the end is killed."""
    started: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen(["rping", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        started.append(proc)
        if "-s" in args:
            wait_for(lambda: proc.poll() is None and rping_listening(proc.pid), "rping -s", 60)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def ibtool_server(running, addr: str, *extra: str) -> Running:
    server = running("ping", "--server", "--compat", "rping", "--bind", addr, *extra)
    server.wait_for_lines(lambda lines: lines, timeout=90)
    return server


def test_ibtool_client_against_rping_server(testbed, stock_rping, wait_for):
    addr = testbed["ipv4"]
    server = stock_rping("-s", "-a", addr, "-C", "5", "-S", "100", "-v")
    proc = subprocess.run(
        [sys.executable, "-m", "ibtool", "-j", "ping", "--compat", "rping", addr]
        + ["-c", "5", "-i", "0", "-s", "100"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["sent"], report["received"]) == (5, 5)
    assert [r["seq"] for r in report["replies"]] == [1, 2, 3, 4, 5]
    assert report["rtt_us"]["min"] > 0
    out, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    pings = re.findall(rb"^server ping data: (rdma-ping-(\d+): .*)$", out, re.M)
    assert [int(n) for _, n in pings] == [0, 1, 2, 3, 4]
    assert all(len(data) == 99 for data, _ in pings)  # 100 bytes, the last one NUL
    wait_for(nothing_left, "no QP or rdma_cm id of either side")


def test_rping_client_with_verification_against_ibtool_server(testbed, running, wait_for):
    addr = testbed["ipv4"]
    server = ibtool_server(running, addr, "--port", "7175", "--max-clients", "1")
    assert server.lines[0].startswith(f"listening on {addr}:7175 (rdma_cm, rping), ")
    client = subprocess.run(
        ["rping", "-c", "-a", addr, "-p", "7175", "-C", "6", "-S", "200", "-V", "-v"],
        capture_output=True,
        timeout=180,
    )
    assert client.returncode == 0, client.stderr  # -V: "data mismatch!" would be an exit 255
    pings = re.findall(rb"^ping data: (rdma-ping-(\d+): .*)$", client.stdout, re.M)
    assert [int(n) for _, n in pings] == [0, 1, 2, 3, 4, 5]
    assert all(len(data) == 199 for data, _ in pings)
    rc, out, err = server.finish(timeout=60)
    assert (rc, err) == (0, ""), out
    assert out.splitlines()[1:] == [
        f"client 1 connected on {testbed['device']}/1",
        "client 1 done: 6 pings answered",
    ]
    wait_for(nothing_left, "no QP or rdma_cm id of either side")


def test_sigint_to_ibtool_server_mid_run(testbed, running, stock_rping, wait_for):
    addr = testbed["ipv4"]
    server = ibtool_server(running, addr, "--port", "7176")
    client = stock_rping("-c", "-a", addr, "-p", "7176", "-C", "0", "-V")  # -C 0: forever
    server.wait_for_lines(lambda lines: any(" connected on " in line for line in lines), 90)
    rc, out, err = server.finish(signal.SIGINT, timeout=120)
    assert (rc, err) == (130, "ibtool: interrupted\n"), out
    assert out.splitlines()[-1] == "server stopped"
    client.wait(60)  # the server's disconnect ends it
    wait_for(nothing_left, "no QP or rdma_cm id of either side")


def test_sigint_to_ibtool_client_mid_run_prints_the_statistics(
    testbed, running, stock_rping, wait_for
):
    addr = testbed["ipv4"]
    server = stock_rping("-s", "-a", addr, "-p", "7177")
    client = running("ping", "--compat", "rping", addr, "--port", "7177", "-i", "0.2")
    client.wait_for_lines(lambda lines: sum(" bytes from " in line for line in lines) >= 3, 120)
    rc, out, err = client.finish(signal.SIGINT)
    assert (rc, err) == (0, ""), out  # Ctrl-C after replies: 0, as ping(8)
    lines = out.splitlines()
    assert lines[0].startswith(f"PING {addr}:7177 over rdma_cm (")
    assert lines[-3] == f"--- {addr} ibtool ping statistics ---", out
    m = re.fullmatch(r"(\d+) sent, (\d+) received, \d+% loss, time \d+ ms", lines[-2])
    assert m and int(m[2]) >= 3 and int(m[1]) - int(m[2]) in (0, 1)  # one may be in flight
    assert server.wait(60) == 0  # our disconnect is rping's normal end
    wait_for(nothing_left, "no QP or rdma_cm id of either side")


def test_no_rping_server_is_one_line_and_exit_1(testbed, wait_for):
    proc = subprocess.run(
        [sys.executable, "-m", "ibtool", "ping", "--compat", "rping", testbed["ipv4"]]
        + ["--port", "7178", "-c", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith(
        f"ibtool: error: connect: {testbed['ipv4']}:7178 rejected the connection "
        "(RDMA_CM_EVENT_REJECTED) (hint: is an rping server listening at "
    )
    assert proc.stderr.count("\n") == 1
    wait_for(nothing_left, "no QP or rdma_cm id of the client")


def test_a_ping_larger_than_the_rping_servers_buffer_says_to_raise_its_size(
    testbed, stock_rping, wait_for
):
    addr = testbed["ipv4"]
    server = stock_rping("-s", "-a", addr, "-p", "7179")  # its -S: the default 64
    proc = subprocess.run(
        [sys.executable, "-m", "ibtool", "ping", "--compat", "rping", addr]
        + ["--port", "7179", "-c", "1", "-s", "1000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr == (
        f"ibtool: error: the rping server at {addr}:7179 disconnected (hint: a stock `rping -s` "
        "serves one client, then exits; it also gives up on a ping larger than its -S: give it "
        "-S 1000)\n"
    )
    assert server.wait(60) != 0  # rping.c: "cq completion failed status 4" (LOC_PROT_ERR)
    wait_for(nothing_left, "no QP or rdma_cm id of either side")


@contextlib.contextmanager
def default_roce_tos(device: str, port: int, tos: int):
    """rdma_cm's default TOS for the RoCE port (configfs, drivers/infiniband/core/
    cma_configfs.c): the device's directory made, the TOS written, and both undone after."""
    config = "/sys/kernel/config"
    if not os.path.isdir(f"{config}/rdma_cm"):
        subprocess.run(["modprobe", "configfs"], check=False)
        if not os.path.ismount(config):
            subprocess.run(["mount", "-t", "configfs", "configfs", config], check=True)
    made = f"{config}/rdma_cm/{device}"
    os.mkdir(made)
    knob = f"{made}/ports/{port}/default_roce_tos"
    try:
        with open(knob, "w") as f:
            f.write(str(tos))
        yield
    finally:
        with open(knob, "w") as f:
            f.write("0")
        os.rmdir(made)


def test_the_tos_that_the_tclass_refusal_points_to_is_the_connections_and_reported(
    testbed, stock_rping, wait_for
):
    # `--compat rping --tclass` is refused (pyverbs cannot set an rdma_cm id's TOS) with a
    # hint to rdma_cm's configfs default: that default set on rxe0, the client's packets
    # carry it, and the report says the path its QP is on, read back from the QP.
    peer, here = testbed["peer_ipv4"], testbed["ipv4"]
    refused = subprocess.run(
        [sys.executable, "-m", "ibtool", "ping", "--compat", "rping", peer, "--tclass", "104"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "default_roce_tos" in refused.stderr, refused.stderr
    server = stock_rping("-s", "-a", peer, "-C", "3", "-v")
    done, packets = threading.Event(), []
    with default_roce_tos(testbed["device"], 1, 104):
        sniffer = threading.Thread(
            target=lambda: packets.extend(roce_v2_packets(testbed["netdev"], here, done))
        )
        sniffer.start()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "ibtool", "-j", "ping", "--compat", "rping", peer]
                + ["-c", "3", "-i", "0"],
                capture_output=True,
                text=True,
                timeout=180,
            )
        finally:
            done.set()
            sniffer.join(10)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["received"], report["tclass"], report["sl"]) == (3, 104, 0), report
    assert report["mtu"] == 1024  # rxe's on a 1500-byte netdev
    rc = [p for p in packets if p.opcode < 0x20]  # the connection's, not the CM's MADs
    assert rc and {p.tos for p in rc} == {104}, packets
    server.communicate(timeout=60)
    assert server.returncode == 0
    wait_for(nothing_left, "no QP or rdma_cm id of either side")

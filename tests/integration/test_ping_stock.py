"""`ibtool ping --compat rc_pingpong` with rdma-core's own ibv_rc_pingpong on the live rxe0,
both ways: the counts and sizes each side reports, the flags a mismatched peer was started
with named in the error, Ctrl-C, and no QP of ibtool's left behind."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration
PORT = 18615


def ibtool_ping(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ibtool", "ping", "--compat", "rc_pingpong", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def qps_of(pid: int | None) -> list[dict]:
    """The QPs `rdma res` shows for `pid`; None: every user-space QP. The kernel shows a QP
    with the id of the thread that made it (task_pid_vnr): an ibtool server makes a session's
    in the session's thread, so its QPs are found only as every QP."""
    out = subprocess.run(
        ["rdma", "-j", "res", "show", "qp"], capture_output=True, text=True, check=True
    ).stdout
    return [q for q in json.loads(out or "[]") if "pid" in q and pid in (None, q["pid"])]


def listening(port: int) -> bool:
    """Whether a socket listens on TCP `port`, read from /proc/net/tcp{,6}: a connection to
    find out would be the one client ibv_rc_pingpong accepts, and it would exit."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # TCP_LISTEN
                    return True
    return False


def stock_server(testbed, wait_for, *flags: str) -> subprocess.Popen:
    """ibv_rc_pingpong serving one client on rxe0's IPv4 GID, listening before it returns."""
    proc = subprocess.Popen(
        ["ibv_rc_pingpong", "-d", testbed["device"], "-g", "1", "-p", str(PORT), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: listening(PORT) or proc.poll() is not None, "ibv_rc_pingpong to listen")
    assert proc.poll() is None, proc.communicate()
    return proc


def iters(stdout: str) -> int:
    """N of ibv_rc_pingpong's "N iters in S seconds = U usec/iter"."""
    found = re.search(r"^(\d+) iters in [\d.]+ seconds = [\d.]+ usec/iter$", stdout, re.M)
    assert found, stdout
    return int(found.group(1))


def test_ibtool_pings_a_stock_server(testbed, wait_for):
    server = stock_server(testbed, wait_for, "-s", "64", "-n", "20")
    proc = ibtool_ping("127.0.0.1", "--port", str(PORT), "-s", "64", "-c", "20", "-j")
    out, err = server.communicate(timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["sent"], report["received"], report["compat"]) == (20, 20, "rc_pingpong")
    assert report["mtu"] == 1024 and report["rtt_us"]["median"] > 0
    assert server.returncode == 0, err
    assert iters(out) == 20  # and it exited: every ping was one of its iterations


def test_stock_clients_ping_ibtools_server_in_turn(testbed, wait_for):
    server = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "ping", "--server", "--compat", "rc_pingpong",
         "--port", str(PORT), "--max-clients", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: listening(PORT), "the ibtool server to listen", timeout=90)
        for size, n in ((512, 25), (4096, 10)):
            client = subprocess.run(
                ["ibv_rc_pingpong", "-d", testbed["device"], "-g", "1", "-p", str(PORT),
                 "-s", str(size), "-n", str(n), "-c", "127.0.0.1"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert client.returncode == 0, client.stderr
            assert iters(client.stdout) == n
            assert "invalid data" not in client.stdout  # -c: its bytes came back
            if size == 512:  # the server lives on: what it made for this client is gone
                wait_for(lambda: not qps_of(None), "the first client's QP destroyed")
        out, err = server.communicate(timeout=60)
    finally:
        server.kill()
    assert server.returncode == 0, err
    done = [line for line in out.splitlines() if " done: " in line]
    assert [line.split(" done: ")[1] for line in done] == [
        "25 pings of 512 bytes answered",
        "10 pings of 4096 bytes answered",
    ], out


def test_a_stock_server_started_with_another_size_is_named(testbed, wait_for):
    server = stock_server(testbed, wait_for, "-s", "128", "-n", "5")
    try:
        proc = ibtool_ping("127.0.0.1", "--port", str(PORT), "-s", "64", "-c", "5")
    finally:
        server.kill()
        server.communicate()
    assert proc.returncode == 1
    assert "ibv_rc_pingpong answers with 128-byte messages, this ping sends 64" in proc.stderr
    assert "give -s 128 here, or start ibv_rc_pingpong with -s 64" in proc.stderr
    assert "1 sent, 0 received, 100% loss" in proc.stdout


def test_a_stock_server_that_stops_early_names_its_n(testbed, wait_for):
    server = stock_server(testbed, wait_for, "-s", "64", "-n", "5")
    proc = ibtool_ping("127.0.0.1", "--port", str(PORT), "-s", "64", "-c", "8", "-W", "3")
    server.communicate(timeout=60)
    assert proc.returncode == 1
    assert "6 sent, 5 received" in proc.stdout
    assert "ibv_rc_pingpong stopped answering after 5 pings" in proc.stderr
    assert "start it with -n 8" in proc.stderr


def test_ctrl_c_stops_the_client_with_its_summary_and_no_qp(testbed, wait_for):
    server = stock_server(testbed, wait_for, "-s", "64", "-n", "100000")
    client = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "ping", "--compat", "rc_pingpong", "127.0.0.1",
         "--port", str(PORT), "-s", "64", "-i", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: qps_of(client.pid), "the client's QP", timeout=90)
        time.sleep(1)
        client.send_signal(signal.SIGINT)
        out, err = client.communicate(timeout=60)
    finally:
        server.kill()
        server.communicate()
    assert client.returncode == 0, err  # as ping(8): interrupted after replies came back
    assert "--- 127.0.0.1 ibtool ping statistics ---" in out
    assert re.search(r"^\d+ sent, \d+ received", out, re.M), out

"""ibtool ping between processes on the live kernel: replies, a server serving clients in turn,
faults (netem loss, link down and back), garbage peers, and nothing left behind."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration
PORT = 18600


def ibtool(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ibtool", *args], capture_output=True, text=True, timeout=timeout
    )


def user_qps() -> list[dict]:
    out = subprocess.run(
        ["rdma", "-j", "res", "show", "qp"], capture_output=True, text=True, check=True
    ).stdout
    return [q for q in json.loads(out or "[]") if "pid" in q]


def _serve(wait_for, *extra: str):
    proc = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "ping", "--server", "--port", str(PORT), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def listening() -> bool:
        assert proc.poll() is None, proc.stderr.read()
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", PORT)) == 0

    wait_for(listening, "the ping server to listen", timeout=60)
    yield proc
    proc.terminate()
    proc.wait(timeout=30)
    wait_for(lambda: not user_qps(), "the server's QPs to be destroyed")


@pytest.fixture
def server(wait_for):
    """A ping server on rxe0: client and server on one device, traffic never leaves rxe0."""
    yield from _serve(wait_for)


@pytest.fixture
def peer_server(wait_for, testbed):
    """A ping server on the other end of the veth pair: rxe0 -> rxe1 crosses veth0's qdisc."""
    yield from _serve(wait_for, "--dev", testbed["peer_device"])


def ping(*args: str) -> subprocess.CompletedProcess:
    return ibtool("ping", "127.0.0.1", "--port", str(PORT), *args)


@pytest.mark.parametrize("mode", ["send", "write-imm"])
def test_ping_replies_and_summary(server, mode):
    proc = ping("-c", "5", "-i", "0.05", "--mode", mode)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum("bytes from 127.0.0.1: seq=" in line for line in lines) == 5
    assert "5 sent, 5 received, 0% loss" in proc.stdout
    assert lines[-1].startswith("rtt min/avg/median/max/mdev = ") and lines[-1].endswith(" us")


def test_second_client_is_served_by_the_same_server(server):
    for _ in range(2):
        report = json.loads(ping("-j", "-c", "3", "-i", "0").stdout)
        assert (report["sent"], report["received"]) == (3, 3)
        assert report["rtt_us"]["median"] > 0


def test_ping_completes_under_netem_loss(peer_server, netem, testbed):
    netem("loss 10% delay 1ms")
    # Only rxe0's requests and acks cross veth0's qdisc, about 1 or 2 packets per ping: with 20
    # pings netem dropped none about once in ten runs. 100 pings: ~1e-5.
    proc = ping("--dev", testbed["device"], "-j", "-c", "100", "-i", "0", "-W", "10")
    report = json.loads(proc.stdout)
    assert report["received"] == 100, proc.stderr  # RC retransmits what netem drops
    stats = subprocess.run(
        ["tc", "-s", "qdisc", "show", "dev", testbed["netdev"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert int(stats.split("dropped ", 1)[1].split(",", 1)[0]) > 0, "netem dropped nothing"


def test_link_down_is_loss_then_recovery(server, testbed, wait_for):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ibtool",
            "-j",
            "ping",
            "127.0.0.1",
            "--port",
            str(PORT),
            "-c",
            "16",
            "-i",
            "0.5",
            "-W",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: user_qps(), "the client's QP", timeout=60)
    time.sleep(1.5)
    subprocess.run(["ip", "link", "set", testbed["netdev"], "down"], check=True)
    time.sleep(2)
    subprocess.run(["ip", "link", "set", testbed["netdev"], "up"], check=True)
    out, err = proc.communicate(timeout=120)
    report = json.loads(out)
    replies = report["replies"]
    lost = [r["seq"] for r in replies if "error" in r]
    assert lost, "the link was down for 2 s: some pings must be lost"
    assert "rtt_us" in replies[-1], "ping recovers once the link is back"
    assert "lost" in err


def test_garbage_peer_is_dropped_and_the_server_keeps_serving(server):
    with socket.create_connection(("127.0.0.1", PORT), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        s.settimeout(30)
        try:
            reply = s.recv(100)
        except ConnectionResetError:  # closed with our garbage unread: a reset, not a FIN
            reply = b""
        assert reply == b""  # the server dropped us
    with socket.create_connection(("127.0.0.1", PORT), timeout=10):
        pass  # a client that connects and leaves at once
    proc = ping("-c", "2", "-i", "0")
    assert proc.returncode == 0, proc.stderr


def test_no_server_is_a_clear_error():
    proc = ibtool("ping", "127.0.0.1", "--port", str(PORT + 1), "-c", "1", timeout=60)
    assert proc.returncode == 1
    assert "cannot reach the ping server" in proc.stderr and "Traceback" not in proc.stderr

"""A slow peer gets the time it needs within --timeout: doctor asks it first, it reads its facts
while this side reads its own, and this side waits for what is left of --timeout from the
question. The peer here is a socket server in a thread, answering when it is told to or after
a delay of its own; the tests wait on its socket and events, never on a fixed sleep."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ibtool.doctor import run
from ibtool.host import Host
from ibtool.model.doctor import Facts, GidFact
from ibtool.rdma import wire
from tests.fixtures import sysfs_trees
from tests.unit.conftest import run_cli

PEER = Facts(
    hostname="b",
    kernel="6.1.0-28-amd64",
    ibtool="0.1.0",
    device="mlx5_0",
    port=1,
    link_layer="Ethernet",
    state="ACTIVE",
    gid_index=3,
    gids=(
        GidFact(
            3,
            "0000:0000:0000:0000:0000:ffff:c0a8:0a02",
            "RoCE v2",
            "enp3s0f0",
            None,
            "192.168.10.2",
        ),
    ),  # fmt: skip
)


class SlowPeer:
    """An `ibtool ping --server` that takes a doctor query and answers once `go` is set (or
    after `delay` seconds of its own), then holds the connection until the client closes it."""

    def __init__(self, delay: float | None = None, answer: bool = True):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.asked = threading.Event()
        self.go = threading.Event()
        self.done = threading.Event()
        self.delay, self.answer = delay, answer
        self.query: bytes | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with self.listener:
            conn, _ = self.listener.accept()
            with conn:
                self.query = wire.recv_exact(conn, wire.HEADER.size, time.monotonic() + 30)
                self.asked.set()
                if self.delay is not None:
                    self.go.wait(self.delay)  # the peer reading its facts, slowly
                else:
                    self.go.wait(30)
                if self.answer and not self.done.is_set():
                    conn.sendall(wire.encode(wire.MessageType.FACTS, PEER.to_wire()))
                conn.settimeout(30)
                try:
                    conn.recv(1)  # until doctor closes its end
                except OSError:
                    pass

    def close(self) -> None:
        self.done.set()
        self.go.set()
        self.thread.join(30)


@pytest.fixture
def tree(tmp_path):
    return sysfs_trees.build("mlx5_roce", tmp_path / "root")


def diagnose(tree, peer: SlowPeer, timeout: float):
    opts = run.Options(peer="127.0.0.1", tcp_port=peer.port, timeout=timeout, probe=False)
    return run.diagnose(Host(str(tree), lambda m: None), None, opts, lambda m: None)


def peer_line(report):
    return next(f for f in report.findings if f.check == "peer")


def test_the_peer_is_asked_before_this_side_reads_its_facts(tree, monkeypatch):
    """The question is on the peer's socket before this side starts on its own facts, and the
    peer answers only once this side is done: both read at once."""
    peer = SlowPeer()
    real = run.collect

    def collect(*args, **kwargs):
        assert peer.asked.wait(10), "the peer was not asked before this side read its facts"
        facts = real(*args, **kwargs)
        peer.go.set()  # only now does the peer answer
        return facts

    monkeypatch.setattr(run, "collect", collect)
    try:
        report = diagnose(tree, peer, 10.0)
    finally:
        peer.close()
    assert peer.query == wire.encode(wire.MessageType.FACTS_QUERY)
    assert report.peer == PEER
    assert peer_line(report).evidence.startswith("b mlx5_0/1, kernel 6.1.0-28-amd64")


def test_a_slow_peer_is_heard_within_the_timeout(tree):
    """A server that takes 1.5 s to read its facts, against --timeout 6: heard."""
    peer = SlowPeer(delay=1.5)
    t0 = time.monotonic()
    try:
        report = diagnose(tree, peer, 6.0)
    finally:
        peer.close()
    took = time.monotonic() - t0
    assert report.peer == PEER and peer_line(report).verdict.value == "PASS"
    assert 1.5 <= took < 6.0


def test_a_peer_slower_than_the_timeout_is_named_slow_with_the_fix(tree):
    peer = SlowPeer(answer=False)
    t0 = time.monotonic()
    try:
        report = diagnose(tree, peer, 0.5)
    finally:
        peer.close()
    assert time.monotonic() - t0 < 5.0  # the timeout, not more (plus this side's own reads)
    f = peer_line(report)
    assert f.verdict.value == "WARN" and report.peer is None
    assert f.evidence == (
        f"127.0.0.1 told nothing: 127.0.0.1:{peer.port} took the question but answered nothing "
        "within --timeout (0.5 s); this side only"
    )
    assert f.fix == (
        "give its server longer: --timeout 10 (it reads its facts anew for each query: seconds "
        "on a slow or emulated host)"
    )


def test_nothing_listening_still_says_start_a_server(tree):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = run.Options(peer="127.0.0.1", tcp_port=port, timeout=2.0, probe=False)
    report = run.diagnose(Host(str(tree), lambda m: None), None, opts, lambda m: None)
    f = peer_line(report)
    assert f.verdict.value == "WARN"
    assert f.evidence.startswith(
        f"127.0.0.1 told nothing: no ibtool ping server at 127.0.0.1:{port}"
    )
    assert f.fix == "run `ibtool ping --server` on 127.0.0.1"


def test_the_command_line_waits_the_timeout_it_is_given(tree):
    peer = SlowPeer(delay=1.0)
    try:
        r = run_cli(["--root", str(tree), "doctor", "127.0.0.1", "--port", str(peer.port),
                     "--timeout", "5", "-j"])  # fmt: skip
    finally:
        peer.close()
    checks = {c["check"]: c for c in r.json["checks"]}
    assert checks["peer"]["status"] == "PASS", checks["peer"]
    assert r.json["remote"]["hostname"] == "b"

"""`ibtool loopback` and `ibtool ping` on the pyverbs of each release, rdma-core 33 to 65.

The fake pyverbs (tests/unit/pyverbs_fakes.py) executes work requests in memory, so every
operation runs end to end with its data verified; what differs between the runs is only the
shape of pyverbs: where the enums live, whether flat names exist, whether CQs are extended.
"""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

import pytest

from ibtool.rdma import wire
from ibtool.rdma.ladder import Ladder
from ibtool.rdma.loopback.results import OPS
from ibtool.rdma.ping import client as native
from ibtool.rdma.ping import server as ping_server
from ibtool.rdma.ping import session
from ibtool.rdma.ping.options import ServeOptions
from tests.unit.pyverbs_fakes import LAYOUTS

RELEASES = list(LAYOUTS)
ROCE_GID = "0000:0000:0000:0000:0000:ffff:c0a8:0a01"  # GID 3 of the mlx5_roce tree


@pytest.mark.parametrize("release", RELEASES)
def test_loopback_passes_every_operation(release, fake_pyverbs, live_roce):
    fabric = fake_pyverbs(release)
    fabric.add_port("mlx5_0", 1, link_layer=2, gids={3: ROCE_GID})
    r = live_roce("-j", "loopback", "mlx5_0/1", "--iters", "3", "--size", "256")
    assert r.code == 0, r.err
    assert r.json["gid_index"] == 3
    # Path migration is for InfiniBand ports only (test_loopback_fabric.py).
    assert [(x["op"], x["status"]) for x in r.json["results"]] == [
        (op, "UNSUPPORTED" if op == "apm" else "PASS") for op in OPS
    ]
    assert [x["error"] for x in r.json["results"] if x["op"] != "apm"] == [None] * (len(OPS) - 1)
    assert all(x["bw_MBps"] > 0 for x in r.json["results"] if x["op"] in ("send", "write", "read"))


def test_loopback_without_pyverbs_exits_unsupported_with_the_hint(fake_pyverbs, live_roce):
    fake_pyverbs(None)
    r = live_roce("loopback", "mlx5_0/1", "--iters", "1")
    assert r.code == 6
    assert "pyverbs is not available" in r.err
    assert "apt install python3-pyverbs" in r.err


class Server(threading.Thread):
    """`ibtool ping --server` for one client, on a port the kernel picked; or what `serve`
    runs (given the log's append), listening likewise."""

    def __init__(self, monkeypatch, serve=None):
        super().__init__(daemon=True)
        self.serve = serve or (
            lambda log: ping_server.serve(
                ServeOptions("127.0.0.1", 0, log, device="mlx5_0", device_port=1, max_clients=1)
            )
        )
        self.listening = threading.Event()
        self.log: list[str] = []
        self.error: BaseException | None = None
        create_server = socket.create_server

        def listen(*args, **kwargs):
            self.listener = create_server(*args, **kwargs)
            self.listening.set()
            return self.listener

        monkeypatch.setattr(socket, "create_server", listen)

    def run(self) -> None:
        try:
            self.serve(self.log.append)
        except BaseException as e:
            self.error = e
            self.listening.set()

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]


def ping_three_times(monkeypatch, mode: wire.Mode) -> tuple[native.PingStats, list[str]]:
    server = Server(monkeypatch)
    server.start()
    assert server.listening.wait(10) and server.error is None, server.error
    stats, replies, lost = native.PingStats(), [], []
    on_reply, on_loss = lambda *r: replies.append(r), lambda seq, reason: lost.append((seq, reason))
    with Ladder("mlx5_0", 1, None) as ladder:
        client = native.Client(ladder, "127.0.0.1", server.port, 64, mode, timeout=10.0)
        try:
            native.run_client(client, 3, 0, None, on_reply, on_loss, stats, [])
        finally:
            client.close()
    server.join(10)
    assert not server.is_alive() and server.error is None, server.error
    assert lost == [] and [seq for seq, _, _ in replies] == [1, 2, 3]
    return stats, server.log


@pytest.mark.parametrize("mode", list(wire.Mode), ids=lambda m: m.name.lower())
@pytest.mark.parametrize("release", RELEASES)
def test_ping_is_answered(release, mode, fake_pyverbs, monkeypatch):
    fabric = fake_pyverbs(release)
    fabric.add_port("mlx5_0", 1, link_layer=1, lid=28)
    stats, log = ping_three_times(monkeypatch, mode)
    assert (stats.sent, stats.received, stats.errors) == (3, 3, 0)
    assert log[-1].endswith("done: 3 pings answered")


@pytest.mark.parametrize("mode", list(wire.Mode), ids=lambda m: m.name.lower())
@pytest.mark.parametrize("where", ["pyverbs", "provider"])
def test_ping_without_extended_cqs_polls_a_plain_cq(where, mode, fake_pyverbs, monkeypatch):
    # pyverbs without CQEX, or a provider without ibv_create_cq_ex: PlainCQ, same answers.
    fabric = fake_pyverbs("rdma-core-65", cqex=where == "provider")
    fabric.cqex_fails = where == "provider"
    fabric.add_port("mlx5_0", 1, link_layer=1, lid=28)
    stats, _ = ping_three_times(monkeypatch, mode)
    assert (stats.sent, stats.received) == (3, 3)


@pytest.mark.parametrize("mode", list(wire.Mode), ids=lambda m: m.name.lower())
def test_one_send_in_signal_every_is_signaled_on_both_sides(mode, fake_pyverbs, monkeypatch):
    # Unsignaled sends hold their send-queue slots until a later signaled one completes: a
    # run of SIGNAL_EVERY unsignaled ones in a row would fill the queue (2 * SIGNAL_EVERY).
    from tests.unit.pyverbs_fakes import FakeQP

    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=1, lid=28)
    posts: dict[int, list[bool]] = {}
    post_send = FakeQP.post_send

    def recorded(qp, wr):
        posts.setdefault(id(qp), []).append(bool(wr.send_flags & session.IBV_SEND_SIGNALED))
        return post_send(qp, wr)

    monkeypatch.setattr(FakeQP, "post_send", recorded)
    server = Server(monkeypatch)
    server.start()
    assert server.listening.wait(10) and server.error is None, server.error
    stats = native.PingStats()
    with Ladder("mlx5_0", 1, None) as ladder:
        client = native.Client(ladder, "127.0.0.1", server.port, 64, mode, timeout=10.0)
        try:
            native.run_client(client, 40, 0, None, lambda *r: None, None, stats, [])
        finally:
            client.close()
    server.join(10)
    assert (stats.sent, stats.received) == (40, 40)
    assert sorted(len(p) for p in posts.values()) == [40, 40]  # the client's and the server's
    for flags in posts.values():
        assert sum(flags) == 40 // session.SIGNAL_EVERY
        longest = max(len(run) for run in "".join("s" if f else "u" for f in flags).split("s"))
        assert longest < session.SIGNAL_EVERY


def test_a_buffer_beyond_the_memlock_limit_is_one_error_with_the_hint(fake_pyverbs, monkeypatch):
    """ENOMEM from ibv_reg_mr (the kernel's RLIMIT_MEMLOCK, core/umem.c): an IbtoolError
    naming the limit, and the CQ built before the MR closed at once, not left to the context."""
    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=1, lid=28)
    from tests.unit import pyverbs_fakes

    def refuse(self, pd, length, access):
        raise pyverbs_fakes.PyverbsRDMAError("Failed to register a MR. Errno: 12", 12)

    monkeypatch.setattr(pyverbs_fakes.FakeMR, "__init__", refuse)
    closed = []
    real_close = pyverbs_fakes.FakeCQ.close
    monkeypatch.setattr(
        pyverbs_fakes.FakeCQ, "close", lambda cq: (closed.append(cq), real_close(cq))
    )
    with Ladder("mlx5_0", 1, None) as ladder:
        with pytest.raises(session.IbtoolError) as e:
            session.Session(ladder, 1 << 20, wire.Mode.SEND)
        assert e.value.message.startswith(f"registering {1 << 20} bytes: Failed to register")
        assert "locked-memory limit (ulimit -l)" in e.value.hint
        assert len(closed) == 1


def test_a_long_lived_ladder_tells_the_port_s_mtu_as_it_is_now(fake_pyverbs):
    # a ping server started before `ip link set mtu 9000` told its clients the MTU of its
    # start, 1024, and every QP to it ran at that path MTU (the testbed's doctor saw it)
    from ibtool.rdma.ladder import Ladder

    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=1, lid=28)
    with Ladder("mlx5_0", 1) as lad:
        qp = SimpleNamespace(qp_num=7)
        assert lad.local(qp, 0).mtu == 3  # ibv_mtu 1024
        fabric.ports[("mlx5_0", 1)].active_mtu = 5  # 4096 since
        fabric.ports[("mlx5_0", 1)].lid = 29
        assert (lad.local(qp, 0).mtu, lad.local(qp, 0).lid) == (5, 29)
        assert lad.path_mtu(5) == 5


def test_a_ping_session_tells_its_peer_the_port_s_mtu_as_it_is_now(fake_pyverbs):
    # the native ping's own handshake (Session.endpoint), not the ladder's local(): a server
    # started before `ip link set mtu 9000` kept every QP to it at 1024 (the testbed's doctor
    # probe of 4096 bytes passed a path that drops packets over 1,100 bytes)
    from ibtool.rdma import wire
    from ibtool.rdma.ladder import Ladder
    from ibtool.rdma.ping.session import Session

    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=1, lid=28)
    with Ladder("mlx5_0", 1) as lad:
        session = Session(lad, 64, wire.Mode.SEND)
        try:
            assert session.endpoint().mtu == 3  # ibv_mtu 1024
            fabric.ports[("mlx5_0", 1)].active_mtu = 5  # 4096 since
            assert session.endpoint().mtu == 5
        finally:
            session.close()

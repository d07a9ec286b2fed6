"""`ibtool ping --compat rc_pingpong`: ibv_rc_pingpong's address text, read and written as
rdma-core's libibverbs/examples/rc_pingpong.c does; client and server of that exchange on the
fake pyverbs (the stock tool itself is the peer in tests/integration/test_ping_stock.py);
a peer that is not ibv_rc_pingpong; the command line's refusals."""

from __future__ import annotations

import socket
import threading

import pytest

from ibtool.errors import ExitCode
from ibtool.rdma.ladder import Ladder, PathSpec
from ibtool.rdma.ping import client as native
from ibtool.rdma.ping import pingpong, session
from ibtool.rdma.ping.options import ServeOptions
from tests.unit.fake_host import ROCE_GID
from tests.unit.test_data_path_pyverbs import Server as DataPathServer

GID = bytes.fromhex(ROCE_GID.replace(":", ""))


def test_the_address_is_the_52_bytes_ibv_rc_pingpong_writes():
    text = pingpong.encode(0x1C, 0x1234, 0xABCDEF, GID)
    # sprintf("%04x:%06x:%06x:%s") of gid_to_wire_gid, and the NUL: sizeof msg.
    assert text == b"001c:001234:abcdef:00000000000000000000ffffc0a80a01\0"
    assert len(text) == pingpong.MESSAGE_SIZE == 52


def test_an_address_is_read_back_as_the_peer():
    peer = pingpong.decode(b"0000:0000b3:05c1d2:fe800000000000000224d7fffe8a1b2c\0")
    assert (peer.lid, peer.qpn, peer.psn) == (0, 0xB3, 0x05C1D2)
    assert peer.gid == bytes.fromhex("fe800000000000000224d7fffe8a1b2c")


@pytest.mark.parametrize(
    "data",
    [
        b"IBTP\x01\x01\x00\x28" + bytes(44),  # ibtool's own protocol
        b"HTTP/1.1 400 Bad Request\r\n\r\n" + bytes(24),
        b"001c:001234:abcdef:00000000000000000000ffffc0a80a0\0\0",  # a GID digit short
        b"001c:001234:abcdef:00000000000000000000ffffc0a80a01x",  # no NUL after it
        b"c000:001234:abcdef:00000000000000000000ffffc0a80a01\0",  # a multicast LID
        b"001c:000001:abcdef:00000000000000000000ffffc0a80a01\0",  # QPN 1: GSI, not a QP
    ],
    ids=["ibtool", "http", "short-gid", "no-nul", "multicast-lid", "qpn-1"],
)
def test_what_is_not_an_address_is_refused(data):
    with pytest.raises(pingpong.NotPingpong) as e:
        pingpong.decode(data)
    assert "\n" not in e.value.message


def Server(monkeypatch, idle: float = 0.5):
    """`ibtool ping --server --compat rc_pingpong` for one client, on a port the kernel
    picked."""
    options = dict(device="mlx5_0", device_port=1, gid_index=3, max_clients=1, path=PathSpec())
    return DataPathServer(
        monkeypatch,
        lambda log: pingpong.serve(ServeOptions("127.0.0.1", 0, log, idle=idle, **options)),
    )


@pytest.fixture
def roce_fabric(fake_pyverbs, live_roce):
    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=2, gids={3: ROCE_GID})
    return fabric


def test_client_and_server_ping_pong_and_the_server_counts_them(roce_fabric, monkeypatch):
    server = Server(monkeypatch)
    server.start()
    assert server.listening.wait(10) and server.error is None, server.error
    stats, rtts, replies = native.PingStats(), [], []
    with Ladder("mlx5_0", 1, 3) as ladder:
        port = server.listener.getsockname()[1]
        client = pingpong.PingpongClient(ladder, "127.0.0.1", port, 300, 10.0, count=5)
        try:
            client.connect()
            native.run_client(client, 5, 0, None, lambda *r: replies.append(r), None, stats, rtts)
        finally:
            client.close()
    server.join(30)
    assert not server.is_alive() and server.error is None, server.error
    assert (stats.sent, stats.received) == (5, 5)
    assert [seq for seq, _, _ in replies] == [1, 2, 3, 4, 5]
    assert server.log[-1].endswith("done: 5 pings of 300 bytes answered")
    assert not roce_fabric.qps  # every QP destroyed on both sides


def test_the_session_is_one_and_cannot_be_asked_again(roce_fabric, monkeypatch):
    server = Server(monkeypatch)
    server.start()
    assert server.listening.wait(10)
    with Ladder("mlx5_0", 1, 3) as ladder:
        port = server.listener.getsockname()[1]
        client = pingpong.PingpongClient(ladder, "127.0.0.1", port, 64, 10.0)
        try:
            client.connect()
            with pytest.raises(session.SessionEnded):
                client.connect()
        finally:
            client.close()
    server.join(30)


def test_a_server_that_is_not_ibv_rc_pingpong_is_one_error_with_a_hint(roce_fabric, live_roce):
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def answer():
            conn, _ = listener.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n" + bytes(20))

        threading.Thread(target=answer, daemon=True).start()
        port = str(listener.getsockname()[1])
        r = live_roce("ping", "--compat", "rc_pingpong", "127.0.0.1", "--port", port)
    assert r.code == ExitCode.DATA_ERROR and r.out == ""
    assert r.err.startswith("ibtool: error: not an ibv_rc_pingpong address: ")
    assert r.err.endswith(
        f"(hint: is what listens at 127.0.0.1:{port} an ibv_rc_pingpong server?)\n"
    )
    assert len(r.err.splitlines()) == 1
    assert not roce_fabric.qps


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--mode", "write-imm"], "--mode write-imm with --compat rc_pingpong"),
        (["--sl", "16"], "argument --sl: must be 0 to 15, not 16"),
        (["--tclass", "256"], "argument --tclass: must be 0 to 255, not 256"),
    ],
)
def test_what_the_peer_cannot_do_is_a_usage_error(roce_fabric, live_roce, argv, said):
    r = live_roce("ping", "--compat", "rc_pingpong", "127.0.0.1", *argv)
    assert (r.code, r.out) == (ExitCode.USAGE, "")
    # A range is refused as the command line is parsed (argparse's usage, then the error).
    assert r.err.startswith(f"ibtool: error: {said}") or f"\nibtool ping: error: {said}" in r.err


def test_the_header_names_the_peer_and_the_path(roce_fabric, live_roce, monkeypatch):
    server = Server(monkeypatch)
    server.start()
    assert server.listening.wait(10)
    port = str(server.listener.getsockname()[1])
    r = live_roce(
        "ping", "--compat", "rc_pingpong", "127.0.0.1", "--port", port,
        "-c", "2", "-s", "64", "--sl", "3", "--tclass", "96", "-q",
    )  # fmt: skip
    server.join(30)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == (
        "PING 127.0.0.1 (ibv_rc_pingpong) over mlx5_0/1 gid 3: 64 bytes, mtu 1024, sl 3, "
        "tclass 96 (DSCP 24), pkey 0xffff (index 0)"
    )
    assert lines[1] == "--- 127.0.0.1 ibtool ping statistics ---"  # -q: no line per reply
    assert lines[2].startswith("2 sent, 2 received, 0% loss")

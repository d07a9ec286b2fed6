"""`ibtool ping --compat rping`: the rping advertisement on the wire, the payload rping's client
sends, what a garbage peer gets, and the command line (librdmacm missing, bad options).

The rdma_cm connection itself runs in the testbed only (tests/integration/test_ping_rping.py):
here a stand-in Connection plays the peer's messages to the server and client loops.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from ibtool.errors import ExitCode, UnsupportedError
from ibtool.rdma import cm
from ibtool.rdma.ping import rping
from ibtool.rdma.ping.options import ServeOptions
from ibtool.sources import verbs


def test_an_advertisement_is_16_big_endian_bytes_as_struct_rping_rdma_info():
    ad = rping.Advert(addr=0x55B783FA5DA0, rkey=0x898, size=64)
    raw = rping.encode(ad)
    assert raw == bytes.fromhex("000055b783fa5da00000089800000040")
    assert rping.decode(raw, 16, rping.MAX_SIZE, "ad") == ad


@pytest.mark.parametrize("byte_len", [0, 12, 15, 17, 64])
def test_a_message_that_is_not_16_bytes_is_garbage(byte_len):
    with pytest.raises(rping.RpingProtocolError) as err:
        rping.decode(bytes(64), byte_len, rping.MAX_SIZE, "the ping's advertisement")
    assert err.value.exit_code == ExitCode.DATA_ERROR
    assert err.value.message == (
        f"the ping's advertisement: {byte_len}-byte message, an rping advertisement has 16"
    )
    assert "is the peer an rping" in err.value.hint


@pytest.mark.parametrize("size", [0, rping.MAX_SIZE + 1, 0xFFFFFFFF])
def test_an_advertised_size_out_of_range_is_garbage(size):
    raw = rping.encode(rping.Advert(0x1000, 0x1234, size))
    with pytest.raises(rping.RpingProtocolError) as err:
        rping.decode(raw, 16, rping.MAX_SIZE, "the sink's advertisement")
    assert err.value.message == (
        f"the sink's advertisement: a {size}-byte buffer advertised, expected 1..65535"
    )
    assert "\n" not in err.value.message + err.value.hint


def test_any_rkey_and_address_decode():
    # Whether they are good is the RDMA operation's to say (REM_ACCESS_ERR), not the decoder's.
    raw = rping.encode(rping.Advert(2**64 - 1, 2**32 - 1, 1))
    assert rping.decode(raw, 16, 1, "ad") == rping.Advert(2**64 - 1, 2**32 - 1, 1)


def test_the_payload_is_what_rping_c_sends():
    # What `rping -s -v` printed in the testbed for the first two pings of a 64-byte client.
    assert (
        rping.payload(0, 64)
        == b"rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\0"
    )
    assert (
        rping.payload(1, 64)
        == b"rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs\0"
    )


def test_the_payload_letters_wrap_from_z_to_a_and_the_smallest_size_fits():
    assert rping.payload(57, 40)[14:16] == b"zA"  # 'A' + 57 is 'z'
    assert rping.payload(58, 40)[14:15] == b"A"
    small = rping.payload(2**31 - 1, rping.MIN_SIZE)  # INT_MAX: rping's largest header
    assert small.startswith(b"rdma-ping-2147483647: ") and small.endswith(b"\0")
    assert len(small) == rping.MIN_SIZE
    assert b"\0" not in rping.payload(3, rping.MAX_SIZE)[:-1]  # rping's server: strlen + 1


# -- the loops against a stand-in peer ---------------------------------------------------------


class MR:
    def __init__(self, size: int):
        self.data = bytearray(size)
        self.buf, self.rkey = 0x1000, 0x77

    def write(self, data: bytes, length: int, offset: int = 0) -> None:
        self.data[offset : offset + length] = data[:length]

    def read(self, length: int, offset: int) -> bytes:
        return bytes(self.data[offset : offset + length])


class Peer:
    """A Connection whose completions are the peer's scripted messages: each receive completion
    delivers the next (bytes) of `messages`; RDMA READ and WRITE complete at once."""

    cmid = private_data = None

    def __init__(self, messages: list[bytes]):
        self.messages, self.device, self.posted = list(messages), "rxe0/1", []
        self.recv_mr, self.kept = None, []

    def keep(self, close) -> None:
        self.kept.append(close)

    def close(self) -> None:
        while self.kept:
            self.kept.pop()()

    def path_used(self):
        return None  # as with a pyverbs without CMID.query_qp

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def mr(self, size: int, access: int):
        return MR(size)

    def post_recv(self, mr, length):
        self.recv_mr = mr

    def post_send(self, mr, length):
        self.posted.append(("send", mr.read(length, 0)))

    def post_read(self, mr, length, addr, rkey):
        self.posted.append(("read", length, addr, rkey))

    def post_write(self, mr, length, addr, rkey):
        self.posted.append(("write", length, addr, rkey))

    def wait(self, opcode, deadline, what):
        if opcode != cm.IBV_WC_RECV:
            return SimpleNamespace(byte_len=0, opcode=opcode, status=0)
        if not self.messages:
            raise cm.Disconnected("the peer disconnected")
        message = self.messages.pop(0)
        self.recv_mr.write(message, len(message))
        return SimpleNamespace(byte_len=len(message), opcode=opcode, status=0)


class Listener:
    where, device = "192.168.77.1:7174", "rxe0/1"

    def __init__(self, peer: Peer):
        self.peer = peer

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def next_request(self, send_wr, recv_wr, admit=None, tick=None):
        assert admit is None or admit(self.peer) is None, "the stand-in peer is let in"
        return self.peer

    def source(self, cmid):
        return cm.Source("192.168.77.2", 40000)

    def accept(self, conn):
        pass


def serve(monkeypatch, messages: list[bytes]) -> tuple[list[str], Peer]:
    peer, lines = Peer(messages), []
    monkeypatch.setattr(cm, "Listener", lambda bind, port: Listener(peer))
    rping.serve(ServeOptions("192.168.77.1", 7174, lines.append, max_clients=1))
    return lines, peer


def ad(size: int, addr: int = 0x2000, rkey: int = 0x99) -> bytes:
    return rping.encode(rping.Advert(addr, rkey, size))


def test_the_server_reads_the_ping_writes_it_back_and_says_go_ahead_twice(monkeypatch):
    lines, peer = serve(monkeypatch, [ad(64, 0xA000, 0x11), ad(64, 0xB000, 0x22)] * 2)
    go_ahead = ("send", bytes(16))
    assert (
        peer.posted
        == [
            ("read", 64, 0xA000, 0x11),
            go_ahead,
            ("write", 64, 0xB000, 0x22),
            go_ahead,
        ]
        * 2
    )
    assert lines == [
        "listening on 192.168.77.1:7174 (rdma_cm, rping), rxe0/1",
        "client 1 connected on rxe0/1",
        "client 1 done: 2 pings answered",
    ]


@pytest.mark.parametrize(
    "messages, said",
    [
        ([b"hello"], "the ping's advertisement: 5-byte message, an rping advertisement has 16"),
        ([ad(70000)], "the ping's advertisement: a 70000-byte buffer advertised, expected "),
        ([ad(64), ad(32)], "the sink holds 32 bytes, the ping 64"),
    ],
    ids=["short", "huge", "small-sink"],
)
def test_a_client_that_speaks_garbage_is_dropped_in_one_line(monkeypatch, messages, said):
    lines, _ = serve(monkeypatch, messages)
    assert lines[-1].startswith("client 1 dropped: " + said), lines
    assert len(lines) == 3


def test_a_server_whose_go_ahead_is_not_16_bytes_ends_the_run(monkeypatch):
    peer = Peer([bytes(16), bytes(8)])
    monkeypatch.setattr(cm, "dial", lambda host, port, s, r: peer)
    monkeypatch.setattr(cm, "connect_to", lambda conn, host, port: None)
    client = rping.Client("192.168.77.1", 7174, 64, 2.0)
    with pytest.raises(rping.RpingProtocolError) as err:
        client.ping(1)
    assert err.value.message == (
        "ping 1: the server's go-ahead after its write: 8-byte message, rping's go-ahead has 16"
    )
    assert err.value.exit_code == ExitCode.DATA_ERROR


def test_a_server_that_leaves_mid_ping_is_a_lost_connection(monkeypatch):
    peer = Peer([bytes(16)])
    monkeypatch.setattr(cm, "dial", lambda host, port, s, r: peer)
    monkeypatch.setattr(cm, "connect_to", lambda conn, host, port: None)
    client = rping.Client("192.168.77.1", 7174, 64, 2.0)
    with pytest.raises(cm.Disconnected) as err:
        client.ping(1)
    assert err.value.message == "the rping server at 192.168.77.1:7174 disconnected"
    assert err.value.hint == "a stock `rping -s` serves one client, then exits"
    assert err.value.exit_code == ExitCode.FAILED


# -- the command line --------------------------------------------------------------------------


def test_without_librdmacm_rping_mode_is_one_error_with_the_install_hint(fake_pyverbs, live_roce):
    fake_pyverbs("rdma-core-65", rdmacm=False)
    r = live_roce("ping", "--compat", "rping", "192.168.77.1", "-c", "1")
    assert (r.code, r.out) == (ExitCode.UNSUPPORTED, "")
    assert r.err == (
        "ibtool: error: librdmacm's part of pyverbs is not available (import of pyverbs.cmid "
        f"halted; None in sys.modules) (hint: {verbs.RDMACM_HINT})\n"
    )


def test_a_pyverbs_whose_cmid_lacks_a_method_is_too_old(fake_pyverbs):
    fake_pyverbs("rdma-core-44")
    sys.modules["pyverbs.cmid"].CMID = type("CMID", (), {})
    with pytest.raises(UnsupportedError) as err:
        verbs.rdmacm()
    assert err.value.message == "this pyverbs has no pyverbs.cmid.CMID.bind_addr"


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["--server"],
            "--compat rping --server needs --bind ADDR (hint: give the IP address of the IPoIB "
            "or RoCE netdev to serve on (rdma_cm picks the RDMA device from it))",
        ),
        (
            ["--server", "--bind", "0.0.0.0"],
            "--bind 0.0.0.0: a wildcard address names no RDMA device (hint: give the IP address "
            "of the IPoIB or RoCE netdev to serve on)",
        ),
        (
            ["192.168.77.1", "-s", "25"],
            "-s 25: an rping ping is 26..65535 bytes (hint: a stock `rping -s` reads into its "
            "own -S buffer (default 64): start it with -S at least this size)",
        ),
        (
            ["192.168.77.1", "--gid-index", "1"],
            "--compat rping takes no --dev or --gid-index (hint: rdma_cm picks the RDMA device "
            "and GID from the IP address)",
        ),
        (
            ["192.168.77.1", "--tclass", "104"],
            "--compat rping takes no --tclass: pyverbs cannot set the TOS of an rdma_cm id "
            "(hint: rdma_cm's default for a RoCE port is in configfs: mkdir "
            "/sys/kernel/config/rdma_cm/DEV, then write the TOS to its "
            "ports/PORT/default_roce_tos (every rdma_cm connection from that port that sets "
            "none takes it))",
        ),
        (
            ["192.168.77.1", "--mtu", "1024"],
            "--compat rping takes no --mtu (hint: rdma_cm sets the path of an rping connection "
            "from the route to the address)",
        ),
        (
            ["192.168.77.1", "--sl", "3", "--mtu", "1024"],
            "--compat rping takes no --sl or --mtu (hint: rdma_cm sets the path of an rping "
            "connection from the route to the address)",
        ),
    ],
    ids=["no-bind", "wildcard", "too-small", "gid-index", "tclass", "mtu", "sl-and-mtu"],
)
def test_bad_rping_options_are_usage_errors(fake_pyverbs, live_roce, argv, said):
    fake_pyverbs("rdma-core-65")
    r = live_roce("ping", "--compat", "rping", *argv)
    assert (r.code, r.out, r.err) == (ExitCode.USAGE, "", f"ibtool: error: {said}\n")

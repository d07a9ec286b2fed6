"""The ping out-of-band protocol: round trips, validation, a fuzzed parser that never crashes."""

from __future__ import annotations

import socket
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibtool.rdma import wire
from ibtool.rdma.wire import Endpoint, MessageType, Mode, ProtocolError

GOOD = Endpoint(
    qpn=0x11,
    psn=0xABCDE,
    lid=0,
    mtu=3,
    gid=bytes.fromhex("00000000000000000000ffffc0a84d01"),
    addr=0x7F0000001000,
    rkey=0x1234,
    size=64,
    mode=Mode.WRITE_IMM,
)

endpoints = st.builds(
    Endpoint,
    qpn=st.integers(2, (1 << 24) - 1),
    psn=st.integers(0, (1 << 24) - 1),
    lid=st.integers(1, 0xBFFF),
    mtu=st.integers(1, 5),
    gid=st.binary(min_size=16, max_size=16),
    addr=st.integers(0, (1 << 63)),
    rkey=st.integers(0, (1 << 32) - 1),
    size=st.integers(1, wire.MAX_BUFFER),
    mode=st.sampled_from(Mode),
)


@given(endpoints)
def test_endpoint_round_trips(ep):
    assert wire.decode(wire.encode_endpoint(ep)) == (MessageType.ENDPOINT, ep)


@given(st.binary(max_size=200))
def test_garbage_is_a_protocol_error_never_a_crash(data):
    try:
        wire.decode(data)
    except ProtocolError:
        pass


@given(endpoints, st.integers(0, 60), st.integers(0, 255))
def test_flipped_bytes_are_caught_or_valid(ep, position, value):
    data = bytearray(wire.encode_endpoint(ep))
    data[position % len(data)] = value
    try:
        kind, decoded = wire.decode(bytes(data))
    except ProtocolError:
        return
    if kind == MessageType.ENDPOINT:
        decoded.validate()
    else:  # the type byte itself was flipped: an ERROR whose payload is text is well formed,
        # and so is a FACTS one, whose bytes Facts.from_wire checks before any use
        assert (kind, type(decoded)) in ((MessageType.ERROR, str), (MessageType.FACTS, bytes))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"qpn": 1}, "QPN"),
        ({"qpn": 1 << 24}, "QPN"),
        ({"psn": 1 << 24}, "PSN"),
        ({"mtu": 6}, "MTU"),
        ({"lid": 0xC000}, "LID"),
        ({"size": 0}, "buffer size"),
        ({"lid": 0, "gid": bytes(16)}, "neither a LID nor a GID"),
        ({"addr": (1 << 64) - 8, "size": 64}, "wraps"),
    ],
)
def test_out_of_range_fields_are_rejected_by_name(change, message):
    fields = {**GOOD.__dict__, **change}
    with pytest.raises(ProtocolError, match=message):
        Endpoint(**fields).validate()


def test_wrong_magic_version_type_and_length_are_named():
    good = wire.encode_endpoint(GOOD)
    with pytest.raises(ProtocolError, match="not an ibtool ping peer"):
        wire.decode(b"HTTP" + good[4:])
    with pytest.raises(ProtocolError, match="version 9"):
        wire.decode(good[:4] + b"\x09" + good[5:])
    with pytest.raises(ProtocolError, match="unknown message type"):
        wire.decode(good[:5] + b"\x63" + good[6:])
    with pytest.raises(ProtocolError, match="length field"):
        wire.decode(good + b"x")
    with pytest.raises(ProtocolError, match="exceeds"):
        wire.decode(wire.HEADER.pack(wire.MAGIC, 1, 3, 60000))


def _pair():
    a, b = socket.socketpair()
    return a, b


def test_receive_reads_one_message_over_a_socket():
    a, b = _pair()
    with a, b:
        a.sendall(wire.encode_endpoint(GOOD) + wire.encode(MessageType.READY))
        assert wire.receive(b, 2.0, MessageType.ENDPOINT) == GOOD
        assert wire.receive(b, 2.0, MessageType.READY) is None


def test_stalled_peer_times_out():
    a, b = _pair()
    with a, b:
        a.sendall(wire.encode_endpoint(GOOD)[:10])  # then nothing
        with pytest.raises(ProtocolError, match="timed out"):
            wire.receive(b, 0.2)


def test_peer_that_disconnects_mid_message():
    a, b = _pair()
    with b:
        a.sendall(wire.encode_endpoint(GOOD)[:20])
        a.close()
        with pytest.raises(ProtocolError, match="closed"):
            wire.receive(b, 2.0)


def test_peer_error_is_reported_with_its_reason():
    a, b = _pair()
    with a, b:
        threading.Thread(target=a.sendall, args=(wire.encode_error("no such device"),)).start()
        with pytest.raises(ProtocolError, match="peer says: no such device"):
            wire.receive(b, 2.0)


def test_unexpected_message_type():
    a, b = _pair()
    with a, b:
        a.sendall(wire.encode(MessageType.READY))
        with pytest.raises(ProtocolError, match="expected ENDPOINT, got READY"):
            wire.receive(b, 2.0, MessageType.ENDPOINT)

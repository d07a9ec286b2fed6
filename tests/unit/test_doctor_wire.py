"""A doctor query between two hosts: the FACTS exchange on the ping port, and a peer's facts
taken as untrusted input (bounded, every field checked, text made printable)."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from ibtool.model.doctor import MAX_FACTS, Facts, GidFact
from ibtool.rdma import wire
from ibtool.rdma.ping import facts as peer_facts
from ibtool.rdma.ping.server import answer_facts, first_endpoint

GOOD = Facts(
    hostname="b",
    device="rxe0",
    port=1,
    link_layer="Ethernet",
    gid_index=1,
    gids=(
        GidFact(1, "0000:0000:0000:0000:0000:ffff:0a4d:0002", "RoCE v2", "eth0", None, "10.77.0.2"),
    ),  # fmt: skip
    pkeys=(0xFFFF,),
    pfc=(3,),
    dscp_prio=((26, 3),),
    memlock_soft=-1,
    udp_filters=(),
)


def test_facts_survive_the_wire():
    assert Facts.from_wire(GOOD.to_wire()) == GOOD


def test_a_gid_is_written_as_sysfs_writes_it_whatever_the_python():
    # Python 3.13+ explodes ::ffff:10.77.0.2 with a dotted tail; a GID never is
    got = Facts.from_wire(hostile(gids=[{"index": 1, "gid": "::ffff:10.77.0.2"}]))
    assert got.gids[0].gid == "0000:0000:0000:0000:0000:ffff:0a4d:0002"


def hostile(**fields) -> bytes:
    data = GOOD.to_json()
    data.update(fields)
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "field,value",
    [
        ("port", 0),
        ("port", "1"),
        ("port", True),
        ("port", 1 << 70),
        ("device", "../../etc"),
        ("device", "x" * 65),
        ("netdev", "eth0\x1b[2J"),
        ("netdev", "eth0;reboot"),
        ("netdev", "$(reboot)"),
        ("driver", "mlx5 core"),
        ("gid_index", -1),
        ("memlock_soft", -2),
        ("pfc", [9]),
        ("allowed_cpus", "0-3; rm -rf /"),
        ("active_mtu", 1.5),
    ],
)
def test_a_field_that_fails_its_check_is_not_known(field, value):
    got = Facts.from_wire(hostile(**{field: value}))
    assert getattr(got, field) in (None, ())


def test_text_from_a_peer_is_made_printable_and_cut():
    got = Facts.from_wire(hostile(hostname="b\x1b]0;owned\x07" + "x" * 500))
    assert "\x1b" not in got.hostname and "\\x1b" in got.hostname
    assert len(got.hostname) <= 123


def test_lists_from_a_peer_are_capped_and_bad_items_dropped():
    gids = [{"index": i, "gid": "fe80::1", "type": "RoCE v2"} for i in range(200)]
    gids[0] = {"index": "x", "gid": "fe80::1"}
    gids[1] = {"index": 1, "gid": "not a gid"}
    got = Facts.from_wire(hostile(gids=gids, dscp_prio=[[64, 1], [26, 3], "x", [1, 2, 3]]))
    assert len(got.gids) == 62 and got.gids[0].index == 2
    assert got.gids[0].gid == "fe80:0000:0000:0000:0000:0000:0000:0001"
    assert got.dscp_prio == ((26, 3),)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b"null",
        b"{",
        b'{"version": 2}',
        b"\xff\xfe",
        b"NaN",
        b'{"version": NaN}',
        b"[" * 100000,
        b"[" * 16000,
        b" " * (MAX_FACTS + 1),
    ],  # fmt: skip
)
def test_what_is_not_facts_is_refused_whole(data):
    with pytest.raises(ValueError):
        Facts.from_wire(data)


def test_the_facts_message_has_its_own_bound():
    big = wire.encode(wire.MessageType.FACTS, b"x" * 16000)
    kind, value = wire.decode(big)
    assert kind == wire.MessageType.FACTS and value == b"x" * 16000
    with pytest.raises(ValueError):
        wire.encode(wire.MessageType.FACTS, b"x" * (wire.MAX_FACTS_PAYLOAD + 1))
    with pytest.raises(wire.ProtocolError, match="exceeds 1024"):
        wire.decode(wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.MessageType.ERROR, 2000))
    with pytest.raises(wire.ProtocolError, match="FACTS_QUERY carries no payload"):
        wire.decode(
            wire.encode(wire.MessageType.READY)[: -0 or None][:4]
            + bytes([wire.VERSION, wire.MessageType.FACTS_QUERY, 0, 1])
            + b"x"
        )


def test_the_server_reads_a_query_as_a_first_message():
    query = wire.encode(wire.MessageType.FACTS_QUERY)
    assert first_endpoint(query[:3]) == (wire.HEADER.size - 3, None)
    assert first_endpoint(query) == (0, wire.MessageType.FACTS_QUERY)


def _answer(facts):
    a, b = socket.socketpair()
    lines = []
    with a, b:
        answer_facts(a, "peer", lines.append, facts)
        a.shutdown(socket.SHUT_WR)
        return wire.decode(b.recv(65536)), lines


def test_the_server_answers_facts_or_says_why_not():
    (kind, value), lines = _answer(GOOD.to_wire)
    assert kind == wire.MessageType.FACTS and Facts.from_wire(value) == GOOD
    assert lines == ["client peer: doctor query answered"]
    (kind, value), lines = _answer(None)
    assert kind == wire.MessageType.ERROR and "does not answer doctor queries" in value

    def broken():
        raise OSError("read failed")

    (kind, value), lines = _answer(broken)
    assert kind == wire.MessageType.ERROR and value == "facts not read: read failed"


def serve_once(reply: bytes | None):
    """A listener that takes one connection, reads a query, then sends `reply` (None: closes)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def run():
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(64)
                if reply:
                    conn.sendall(reply)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return port, thread


def test_query_facts_against_a_server():
    port, thread = serve_once(wire.encode(wire.MessageType.FACTS, GOOD.to_wire()))
    assert Facts.from_wire(peer_facts.query_facts("127.0.0.1", port, 5.0)) == GOOD
    thread.join()


@pytest.mark.parametrize(
    "reply,message",
    [
        (None, "closed the connection without facts"),
        (b"0000:000011:000022:00000000000000000000000000000000", "did not answer with facts"),
        (wire.encode_error("no"), "127.0.0.1:{port}: peer says: no"),
        (wire.encode(wire.MessageType.READY), "expected FACTS, got READY"),
    ],
)
def test_a_peer_that_does_not_answer_facts_is_one_clear_error(reply, message):
    port, thread = serve_once(reply)
    with pytest.raises(peer_facts.NoFacts) as e:
        peer_facts.query_facts("127.0.0.1", port, 5.0)
    assert message.format(port=port) in e.value.message
    thread.join()


def test_nothing_listening_is_no_facts_with_a_hint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(peer_facts.NoFacts) as e:
        peer_facts.query_facts("127.0.0.1", port, 2.0)
    assert e.value.message.startswith(f"no ibtool ping server at 127.0.0.1:{port}")
    assert "ibtool ping --server" in e.value.hint


def test_a_silent_peer_costs_the_timeout_only():
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        with pytest.raises(peer_facts.NoFacts, match="timed out"):
            peer_facts.query_facts("127.0.0.1", listener.getsockname()[1], 0.3)

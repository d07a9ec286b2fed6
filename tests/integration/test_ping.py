"""ibtool ping between processes on the live kernel: replies, a server serving clients in turn,
faults (netem loss, link down and back), garbage peers, and nothing left behind; its edges: a
port taken, peers that reset, hang or send escape sequences, and signals to either side."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unicodedata
from typing import NamedTuple

import pytest

from ibtool.rdma import wire
from tests.fixtures.peers import EVIL, EVIL_SHOWN, Peer, resets, sends_escapes
from tests.integration import faults
from tests.integration.running import Running

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
    with faults.link_down(testbed):  # up again, its routes back, on the way out
        time.sleep(2)
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


# -- edges: a port taken, peers that reset, hang or send escape sequences, signals ----------------
#
# What each prints and exits with is in ibtool-ping(8) (OUTPUT, EXIT STATUS) and ibtool(8).

# ESC sequences that recolour and retitle the terminal, a line forged after a newline, a carriage
# return, a bidi override, a C1 CSI (0x9b) clearing the screen, then far too much.
SIGNALS = [
    (signal.SIGINT, 130, "ibtool: interrupted\n"),
    (signal.SIGTERM, 143, "ibtool: terminated\n"),
]


def user_objects(kind: str) -> list[dict]:
    """`rdma res show KIND` entries owned by a process (kernel objects have no pid)."""
    out = subprocess.run(
        ["rdma", "-j", "res", "show", kind], capture_output=True, text=True, check=True
    ).stdout
    return [o for o in json.loads(out or "[]") if "pid" in o]


def nothing_left() -> bool:
    return not user_objects("qp") and not user_objects("mr")


def unsafe(text: str) -> set[str]:
    """The characters of `text` that could drive a terminal or start a line, but newlines."""
    return {c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")}


def replies(lines: list[str]) -> int:
    return sum(" bytes from 127.0.0.1: seq=" in line for line in lines)


def start_server(running) -> Running:
    server = running("ping", "--server", "--port", str(PORT))
    server.wait_for_lines(lambda lines: lines, timeout=60)
    assert server.lines[0].startswith(f"listening on *:{PORT}, "), server.lines
    return server


def ping_peer(peer: Peer) -> subprocess.CompletedProcess:
    return ibtool("ping", "127.0.0.1", "--port", str(peer.port), "-c", "1", timeout=120)


def test_server_on_a_port_already_taken_is_one_line_and_exit_1(wait_for):
    with socket.create_server(("", PORT + 2)):
        proc = ibtool("ping", "--server", "--port", str(PORT + 2), timeout=60)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        f"ibtool: error: cannot listen on *:{PORT + 2}: Address already in use (hint: another "
        "program has the port, perhaps another `ibtool ping --server` (`ss -ltnp` shows "
        "which): stop it, or give both sides another --port)\n"
    )
    wait_for(nothing_left, "no QP or MR of the server")


def test_client_against_a_peer_that_resets_is_one_line_and_exit_1(wait_for):
    with Peer(resets(30), join_timeout=60) as peer:
        proc = ping_peer(peer)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("PING 127.0.0.1 over ") and proc.stdout.count("\n") == 1
    assert proc.stderr == (
        "ibtool: error: peer reset the connection (hint: the ping server at "
        f"127.0.0.1:{peer.port} stopped or dropped this client; its log says why)\n"
    )
    wait_for(nothing_left, "the client's QP and MR to be destroyed")


def test_client_against_a_peer_that_hangs_gives_up_after_the_handshake_timeout(wait_for):
    leave = threading.Event()
    with Peer(lambda conn: leave.wait(120), join_timeout=60) as peer:
        t0 = time.monotonic()
        proc = ping_peer(peer)
        took = time.monotonic() - t0
        leave.set()
    assert proc.returncode == 7, proc.stderr
    assert proc.stderr == (
        "ibtool: error: peer too slow: handshake timed out (hint: is what listens at "
        f"127.0.0.1:{peer.port} an `ibtool ping --server` of this version?)\n"
    )
    assert 4 < took < 100, took  # the handshake's 5 s (ping.HANDSHAKE_TIMEOUT), not forever
    wait_for(nothing_left, "the client's QP and MR to be destroyed")


def test_client_shows_a_peers_escape_sequences_escaped():
    with Peer(sends_escapes(60), join_timeout=60) as peer:
        proc = ping_peer(peer)
    assert proc.returncode == 1  # no reply
    assert unsafe(proc.stdout) == set() and unsafe(proc.stderr) == set()
    (line,) = proc.stderr.splitlines()  # one line: the newline the peer sent is not one
    assert line.startswith("ibtool: warning: seq=1 lost: peer says: " + EVIL_SHOWN)
    assert line.endswith("...")
    assert "1 sent, 0 received, 100% loss" in proc.stdout


def test_server_logs_a_clients_escape_sequences_escaped(running, testbed, wait_for):
    server = start_server(running)
    gid = ipaddress.IPv6Address("::ffff:" + testbed["ipv4"]).packed  # rxe0's own address
    endpoint = wire.Endpoint(0x99, 1, 0, 3, gid, 0x1000, 1, 64, wire.Mode.SEND)
    with socket.create_connection(("127.0.0.1", PORT), timeout=30) as c:
        c.sendall(wire.encode_endpoint(endpoint))
        wire.receive(c, 30, wire.MessageType.ENDPOINT)  # its QP is ready for ours
        c.sendall(wire.encode_error(EVIL))  # instead of READY
    lines = server.wait_for_lines(lambda lines: " done: 0 pings answered" in "".join(lines))
    assert all(unsafe(line) == set() for line in lines)
    (not_ready,) = [line for line in lines if "connection not ready" in line]
    assert re.fullmatch(
        r"client 127\.0\.0\.1:\d+: connection not ready: peer says: "
        + re.escape(EVIL_SHOWN)
        + r"x*\.\.\.\n",
        not_ready,
    )
    rc, _, err = server.finish(signal.SIGTERM)
    assert (rc, err) == (143, "ibtool: terminated\n")
    wait_for(nothing_left, "the server's QP and MR to be destroyed")


@pytest.mark.parametrize("sig, code, said", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_server_mid_run(running, wait_for, sig, code, said):
    server = start_server(running)
    client = running("ping", "127.0.0.1", "--port", str(PORT), "-i", "0.2", "-W", "1")
    client.wait_for_lines(lambda lines: replies(lines) >= 3)
    rc, out, err = server.finish(sig)
    assert (rc, err) == (code, said)
    assert out.splitlines()[-1] == "server stopped"
    # The client loses the next ping, cannot rebuild its QP with a server that is gone, and
    # ends: the statistics, then the error.
    rc, out, err = client.finish(timeout=180)
    assert rc == 1, err
    lines = out.splitlines()
    assert lines[-3] == "--- 127.0.0.1 ibtool ping statistics ---", out
    assert re.fullmatch(r"\d+ sent, \d+ received, \d+% loss, time \d+ ms", lines[-2])
    assert lines[-1].startswith("rtt min/avg/median/max/mdev = ")
    assert re.search(
        r"ibtool: error: peer (closed|reset) the connection \(hint: the ping server at "
        + re.escape(f"127.0.0.1:{PORT} stopped or dropped this client; its log says why)\n")
        + r"\Z",
        err,
    ), err
    assert "Traceback" not in err
    wait_for(nothing_left, "every QP and MR to be destroyed")


@pytest.mark.parametrize(
    "sig, code, said",
    [(signal.SIGINT, 0, ""), (signal.SIGTERM, 143, "ibtool: terminated\n")],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_signal_to_the_client_mid_run_prints_the_statistics(running, wait_for, sig, code, said):
    server = start_server(running)
    client = running("ping", "127.0.0.1", "--port", str(PORT), "-i", "0.2")
    client.wait_for_lines(lambda lines: replies(lines) >= 3)
    rc, out, err = client.finish(sig)
    assert (rc, err) == (code, said)  # Ctrl-C after replies: 0, as ping(8)
    lines = out.splitlines()
    assert lines[-3] == "--- 127.0.0.1 ibtool ping statistics ---", out
    m = re.fullmatch(r"(\d+) sent, (\d+) received, \d+% loss, time \d+ ms", lines[-2])
    assert m and int(m[2]) >= 3 and int(m[1]) - int(m[2]) in (0, 1)  # one may be in flight
    assert lines[-1].startswith("rtt min/avg/median/max/mdev = ")
    server.wait_for_lines(lambda lines: " done: " in "".join(lines))  # the server goes on
    wait_for(nothing_left, "the QPs and MRs of the client and of its session to be destroyed")
    assert server.proc.poll() is None


class Packet(NamedTuple):
    opcode: int  # the BTH's: transport in the top 3 bits (RC 0, UD 3: QP1's CM MADs)
    tos: int  # the IPv4 header's TOS byte: DSCP << 2 | ECN
    pkey: int  # the BTH's P_Key
    payload: int  # bytes after the BTH (and the RETH or ImmDt, if any): at most the path MTU


def roce_v2_packets(netdev: str, source: str, until: threading.Event) -> list[Packet]:
    """Every RoCE v2 packet (UDP port 4791) from `source` seen on `netdev` until `until` is
    set, read off an AF_PACKET socket. The 12-byte BTH follows the UDP header, its P_Key in
    bytes 2-3; the packet ends with the 4-byte ICRC (IBTA vol. 1, 9.2; RoCE v2: annex A17)."""
    seen: list[Packet] = []
    # ETH_P_ALL: a socket of one protocol is not shown what the host sends
    # (dev_queue_xmit_nit walks only the ETH_P_ALL taps).
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003)) as sniff:
        sniff.bind((netdev, 0))
        sniff.settimeout(0.2)
        while not until.is_set():
            try:
                frame = sniff.recv(2048)
            except socket.timeout:
                continue
            if frame[12:14] != b"\x08\x00":  # IPv4
                continue
            ip = frame[14:]
            header = (ip[0] & 0x0F) * 4
            udp_dport = int.from_bytes(ip[header + 2 : header + 4], "big")
            if ip[9] == 17 and udp_dport == 4791 and socket.inet_ntoa(ip[12:16]) == source:
                bth = ip[header + 8 :]
                udp_length = int.from_bytes(ip[header + 4 : header + 6], "big")
                payload = udp_length - 8 - 12 - 4 - _EXTENDED.get(bth[0] & 0x1F, 0)
                pkey = int.from_bytes(bth[2:4], "big")
                seen.append(Packet(bth[0], ip[1], pkey, payload))
    return seen


# RC opcodes' headers between the BTH and the payload (IBTA vol. 1, table 35): ImmDt (4) on
# a SEND or RDMA WRITE last or only with immediate, RETH (16) on an RDMA WRITE first or only
# and a READ request, both on a WRITE only with immediate, AETH (4) on a READ response's
# first, last or only packet and on an ACK.
_EXTENDED = {0x03: 4, 0x05: 4, 0x06: 16, 0x09: 4, 0x0A: 16, 0x0B: 20, 0x0C: 16}
_EXTENDED.update({0x0D: 4, 0x0F: 4, 0x10: 4, 0x11: 4})


def sniffed_ping(testbed, *args: str) -> tuple[subprocess.CompletedProcess, list[Packet]]:
    """A ping from rxe0 to the peer server, and what the sniffer saw of its packets."""
    done, result = threading.Event(), []
    sniffer = threading.Thread(
        target=lambda: result.extend(roce_v2_packets(testbed["netdev"], testbed["ipv4"], done))
    )
    sniffer.start()
    try:
        proc = ping("--dev", testbed["device"], "-j", "-c", "5", "-i", "0", *args)
    finally:
        done.set()
        sniffer.join(10)
    return proc, result


def test_tclass_is_the_ds_field_of_the_packets_sent(peer_server, testbed):
    proc, packets = sniffed_ping(testbed, "--tclass", "104")
    report = json.loads(proc.stdout)
    assert (report["received"], report["tclass"], report["sl"]) == (5, 104, 0), proc.stderr
    tos = {p.tos for p in packets}
    assert tos == {104}, packets  # DSCP 26 (AF31), ECN 0: every packet


def test_the_pkey_of_the_index_asked_for_is_in_every_packets_bth(peer_server, testbed):
    table = f"/sys/class/infiniband/{testbed['device']}/ports/1/pkeys"
    pkey = int(open(f"{table}/0").read(), 16)
    proc, packets = sniffed_ping(testbed, "--pkey-index", "0")
    report = json.loads(proc.stdout)
    assert report["received"] == 5, proc.stderr
    assert (report["pkey_index"], report["pkey"]) == (0, f"0x{pkey:04x}")
    assert packets and {p.pkey for p in packets} == {pkey}, packets


@pytest.mark.parametrize("side", ["client", "server"])
def test_a_pkey_index_outside_the_table_is_one_error_naming_it(testbed, side):
    table = f"/sys/class/infiniband/{testbed['device']}/ports/1/pkeys"
    slots = len(os.listdir(table))
    where = ["--server", "--port", str(PORT + 2)] if side == "server" else ["127.0.0.1"]
    proc = ibtool("ping", *where, "--pkey-index", str(slots), timeout=60)
    assert (proc.returncode, proc.stdout) == (4, ""), proc.stderr
    assert proc.stderr.startswith(
        f"ibtool: error: {testbed['device']}/1 has no P_Key index {slots}: {table} has "
    ), proc.stderr
    assert "(hint: populated: index 0 (0x" in proc.stderr and proc.stderr.count("\n") == 1


def test_hw_timestamps_on_rxe_are_refused_with_the_devices_figures():
    proc = ping("-c", "1", "--hw-timestamps")  # no server needed: refused before connecting
    assert (proc.returncode, proc.stdout) == (6, ""), proc.stderr
    assert proc.stderr.startswith("ibtool: error: rxe0 does not timestamp its completions ")
    assert len(proc.stderr.splitlines()) == 1

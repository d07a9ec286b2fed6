"""`ibtool ping` at its edges: a command line it cannot serve, a port taken, an address not this
host's, peers that reset, hang or send escape sequences, a run that ends early, and signals;
what each prints and exits with (ibtool-ping(8) EXIT STATUS).

Client and server run in this process on the fake pyverbs (pyverbs_fakes.py), the live host's
sysfs being the mlx5_roce tree (fake_host.py); the misbehaving peers are TCP servers in threads.
The signalled processes run tests/unit/fake_host.py, client and server in one process.
"""

from __future__ import annotations

import json
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import unicodedata
from pathlib import Path

import pytest

from ibtool.errors import ExitCode
from ibtool.rdma import wire
from ibtool.rdma.ping import acceptor
from ibtool.rdma.ping import client as native
from ibtool.rdma.ping import server as ping_server
from ibtool.rdma.ping.options import ServeOptions
from tests.fixtures.peers import EVIL, EVIL_SHOWN, Peer, resets, sends_escapes
from tests.unit.fake_host import ROCE_GID

REPO = Path(__file__).resolve().parents[2]
HEADER = (
    "PING 127.0.0.1 over mlx5_0/1 gid 3: 64 bytes, mode send, mtu 1024, sl 0, tclass 0, "
    "pkey 0xffff (index 0)\n"
)
VERBS_ONLY = "uses this host's RDMA devices through verbs; --root trees hold only sysfs"
# ESC sequences that recolour and retitle the terminal, a line forged after a newline, a
# carriage return, a bidi override, a C1 CSI (0x9b) clearing the screen, then far too much.


@pytest.fixture
def roce(fake_pyverbs, live_roce):
    """ibtool on a host whose mlx5_0/1 is RoCE (GID 3 is the v2 one), verbs faked."""
    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=2, gids={3: ROCE_GID})
    return live_roce


def unsafe(text: str) -> set[str]:
    """The characters of `text` that could drive a terminal or start a line, but newlines."""
    return {c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")}


# -- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize("port", ["70000", "-1", "0"])
@pytest.mark.parametrize("side", [["--server"], ["127.0.0.1"]], ids=["server", "client"])
def test_a_port_out_of_range_is_a_usage_error(roce, side, port):
    r = roce("ping", *side, "--port", port)
    assert (r.code, r.out) == (ExitCode.USAGE, "")
    assert r.err.startswith("usage: ibtool ping ")  # refused as the command line is parsed
    assert r.err.endswith(
        f"ibtool ping: error: argument --port: must be 1 to 65535, not {port} "
        "(hint: leave --port out for the default, 18520)\n"
    )


@pytest.mark.parametrize(
    "argv", [["loopback"], ["ping", "--server"], ["ping", "127.0.0.1"]], ids=" ".join
)
def test_root_is_refused_by_the_commands_that_open_verbs(fake_pyverbs, mlx5_roce, argv):
    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=2, gids={3: ROCE_GID})  # there, yet not used
    r = mlx5_roce(*argv)
    assert (r.code, r.out) == (ExitCode.USAGE, "")
    assert r.err == f"ibtool: error: ibtool {argv[0]} {VERBS_ONLY}\n"


# -- the server's listener -------------------------------------------------------------------


def test_a_port_in_use_is_one_line_with_a_hint(roce):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        r = roce("ping", "--server", "--bind", "127.0.0.1", "--port", str(port))
    assert (r.code, r.out) == (ExitCode.FAILED, "")
    assert r.err == (
        f"ibtool: error: cannot listen on 127.0.0.1:{port}: Address already in use (hint: "
        "another program has the port, perhaps another `ibtool ping --server` (`ss -ltnp` "
        "shows which): stop it, or give both sides another --port)\n"
    )


def test_bind_to_an_address_of_another_host_is_a_usage_error(roce):
    try:
        with open("/proc/sys/net/ipv4/ip_nonlocal_bind") as f:
            if f.read().strip() != "0":
                pytest.skip("net.ipv4.ip_nonlocal_bind is set: any address can be bound")
    except OSError:
        pass
    r = roce("ping", "--server", "--bind", "192.0.2.1")  # TEST-NET-1 (RFC 5737)
    assert (r.code, r.out) == (ExitCode.USAGE, "")
    assert r.err == (
        "ibtool: error: --bind 192.0.2.1: not an address of this host "
        "(hint: give one of this host's addresses (`ip address`), or leave --bind out)\n"
    )


@pytest.mark.parametrize("bind", ["300.1.2.3", "1:2:3", "no-such-host.invalid"])
def test_bind_to_what_is_not_an_address_is_a_usage_error(roce, bind):
    r = roce("ping", "--server", "--bind", bind)
    assert (r.code, r.out) == (ExitCode.USAGE, "")
    assert r.err.startswith(f"ibtool: error: --bind {bind}: not an address (")
    assert r.err.endswith(
        "(hint: give an address of this host, or leave --bind out to listen on all of them)\n"
    )
    assert r.err.count("\n") == 1


# -- misbehaving peers -----------------------------------------------------------------------


def test_a_peer_that_resets_is_one_line_with_a_hint(roce):
    with Peer(resets(10)) as peer:
        r = roce("ping", "127.0.0.1", "--port", str(peer.port), "-c", "1")
    assert (r.code, r.out) == (ExitCode.FAILED, HEADER)
    assert r.err == (
        "ibtool: error: peer reset the connection (hint: the ping server at "
        f"127.0.0.1:{peer.port} stopped or dropped this client; its log says why)\n"
    )


def test_a_peer_that_hangs_is_left_after_the_handshake_timeout(roce, monkeypatch):
    monkeypatch.setattr(native, "HANDSHAKE_TIMEOUT", 0.3)
    leave = threading.Event()
    with Peer(lambda conn: leave.wait(30)) as peer:
        t0 = time.monotonic()
        r = roce("ping", "127.0.0.1", "--port", str(peer.port), "-c", "1")
        took = time.monotonic() - t0
        leave.set()
    assert (r.code, r.out) == (ExitCode.DATA_ERROR, HEADER)
    assert r.err == (
        "ibtool: error: peer too slow: handshake timed out (hint: is what listens at "
        f"127.0.0.1:{peer.port} an `ibtool ping --server` of this version?)\n"
    )
    assert took < 10


def test_a_peers_escape_sequences_are_shown_escaped_and_cut(roce):
    with Peer(sends_escapes(10)) as peer:
        r = roce("ping", "127.0.0.1", "--port", str(peer.port), "-c", "1")
    assert r.code == ExitCode.FAILED  # no reply
    assert unsafe(r.out) == set() and unsafe(r.err) == set()
    prefix = "ibtool: warning: seq=1 lost: peer says: "
    (line,) = r.err.splitlines()  # one line: the newline the peer sent is not one
    assert line.startswith(prefix + EVIL_SHOWN)
    assert line.endswith("...") and len(line) == len(prefix) + wire.MAX_TEXT + len("...")
    assert r.out.startswith(HEADER) and "1 sent, 0 received, 100% loss" in r.out


def test_a_peers_escape_sequences_are_escaped_in_json_too(roce):
    with Peer(sends_escapes(10)) as peer:
        r = roce("-j", "ping", "127.0.0.1", "--port", str(peer.port), "-c", "1")
    (reply,) = r.json["replies"]
    assert reply["error"].startswith("peer says: " + EVIL_SHOWN)
    assert unsafe(reply["error"]) == set()


def test_the_server_logs_a_clients_escape_sequences_escaped(fake_pyverbs, monkeypatch):
    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=2, gids={3: ROCE_GID})
    server = PingServer(monkeypatch)
    endpoint = wire.Endpoint(0x99, 1, 0, 3, bytes(15) + b"\x01", 0x1000, 1, 64, wire.Mode.SEND)
    with server, socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
        c.sendall(wire.encode_endpoint(endpoint))
        wire.receive(c, 10, wire.MessageType.ENDPOINT)
        c.sendall(wire.encode_error(EVIL))  # instead of READY
    assert server.error is None, server.error
    assert all(unsafe(line) == set() for line in server.log)
    (not_ready,) = [line for line in server.log if "not ready" in line]
    assert re.fullmatch(
        r"client 127\.0\.0\.1:\d+: connection not ready: peer says: "
        + re.escape(EVIL_SHOWN)
        + r"x*\.\.\.",
        not_ready,
    )
    assert server.log[-1].endswith(" done: 0 pings answered")


def test_wire_printable_leaves_text_alone_and_escapes_the_rest():
    assert wire.printable("QP 0x11: no route to 10.0.0.2 (ENETUNREACH) – é ü") == (
        "QP 0x11: no route to 10.0.0.2 (ENETUNREACH) – é ü"
    )
    assert wire.printable("a\tb\x00c\x7fd\x85e\u2028f\u200bg") == (
        "a\\tb\\x00c\\x7fd\\x85e\\u2028f\\u200bg"
    )
    assert wire.printable("x" * 10, limit=10) == "x" * 10
    assert wire.printable("x" * 11, limit=10) == "x" * 10 + "..."
    assert wire.printable("xxxxxxxx\x1b", limit=10) == "xxxxxxxx..."  # no escape cut in half


# -- a run that ends early -------------------------------------------------------------------


class PingServer(threading.Thread):
    """`ibtool ping --server` on the fake mlx5_0/1 (GID 3) for one client, in a thread; `conn`
    is the server's end of the client's TCP connection once it is accepted."""

    def __init__(self, monkeypatch):
        super().__init__(daemon=True)
        self.log: list[str] = []
        self.error: BaseException | None = None
        self.conn: socket.socket | None = None
        self._listening = threading.Event()
        listen, accept = acceptor.listen, socket.socket.accept

        def listening(bind: str, port: int) -> socket.socket:
            self.listener = listen(bind, port)
            self.port = self.listener.getsockname()[1]
            self._listening.set()
            return self.listener

        def accepting(sock: socket.socket):
            conn, addr = accept(sock)
            if sock is self.listener:
                self.conn = conn
            return conn, addr

        monkeypatch.setattr(acceptor, "listen", listening)
        monkeypatch.setattr(socket.socket, "accept", accepting)

    def run(self) -> None:
        try:
            options = dict(device="mlx5_0", device_port=1, gid_index=3, max_clients=1)
            ping_server.serve(ServeOptions("127.0.0.1", 0, self.log.append, **options))
        except BaseException as e:
            self.error = e
            self._listening.set()

    def __enter__(self) -> PingServer:
        self.start()
        assert self._listening.wait(10) and self.error is None, self.error
        return self

    def __exit__(self, *exc) -> None:
        self.join(30)
        assert not self.is_alive(), "the ping server did not finish"


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_a_server_that_leaves_mid_run_gets_the_statistics_then_the_error(
    roce, monkeypatch, json_out
):
    server = PingServer(monkeypatch)
    pinged = native.Client.ping

    def ping_then_the_server_leaves(client, seq):
        rtt = pinged(client, seq)
        if seq == 2:  # the server leaves: its QP goes, then the TCP connection
            server.conn.shutdown(socket.SHUT_RDWR)
            deadline = time.monotonic() + 30
            while not server.log[-1].endswith(" done: 2 pings answered"):
                assert time.monotonic() < deadline, server.log
                time.sleep(0.01)
        return rtt

    monkeypatch.setattr(native.Client, "ping", ping_then_the_server_leaves)
    argv = ["ping", "127.0.0.1", "-c", "50", "-i", "0", "-W", "0.5"]
    with server:
        r = roce(*(["-j"] if json_out else []), *argv, "--port", str(server.port))
    assert r.code == ExitCode.FAILED, r
    error = re.escape(f" (hint: the ping server at 127.0.0.1:{server.port} stopped or dropped")
    assert re.search(r"ibtool: error: peer (closed|reset) the connection" + error, r.err), r.err
    assert r.err.count("ibtool: error: ") == 1 and r.err.endswith("its log says why)\n")
    if json_out:
        report = r.json
        assert re.fullmatch("peer (closed|reset) the connection", report["error"])
        sent, received = report["sent"], report["received"]
        assert len(report["replies"]) == sent
    else:
        lines = r.out.splitlines()
        assert lines[0] == HEADER.rstrip("\n")
        assert lines[-3] == "--- 127.0.0.1 ibtool ping statistics ---", r.out
        m = re.fullmatch(r"(\d+) sent, (\d+) received, \d+% loss, time \d+ ms", lines[-2])
        sent, received = int(m[1]), int(m[2])
        assert lines[-1].startswith("rtt min/avg/median/max/mdev = ")
        assert sum("bytes from 127.0.0.1: seq=" in line for line in lines) == received
    assert (sent, received) == (3, 2)  # the ping after it left was lost; then the error
    assert server.log[-1].endswith(" done: 2 pings answered")


# -- signals ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_fake_host(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.unit.fake_host", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_lines(proc: subprocess.Popen, enough, timeout: float = 60) -> list[str]:
    """Lines of the process's standard output until `enough(lines)` says so."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while not enough(lines):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise AssertionError(f"got {lines}, then {proc.communicate(timeout=30)}")
        if sel.select(timeout=0.5):
            lines.append(proc.stdout.readline())
    return lines


def signalled(proc: subprocess.Popen, sig: int) -> tuple[str, str]:
    try:
        proc.send_signal(sig)
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


SIGNALS = [
    (signal.SIGINT, ExitCode.INTERRUPTED, "ibtool: interrupted\n"),
    (signal.SIGTERM, ExitCode.TERMINATED, "ibtool: terminated\n"),
]


@pytest.mark.parametrize("sig, code, said", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_server_with_its_code(sig, code, said):
    port = free_port()
    proc = on_fake_host("ping", "--server", "--bind", "127.0.0.1", "--port", str(port))
    first = read_lines(proc, lambda lines: lines)
    assert first == [f"listening on 127.0.0.1:{port}, mlx5_0/1 gid 3, pkey 0xffff (index 0)\n"]
    out, err = signalled(proc, sig)
    assert (proc.returncode, out, err) == (code, "server stopped\n", said)


@pytest.mark.parametrize(
    "sig, code, said",
    [
        (signal.SIGINT, ExitCode.OK, ""),
        (signal.SIGTERM, ExitCode.TERMINATED, "ibtool: terminated\n"),
    ],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_signal_to_the_client_mid_run_still_prints_the_statistics(sig, code, said):
    port = free_port()
    proc = on_fake_host(
        "--serve", str(port), "ping", "127.0.0.1", "--port", str(port), "-i", "0.05"
    )
    head = read_lines(proc, lambda lines: sum(" bytes from " in line for line in lines) >= 2)
    out, err = signalled(proc, sig)
    lines = "".join(head + [out]).splitlines()
    assert (proc.returncode, err) == (code, said)
    assert lines[0] == HEADER.rstrip("\n")
    assert lines[-3] == "--- 127.0.0.1 ibtool ping statistics ---"
    m = re.fullmatch(r"(\d+) sent, (\d+) received, \d+% loss, time \d+ ms", lines[-2])
    assert m and int(m[1]) - int(m[2]) in (0, 1)  # a ping in flight is lost, as in ping(8)
    assert lines[-1].startswith("rtt min/avg/median/max/mdev = ")


def test_json_summary_has_no_error_key_without_an_error(roce, monkeypatch):
    with PingServer(monkeypatch) as server:
        r = roce("-j", "ping", "127.0.0.1", "--port", str(server.port), "-c", "2", "-i", "0")
    assert r.code == ExitCode.OK, r.err
    assert list(r.json) == [
        "host",
        "compat",
        "cm",
        "mode",
        "mtu",
        "sl",
        "tclass",
        "pkey_index",
        "pkey",
        "sent",
        "received",
        "loss_pct",
        "time_ms",
        "rtt_us",
        "replies",
    ]
    assert json.loads(r.out)["received"] == 2
    assert (r.json["compat"], r.json["mtu"], r.json["sl"], r.json["tclass"]) == (None, 1024, 0, 0)
    assert (r.json["pkey_index"], r.json["pkey"]) == (0, "0xffff")


# -- a server at another address of this host ------------------------------------------------


def _looped(route_type, target="192.168.77.2", link="Ethernet", gid="::ffff:192.168.77.1"):
    import ipaddress
    from types import SimpleNamespace

    from ibtool_plugins.ping.protocols import through_lo

    from ibtool.errors import IbtoolError
    from ibtool.model.records import LinkLayer
    from ibtool.model.system import Route

    asked = []

    def route(dst, src=None):
        asked.append((dst, src))
        if route_type == "error":
            raise IbtoolError("netlink: permission denied")
        return Route(dst, "lo" if route_type == "local" else "veth0", src, None, route_type)

    layer = {"Ethernet": LinkLayer.ETHERNET, "InfiniBand": LinkLayer.INFINIBAND}[link]
    ladder = SimpleNamespace(link_layer=layer, device="rxe0", port=1,
                             gid=ipaddress.IPv6Address(gid).packed)  # fmt: skip
    return through_lo(SimpleNamespace(route=route), ladder, target), asked


def test_ping_notes_a_server_the_kernel_reaches_through_lo():
    """rxe0 (192.168.77.1) pinging rxe1's 192.168.77.2 in one subnet, no table of their own:
    the pings answer through lo and never leave the host, as ibtool mesh says of such pairs."""
    note, asked = _looped("local")
    assert asked == [("192.168.77.2", "192.168.77.1")]
    assert note.startswith(
        "the kernel routes 192.168.77.2, this host's own address, through lo from "
        "192.168.77.1 (rxe0/1's): the pings never leave this host"
    )
    assert "accept_local=1" in note


@pytest.mark.parametrize(
    "case",
    [
        dict(route_type="unicast"),  # through veth0: the switch, as meant
        dict(route_type="error"),  # the kernel not asked: nothing said
        dict(route_type="local", target="192.168.77.1"),  # its own port: a loopback test
        dict(route_type="local", target="127.0.0.1"),
        dict(route_type="local", target="peer.example"),  # a name: its GID decides
        dict(route_type="local", link="InfiniBand"),  # by LID, not routes
        dict(route_type="local", target="fd77::2"),  # another family than the GID's
    ],
)
def test_ping_says_nothing_where_the_path_is_not_looped(case):
    assert _looped(**case)[0] is None

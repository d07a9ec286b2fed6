"""The agents' way back to the coordinator (ibtool.mesh.channel): the listener facing the
network holds against strangers, each agent gets its own slice of the plan, and the fan-out
through ClusterShell's window runs 200 agents in a process that may open 256 files."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ibtool.mesh import channel
from ibtool.mesh.engines import EXIT, LINE
from ibtool.mesh.protocol import MAX_LINE, VERSION
from tests.unit.mesh_fake import FakeCluster
from tests.unit.test_mesh import _run

DOUBLE = Path(__file__).with_name("mesh_agent_double.py")
ROOT = Path(__file__).resolve().parents[2]


def _rendezvous(**kw) -> tuple[channel.Rendezvous, queue.Queue]:
    events: queue.Queue = queue.Queue()
    kw.setdefault("tokens", {"n1": "a" * 32, "n2": "b" * 32})
    r = channel.Rendezvous(events, listen=("127.0.0.1", 0), **kw)
    r.start()
    return r, events


def _connect(r: channel.Rendezvous) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", r.port), timeout=10)
    s.settimeout(10)
    return s


def _closed(s: socket.socket) -> bool:
    """Whether the other end closed it (EOF or a reset), not answered."""
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True


def _join(key, tok, **extra) -> bytes:
    msg = {"t": "join", "v": VERSION, "token": tok, **({"key": key} if key else {}), **extra}
    return (json.dumps(msg) + "\n").encode()


def _wait(pred, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, what
        time.sleep(0.01)


@pytest.mark.parametrize(
    "line",
    [
        _join("n1", "b" * 32),  # n2's token for n1
        _join("n1", "a" * 31),
        _join("n9", "a" * 32),  # a key never given
        _join(None, "a" * 32),  # no key, no shared token
        _join("n1", "a" * 32, v=1),
        b'{"t":"hello"}\n',
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\xff\xfe" * 10 + b"\n",
        b"[" * 400 + b"\n",
        b"x" * (channel.MAX_JOIN + 10),  # no newline, over the bound
    ],
    ids=lambda v: v[:24].decode("latin-1"),
)
def test_a_stranger_is_closed_unanswered_and_counted(line):
    r, events = _rendezvous()
    try:
        s = _connect(r)
        s.sendall(line)
        assert _closed(s)
        _wait(lambda: r.strangers == 1, "the stranger counted")
        assert r.joined == {} and events.empty()
        # the real agent still joins after it
        good = _connect(r)
        good.sendall(_join("n1", "a" * 32))
        assert good.recv(100) == channel.WELCOME
    finally:
        r.close()


def test_a_token_is_good_for_one_connection():
    r, _ = _rendezvous()
    try:
        first = _connect(r)
        first.sendall(_join("n1", "a" * 32))
        assert first.recv(100) == channel.WELCOME
        second = _connect(r)
        second.sendall(_join("n1", "a" * 32))
        assert _closed(second)
        _wait(lambda: r.strangers == 1, "the second use refused")
        assert list(r.joined) == ["n1"]
    finally:
        r.close()


def test_a_connection_that_never_joins_is_dropped_after_its_time(monkeypatch):
    monkeypatch.setattr(channel, "JOIN_TIMEOUT", 0.3)
    r, _ = _rendezvous()
    try:
        s = _connect(r)
        s.sendall(b'{"t":"jo')  # half a join, then nothing
        assert _closed(s)
        assert r.first_stranger == "127.0.0.1 (no join in time)"
    finally:
        r.close()


def test_a_flood_of_idle_connections_costs_at_most_max_pending_and_an_agent_still_joins(
    monkeypatch,
):
    monkeypatch.setattr(channel, "MAX_PENDING", 8)
    r, _ = _rendezvous()
    flood = []
    try:
        for _ in range(40):
            flood.append(_connect(r))
        _wait(lambda: r.strangers >= 32, "the oldest idle connections dropped")
        assert len(r.pending) <= 8
        good = _connect(r)
        good.sendall(_join("n2", "b" * 32))
        assert good.recv(100) == channel.WELCOME
    finally:
        for s in flood:
            s.close()
        r.close()


def test_srun_tasks_join_with_the_shared_token_and_their_task_numbers():
    r, _ = _rendezvous(tokens=None, shared="c" * 32, tasks=2)
    held = []
    try:
        for task, want in ((1, channel.WELCOME), (2, b""), (True, b""), (1, b"")):
            s = _connect(r)
            held.append(s)
            s.sendall(_join(None, "c" * 32, task=task))
            got = s.recv(100) if want else (b"" if _closed(s) else b"?")
            assert got == want, task
        assert list(r.joined) == ["task1"]
        held[0].close()  # task 1 leaves: its place is not taken again
        _wait(lambda: not r.joined, "task 1 gone")
        s = _connect(r)
        s.sendall(_join(None, "c" * 32, task=1))
        assert _closed(s)
    finally:
        r.close()


def test_a_joined_agent_s_lines_are_bounded_and_its_end_is_said():
    r, events = _rendezvous()
    try:
        s = _connect(r)
        s.sendall(_join("n1", "a" * 32) + b'{"t":"ready"}\n')
        assert s.recv(100) == channel.WELCOME
        ev = events.get(timeout=10)
        assert (ev.node, ev.kind, ev.data, ev.origin) == ("n1", LINE, '{"t":"ready"}', "channel")
        s.sendall(b"x" * (MAX_LINE + 100))
        ev = events.get(timeout=10)
        assert ev.kind == LINE and len(ev.data) == MAX_LINE + 1  # cut: garbage to the mesh
        ev = events.get(timeout=10)
        assert (ev.node, ev.kind) == ("n1", EXIT) and _closed(s)
    finally:
        r.close()


def test_the_listener_closes_once_every_agent_joined():
    r, _ = _rendezvous()
    try:
        for key, tok in (("n1", "a" * 32), ("n2", "b" * 32)):
            s = _connect(r)
            s.sendall(_join(key, tok))
            assert s.recv(100) == channel.WELCOME
            s.close()  # one that joined and left counts as joined
        _wait(lambda: r.listener is None, "the listener closed")
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", r.port), timeout=5)
    finally:
        r.close()


@pytest.mark.parametrize(
    "text,want",
    [(":18600", ("", 18600)), ("10.0.0.1", ("10.0.0.1", 0)), ("10.0.0.1:5", ("10.0.0.1", 5)),
     ("[fe80::1]:7", ("fe80::1", 7)), ("::1", ("::1", 0))],
)  # fmt: skip
def test_listen_takes_an_address_a_port_or_both(text, want):
    assert channel.parse_listen(text) == want


@pytest.mark.parametrize("text", ["node1:5", "10.0.0.1:0", "10.0.0.1:70000", "[::1]x"])
def test_listen_refuses_what_is_not_an_address_and_port(text):
    with pytest.raises(ValueError):
        channel.parse_listen(text)


def test_the_agent_finds_its_coordinator_where_ssh_or_srun_came_from():
    ssh = {"SSH_CONNECTION": "10.1.0.5 51022 10.1.0.9 22"}
    srun = {"SLURM_LAUNCH_NODE_IPADDR": "10.2.0.1"}
    assert channel.coordinator_address("", ssh) == "10.1.0.5"
    assert channel.coordinator_address("", srun) == "10.2.0.1"
    assert channel.coordinator_address("10.3.0.1", ssh) == "10.3.0.1"
    assert channel.coordinator_address("", {"SSH_CONNECTION": "x; reboot"}) is None


@pytest.mark.parametrize("line", [b"", b"garbage\n", b'{"t":"join","token":"../x"}\n',
                                  b'{"t":"join","token":"' + b"a" * 200 + b'"}\n'])  # fmt: skip
def test_an_agent_without_a_good_join_on_its_stdin_says_so(line):
    from ibtool.errors import IbtoolError

    with pytest.raises(IbtoolError, match="starts with the coordinator's join"):
        channel.read_join(line)


# -- each agent its own plan -----------------------------------------------------------------


def test_each_agent_gets_only_the_endpoints_it_meets():
    """64 nodes x 4 rails, --rounds 4 (shifts 1, 16, 32 and 48): an agent's plan holds its 4
    endpoints and the 5 each meets (+1, -1, +16, +32, +48 along its rail: whom it pings and
    who pings it), not the 256; the simulation checks every plan has what its agent's
    rounds need (FakeCluster._whole)."""
    full = FakeCluster(64, 4)
    _run(full)
    part = FakeCluster(64, 4)
    result, _ = _run(part, rounds=4)
    assert result.verdicts == [] and len(result.pairs) == 64 * 4 * 4
    assert max(len(p["endpoints"]) for p in part._slices.values()) == 4 + 4 * 5
    assert part.plan_max * 4 < full.plan_max
    # probed whole, an agent needs its rails' every endpoint: one text for all, made once
    assert len({id(m) for m in full._slices.values()}) == 1


# -- the fan-out at scale --------------------------------------------------------------------

COORDINATOR = """
import resource, sys, time
sys.path.insert(0, {root!r})
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from ibtool.mesh.engines import ClusterShellEngine
from ibtool.mesh.run import Options, mesh
engine = ClusterShellEngine("n[1-200]", remote=False)
t0 = time.monotonic()
result = mesh(engine, Options(count=5, rounds=2, quiet=0.0), [sys.executable, {double!r}, "%h"],
              lambda line: print(line, flush=True), listen=("127.0.0.1", 0))
print("window", engine.window, "endpoints", len(result.endpoints), "pairs",
      len(result.pairs), "verdicts", len(result.verdicts), "unreachable",
      len(result.unreachable), "seconds", round(time.monotonic() - t0, 1), flush=True)
"""


def test_200_agents_through_clustershell_in_a_process_that_may_open_256_files():
    """The window shrinks to what the open files left beside 200 joined agents allow (10
    ssh at a time), every agent joins and leaves its starter, and the mesh runs whole."""
    pytest.importorskip("ClusterShell")
    script = COORDINATOR.format(root=str(ROOT), double=str(DOUBLE))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.splitlines()[-1].split()
    figures = dict(zip(last[::2], last[1::2]))
    assert figures["window"] == "10", proc.stdout
    assert (figures["endpoints"], figures["pairs"]) == ("200", "400"), proc.stdout
    assert (figures["verdicts"], figures["unreachable"]) == ("0", "0"), proc.stdout
    # the agents left their starters, and ended with the mesh: none outlives it
    _wait(lambda: not _doubles(), "every detached agent gone", timeout=60)


def _doubles() -> list[str]:
    """The processes running the agent double now (detached ones included)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(DOUBLE).encode() in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def test_a_listen_address_that_is_not_this_host_s_is_one_usage_error():
    from ibtool.errors import UsageError

    with pytest.raises(UsageError, match="cannot listen for its agents on 192.0.2.1:") as e:
        channel.Rendezvous(queue.Queue(), tokens={"n1": "a" * 32}, listen=("192.0.2.1", 0))
    assert "--listen ADDR[:PORT]" in e.value.hint


def test_an_engine_that_cannot_start_leaves_no_listener(monkeypatch):
    from ibtool.errors import UsageError
    from ibtool.mesh.engines import LocalEngine

    engine = LocalEngine()

    def refuse(argv, joins):
        raise UsageError("2 nodes need about 29 open files", "raise the hard limit")

    monkeypatch.setattr(engine, "start", refuse)
    link = channel.Link(engine)
    with pytest.raises(UsageError):
        link.start(["ibtool"])
    assert link.rendezvous is None


# -- the agent's side, against a coordinator that is not one --------------------------------


@pytest.mark.parametrize("answer", [b"", b"HTTP/1.1 400 Bad Request\r\n\r\n", b"\x00" * 64,
                                    b'{"t":"welcome"}'])  # fmt: skip
def test_an_agent_joins_nothing_but_a_coordinator_s_welcome(answer):
    """A listener that closes, speaks another protocol, sends garbage or a welcome without
    its line end: one error, the socket closed, nothing followed."""
    from ibtool.errors import IbtoolError

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(answer)

    import threading

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(IbtoolError, match="did not take this agent's join"):
            channel.join("127.0.0.1", port, {"token": "a" * 32, "key": "n1"}, timeout=10)
    finally:
        t.join(10)
        listener.close()


def test_an_agent_that_finds_no_coordinator_says_how_to_let_it_through():
    from ibtool.errors import IbtoolError

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there now
    with pytest.raises(IbtoolError, match="cannot reach the mesh's coordinator") as e:
        channel.join("127.0.0.1", port, {"token": "a" * 32, "key": "n1"}, timeout=10)
    assert "--listen" in e.value.hint

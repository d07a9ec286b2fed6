"""The agents' way back to the coordinator: a TCP listener on the coordinator's host that each
agent connects to as it starts, proving with the token the engine gave it on its standard
input (never on its command line, which `ps` on its node would show) that it is an agent this
coordinator started. From its join on, the coordinator talks to each agent over its own
connection: each gets its own slice of the plan, and the engine carries nothing but the start.
A mesh then holds one descriptor an agent, not an ssh's three pipes for its whole length, and
ClusterShell starts the agents through a window of ssh at a time (--fanout): an agent that
joined leaves its ssh (agent.py, detach).

The listener faces the network, so whoever connects is a stranger until its join is right:
- at most MAX_PENDING connections wait for their join at once (the oldest is dropped for a
  new one), each JOIN_TIMEOUT seconds at most, its join line MAX_JOIN bytes at most;
- a token is compared in constant time (hmac.compare_digest), is good for one join (an agent
  that left cannot come back, nor anyone with its token), and a wrong one is closed at once,
  counted, never answered;
- an agent's lines are bounded as on any engine (protocol.MAX_LINE): a longer one is handed
  on cut (the coordinator drops the node for it) and the connection closed;
- nothing is listened for once every agent joined, or when the coordinator says so.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import os
import queue
import secrets
import selectors
import socket
import threading
import time

from ibtool.errors import IbtoolError, UsageError
from ibtool.mesh.engines import EXIT, LINE, STDERR, Event
from ibtool.mesh.protocol import MAX_LINE, VERSION

MAX_PENDING = 64  # connections waiting for their join at once
JOIN_TIMEOUT = 10.0  # s from a connection to its join (an agent sends it at once)
MAX_JOIN = 1024  # bytes of a join line
SEND_TIMEOUT = 30.0  # s a message to one agent may take to leave (its socket's buffer full)
MAX_TASKS = 1 << 20  # a srun task number
CHANNEL = "channel"  # an Event's origin: an agent's connection, not its engine
EXIT_WAIT = 2.0  # s a connection's end waits for the engine's word of its exit code
WELCOME = b'{"t":"welcome"}\n'  # the coordinator's answer to a join it took


def token() -> str:
    return secrets.token_hex(16)


def parse_listen(text: str) -> tuple[str, int]:
    """--listen: ADDR, :PORT, ADDR:PORT or [IPv6]:PORT; (address or "", port or 0)."""
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"{text!r}: not ADDR[:PORT]")
        port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    if host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{text!r}: {host} is not an IP address") from None
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{text!r}: {port} is not a TCP port")
    return host, int(port or 0)


class _Conn:
    __slots__ = ("sock", "peer", "key", "buf", "deadline", "lock")

    def __init__(self, sock: socket.socket, peer: str, deadline: float):
        self.sock, self.peer, self.deadline = sock, peer, deadline
        self.key: str | None = None  # once joined
        self.buf = bytearray()
        self.lock = threading.Lock()  # one sender at a time


class Rendezvous:
    """Where the agents join: `tokens` (the engine's key of a node -> the token it was
    given), or one `shared` token that `tasks` agents present, each with its srun task number
    (key "taskN"). Events go to `events`, the engine's queue: a line (LINE) of a joined
    agent, its connection's end (EXIT, None)."""

    def __init__(self, events: queue.Queue, tokens: dict[str, str] | None = None,
                 shared: str | None = None, tasks: int = 0, listen: tuple[str, int] = ("", 0),
                 clock=time.monotonic):  # fmt: skip
        self.events, self.clock = events, clock
        self.tokens = dict(tokens or {})
        self.shared, self.tasks = shared, tasks
        self.expected = len(self.tokens) + (tasks if shared else 0)
        self.joined: dict[str, _Conn] = {}
        self.ever: set[str] = set()  # keys that joined, whether still connected or not
        self.pending: dict[int, _Conn] = {}
        self.strangers = 0  # connections closed for a wrong or missing join
        self.first_stranger: str | None = None
        self.listener = self._listen(*listen)  # first: a refused address leaves nothing
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = False
        self._lock = threading.Lock()
        self.sel.register(self.listener, selectors.EVENT_READ, "listener")
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._loop, name="mesh rendezvous", daemon=True)

    @staticmethod
    def _listen(host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
        candidates = [(family, host)] if host else [(socket.AF_INET6, "::"), (socket.AF_INET, "")]
        last: OSError | None = None
        for fam, addr in candidates:
            try:
                sock = socket.socket(fam, socket.SOCK_STREAM)
            except OSError as e:  # no IPv6 in this kernel: IPv4 alone
                last = e
                continue
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if fam == socket.AF_INET6 and not host:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind((addr, port))
                sock.listen(128)
                sock.setblocking(False)
                return sock
            except OSError as e:
                sock.close()
                last = e
        where = f"{host or '*'}:{port or 'any port'}"
        raise UsageError(
            f"the mesh cannot listen for its agents on {where}: "
            f"{getattr(last, 'strerror', None) or last}",
            "--listen ADDR[:PORT] with an address of this host and a free port",
        )

    def start(self) -> None:
        self.thread.start()

    # -- the coordinator's side --------------------------------------------------------------

    def send(self, key: str, data: bytes) -> bool:
        """`data` to the agent of `key`, whole, within SEND_TIMEOUT; False (and its EXIT on
        the way) when it cannot take it."""
        conn = self.joined.get(key)
        if conn is None:
            return False
        with conn.lock:
            try:
                conn.sock.sendall(data)
                return True
            except OSError:
                pass
        # the reader sees the end and says it (EXIT): a socket shut both ways reads EOF
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)
        return False

    def broadcast(self, data: bytes) -> None:
        for key in list(self.joined):
            self.send(key, data)

    def stop_listening(self) -> None:
        with self._lock:
            if self.listener is not None:
                self._unregister(self.listener)
                self.listener.close()
                self.listener = None
        self._wake()

    def close(self) -> None:
        """Every connection closed (its agent reads EOF and ends), the listener too."""
        self._stop = True
        self._wake()
        if self.thread.is_alive():
            self.thread.join(10)
        with self._lock:
            for conn in [*self.pending.values(), *self.joined.values()]:
                with contextlib.suppress(OSError):
                    conn.sock.close()
            self.pending.clear()
            self.joined.clear()
            if self.listener is not None:
                self.listener.close()
                self.listener = None
        self.sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- the listener's thread -----------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop:
            now = self.clock()
            waits = [c.deadline - now for c in self.pending.values()]
            timeout = max(0.0, min(waits)) if waits else 1.0
            try:
                ready = self.sel.select(min(timeout, 1.0))
            except (OSError, ValueError):
                return  # closed under us: close() is on its way
            for skey, _ in ready:
                what = skey.data
                if what is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                elif what == "listener":
                    self._accept()
                elif what.key is None:
                    self._read_join(what)
                else:
                    self._read_lines(what)
            now = self.clock()
            for conn in [c for c in self.pending.values() if c.deadline <= now]:
                self._stranger(conn, "no join in time")

    def _accept(self) -> None:
        for _ in range(64):
            with self._lock:
                if self.listener is None:
                    return
                try:
                    sock, addr = self.listener.accept()
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:  # EMFILE and the like: a breath, then the next round
                    time.sleep(0.1)
                    return
            if len(self.pending) >= MAX_PENDING:
                oldest = min(self.pending.values(), key=lambda c: c.deadline)
                self._stranger(oldest, "too many connections waiting for their join")
            sock.setblocking(False)
            conn = _Conn(sock, str(addr[0]), self.clock() + JOIN_TIMEOUT)
            with self._lock:
                self.pending[sock.fileno()] = conn
                self.sel.register(sock, selectors.EVENT_READ, conn)

    def _recv(self, conn: _Conn, n: int) -> bytes | None:
        """What there is to read; b"" at its end; None: nothing yet."""
        try:
            return conn.sock.recv(n)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return None
        except OSError:
            return b""

    def _read_join(self, conn: _Conn) -> None:
        chunk = self._recv(conn, MAX_JOIN + 1 - len(conn.buf))
        if chunk is None:
            return
        if not chunk:
            self._stranger(conn, "closed before its join")
            return
        conn.buf += chunk
        nl = conn.buf.find(b"\n")
        if nl < 0:
            if len(conn.buf) > MAX_JOIN:
                self._stranger(conn, "a join line over its bound")
            return
        line, rest = bytes(conn.buf[:nl]), conn.buf[nl + 1 :]
        key = self._check(line)
        if key is None:
            self._stranger(conn, "not a mesh agent's join")
            return
        with self._lock:
            self.pending.pop(conn.sock.fileno(), None)
            conn.key, conn.buf = key, bytearray()
            conn.sock.settimeout(SEND_TIMEOUT)  # the coordinator's sends; reads only when ready
            # joined before the welcome: the agent leaves its ssh only after it, so its ssh's
            # end is never seen before its join
            self.joined[key] = conn
            self.ever.add(key)
        try:
            with conn.lock:  # an `end` the coordinator broadcasts meanwhile comes after it
                conn.sock.sendall(WELCOME)
        except OSError:
            self._end(conn)
            return
        if len(self.ever) >= self.expected:
            self.stop_listening()  # every agent is in: nobody else is waited for
        if rest:
            conn.buf += rest
            self._lines(conn)

    def _check(self, line: bytes) -> str | None:
        """The key a join stands for, or None: not JSON, not a join, a token not given or
        already used, a task number out of range or taken."""
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(msg, dict) or msg.get("t") != "join" or msg.get("v") != VERSION:
            return None
        given = msg.get("token")
        if not isinstance(given, str) or not given.isascii():
            return None
        given_b = given.encode()
        key = msg.get("key")
        tok = self.tokens.get(key) if isinstance(key, str) else None
        if tok is not None and hmac.compare_digest(tok.encode(), given_b):
            return None if key in self.ever else key
        if self.shared is not None and hmac.compare_digest(self.shared.encode(), given_b):
            task = msg.get("task")
            if isinstance(task, int) and not isinstance(task, bool) and 0 <= task < self.tasks:
                key = f"task{task}"
                return None if key in self.ever else key
        return None

    def _stranger(self, conn: _Conn, why: str) -> None:
        self.strangers += 1
        if self.first_stranger is None:
            self.first_stranger = f"{conn.peer} ({why})"
        with self._lock:
            self.pending.pop(conn.sock.fileno(), None)
            self._unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _read_lines(self, conn: _Conn) -> None:
        chunk = self._recv(conn, 1 << 16)
        if chunk is None:
            return
        if not chunk:
            self._end(conn)
            return
        conn.buf += chunk
        self._lines(conn)

    def _lines(self, conn: _Conn) -> None:
        while True:
            nl = conn.buf.find(b"\n")
            if nl < 0:
                break
            line = bytes(conn.buf[:nl])
            del conn.buf[: nl + 1]
            text = line.decode("utf-8", "replace").rstrip("\r")
            self.events.put(Event(conn.key, LINE, text, CHANNEL))
        if len(conn.buf) > MAX_LINE:  # handed on cut: the coordinator drops it as garbage
            text = conn.buf[: MAX_LINE + 1].decode("latin-1")
            self.events.put(Event(conn.key, LINE, text, CHANNEL))
            self._end(conn)

    def _end(self, conn: _Conn) -> None:
        with self._lock:
            self._unregister(conn.sock)
            if self.joined.get(conn.key) is conn:
                del self.joined[conn.key]
        with contextlib.suppress(OSError):
            conn.sock.close()
        self.events.put(Event(conn.key, EXIT, None, CHANNEL))

    def _unregister(self, sock: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.sel.unregister(sock)


# -- the coordinator's link: an engine to start the agents, their connections to talk -------


class Link:
    """What the coordinator speaks through: `engine` starts the agents (with their joins),
    a Rendezvous takes their connections. Before its join, what the engine says of a node
    (its stdout, stderr, exit) is handed on; after, only its stderr (the agent's last words
    when it dies) and its connection's lines and end."""

    def __init__(self, engine, listen: tuple[str, int] = ("", 0)):
        self.engine, self.listen = engine, listen
        self.name, self.nodes = engine.name, engine.nodes
        self.events = engine.events
        self.rendezvous: Rendezvous | None = None
        self.ending: dict[str, tuple[float, Event]] = {}  # connection ends held (get)

    def name_of(self, key: str) -> str | None:
        return self.engine.name_of(key)

    def start(self, argv: list[str]) -> None:
        host, port = self.listen
        if self.engine.name == "local" and not host:
            host = "127.0.0.1"  # this host alone: nobody else need reach it
        if self.engine.own_joins:
            tokens = {node: token() for node in self.nodes}
            joins = {node: join_line(tok, node) for node, tok in tokens.items()}
            self.rendezvous = Rendezvous(self.events, tokens=tokens, listen=(host, port))
        else:
            shared = token()
            joins = {"": join_line(shared)}
            self.rendezvous = Rendezvous(self.events, shared=shared, tasks=len(self.nodes),
                                         listen=(host, port))  # fmt: skip
        self.rendezvous.start()
        where = f"[{host}]" if ":" in host else host  # "": the node's ssh or srun says it
        argv = [*argv, "--connect", f"{where}:{self.rendezvous.port}"]
        if self.engine.detaches:
            argv.append("--detach")
        try:
            self.engine.start(argv, joins)
        except BaseException:  # too few open files, no srun, no ClusterShell: nothing left
            self.rendezvous.close()
            self.rendezvous = None
            raise

    def joined(self, key: str) -> bool:
        """Whether the node of `key` joined (it may have left since)."""
        return self.rendezvous is not None and key in self.rendezvous.ever

    def get(self, timeout: float):
        """The next event, those the engine says of a joined node left out (its ssh's end:
        the agent left it; its stdout: not where it speaks). Where the engine's processes
        are the agents themselves (srun, local), a connection's end waits up to EXIT_WAIT
        for the engine's word of the same agent, which has its exit code."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            now = time.monotonic()
            due = [key for key, (until, _) in self.ending.items() if until <= now]
            if due:
                return self.ending.pop(due[0])[1]
            wait = min([deadline, *(until for until, _ in self.ending.values())]) - now
            ev = self.engine.get(max(0.0, wait))
            if ev is None:
                if time.monotonic() >= deadline:
                    return None  # a held end is handed on by a later call
                continue
            if not ev.node or ev.kind == STDERR:
                return ev
            if ev.origin == CHANNEL:
                if ev.kind == EXIT and not self.engine.detaches:
                    self.ending[ev.node] = (time.monotonic() + EXIT_WAIT, ev)
                    continue
                return ev
            if not self.joined(ev.node):
                return ev
            if ev.kind == EXIT and self.ending.pop(ev.node, None) is not None:
                return ev  # its agent's exit code, for the end its connection said

    def send_to(self, key: str, line: str) -> None:
        if self.rendezvous is not None:
            self.rendezvous.send(key, line.encode())

    def broadcast(self, line: str) -> None:
        if self.rendezvous is not None:
            self.rendezvous.broadcast(line.encode())

    def close(self, grace: float) -> None:
        """The agents given `grace` seconds to end and close their connections (their
        servers stopped, their QPs destroyed), then every connection closed, the engine
        too."""
        if self.rendezvous is not None:
            self.rendezvous.stop_listening()
            end = time.monotonic() + grace
            while self.rendezvous.joined and time.monotonic() < end:
                time.sleep(0.05)
            self.rendezvous.close()
        self.engine.close(grace)

    def strangers(self) -> str | None:
        """What the listener turned away, said once: None when nothing."""
        r = self.rendezvous
        if r is None or not r.strangers:
            return None
        n = r.strangers
        return (
            f"its listener closed {n} connection{'s' if n > 1 else ''} that did not join as "
            f"its agents (the first from {r.first_stranger})"
        )


# -- the agent's side ------------------------------------------------------------------------


def join_line(tok: str, key: str | None = None) -> str:
    """What the engine gives an agent on its standard input: its token (and the key it was
    given for, where each node has its own)."""
    msg = {"t": "join", "v": VERSION, "token": tok}
    if key is not None:
        msg["key"] = key
    return json.dumps(msg) + "\n"


def read_join(line: bytes | None) -> dict:
    """The coordinator's join from the agent's standard input: {"token", "key"?}."""
    try:
        msg = json.loads(line) if line else None
    except (ValueError, RecursionError):
        msg = None
    if not isinstance(msg, dict) or msg.get("t") != "join":
        msg = {}
    tok, key = msg.get("token"), msg.get("key")
    if (
        not isinstance(tok, str) or not 16 <= len(tok) <= 128 or not tok.isalnum()
        or not (key is None or isinstance(key, str) and 0 < len(key) <= 255)
    ):  # fmt: skip
        raise IbtoolError(
            "an ibtool mesh agent starts with the coordinator's join on its standard input",
            "it is started by `ibtool mesh`, not by hand",
        )
    return {"token": tok, "key": key}


def ssh_connection(env=os.environ) -> tuple[str, str] | None:
    """(client address, server address) of the ssh this process runs under, as sshd sets
    SSH_CONNECTION ("CLIENT-IP CLIENT-PORT SERVER-IP SERVER-PORT"); None outside one."""
    said = env.get("SSH_CONNECTION", "").split()
    return (said[0], said[2]) if len(said) == 4 else None


def coordinator_address(given: str, env=os.environ) -> str | None:
    """Where the coordinator is, as this node sees it: `given` (its --listen address), else
    the client end of this agent's ssh (SSH_CONNECTION), else the host srun was started
    from (SLURM_LAUNCH_NODE_IPADDR)."""
    if given:
        return given
    ssh = ssh_connection(env)
    for candidate in (ssh[0] if ssh else "", env.get("SLURM_LAUNCH_NODE_IPADDR", "")):
        try:
            return str(ipaddress.ip_address(candidate))
        except ValueError:
            continue
    return None


def join(host: str, port: int, given: dict, timeout: float = 30.0) -> socket.socket:
    """A connection to the coordinator, joined; IbtoolError when it cannot be had."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise IbtoolError(
            f"cannot reach the mesh's coordinator at {host}:{port}: {e.strerror or e}",
            "the nodes must reach the coordinator's host over TCP: let them through its "
            "firewall, or give it an address they reach (ibtool mesh --listen ADDR:PORT)",
        ) from None
    msg = {"t": "join", "v": VERSION, "token": given["token"]}
    if given.get("key") is not None:
        msg["key"] = given["key"]
    task = os.environ.get("SLURM_PROCID", "")
    if task.isdigit() and int(task) < MAX_TASKS:
        msg["task"] = int(task)
    try:
        sock.sendall((json.dumps(msg) + "\n").encode())
        answer = b""
        while not answer.endswith(b"\n") and len(answer) <= len(WELCOME):
            chunk = sock.recv(len(WELCOME))
            if not chunk:
                break
            answer += chunk
    except OSError as e:
        sock.close()
        raise IbtoolError(f"the mesh's coordinator at {host}:{port}: {e.strerror or e}") from None
    if answer != WELCOME:
        sock.close()
        raise IbtoolError(
            f"the mesh's coordinator at {host}:{port} did not take this agent's join",
            "a second mesh started over this one, or a token that is not this node's",
        )
    sock.settimeout(None)
    return sock

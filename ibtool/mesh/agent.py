"""`ibtool mesh --agent`: what runs on each node for the length of one mesh, then leaves.

It says which endpoints its node has (every RDMA port), serves pings on each ACTIVE one
(ibtool ping's native server, bound to the endpoint's address, admitting only the mesh's
addresses), and in each round pings its partner from each endpoint (ibtool ping's client,
from the endpoint's address), one partner at a time. It reads its join on its standard input,
connects back to the coordinator with it (channel.py) and talks over that connection
(protocol.py); started by ssh, it then leaves the ssh (--detach). It ends with the
connection: on `end`, on EOF (the coordinator is gone), after IDLE seconds of silence, or on
a signal, every server is stopped and every QP, CQ, MR and PD it built is destroyed before
it exits.
"""

from __future__ import annotations

import contextlib
import fnmatch
import ipaddress
import os
import queue
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ibtool.errors import IbtoolError
from ibtool.mesh import channel, protocol
from ibtool.mesh.schedule import Schedule
from ibtool.model.mesh import LOCAL_ROUTE, PairState
from ibtool.model.names import natural_key
from ibtool.model.records import LinkLayer

IDLE = 900.0  # s without a word from the coordinator: it is gone, the agent ends
START_WAIT = 60.0  # s for a server to listen


def node_name() -> str:
    """This node as the mesh names it: Slurm's name for it, else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def side_address(env=os.environ) -> str | None:
    """This node's management address, where the side channel of an InfiniBand port with no
    IPoIB address goes (as ibv_rc_pingpong's TCP exchange does: the RDMA itself goes by LID):
    the address ssh reached this node on (SSH_CONNECTION's third field), else the one this
    node reaches srun's launching node from (SLURM_LAUNCH_NODE_IPADDR), else its host name's
    address; None when none is known or it is a loopback one."""
    found = None
    said = channel.ssh_connection(env)
    if said:
        found = said[1]
    elif env.get("SLURM_LAUNCH_NODE_IPADDR"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((env["SLURM_LAUNCH_NODE_IPADDR"], 9))  # no packet: a route lookup
                found = s.getsockname()[0]
        except (OSError, ValueError):
            found = None
    else:
        try:
            found = socket.gethostbyname(socket.gethostname())
        except OSError:
            found = None
    try:
        ip = ipaddress.ip_address(found or "")
    except ValueError:
        return None
    return None if ip.is_loopback or ip.is_unspecified or ip.is_link_local else str(ip)


class PortChoice:
    """Which ports of this node are endpoints (`ibtool mesh --dev`, `--exclude`): DEV or
    DEV/PORT shell patterns (fnmatch), every port when no --dev is given."""

    def __init__(self, only: Iterable[str] | None = None, exclude: Iterable[str] | None = None):
        self.only = tuple(only or ())
        self.exclude = tuple(exclude or ())

    @staticmethod
    def _matches(device: str, port: int, patterns: tuple[str, ...]) -> bool:
        for p in patterns:
            dev, _, number = p.partition("/")
            if fnmatch.fnmatchcase(device, dev) and (not number or number == str(port)):
                return True
        return False

    def __call__(self, device: str, port: int) -> bool:
        if self.only and not self._matches(device, port, self.only):
            return False
        return not self._matches(device, port, self.exclude)


def local_endpoints(
    host,
    addresses: Callable[[], list] | None = None,
    chosen: PortChoice | None = None,
    gid_index: int | None = None,
    side: Callable[[], str | None] = side_address,
) -> list[dict[str, Any]]:
    """Every RDMA port of this host, in (device, port) order as a person counts (mlx5_2
    before mlx5_10, as the kernel numbers them): its rank is its rail. A RoCE
    port's address is its GID's (`gid_index`'s, else the --best rule's); an InfiniBand
    port's, its IPoIB netdev's first IPv4 address (`addresses`: every (netdev, address,
    prefix) of the host), else, with no IPoIB address, the node's management address
    (`side`), on a TCP port of its own ("tcp_port": the mesh's + 1 + its rank among them):
    the RDMA goes by LID all the same."""
    if addresses is None:

        def addresses() -> list:
            try:
                return host.interface_addresses()
            except OSError:
                return []

    out = []
    sides = 0
    ipv4: list | None = None
    facts: dict[str, tuple] = {}  # device -> (firmware, driver, node GUID)
    kernel = host.kernel_release()
    for p in sorted(host.ports(), key=lambda p: (natural_key(p.device), p.port)):
        if chosen is not None and not chosen(p.device, p.port):
            continue
        state = p.state.name if p.state else "UNKNOWN"
        link = {LinkLayer.ETHERNET: "Ethernet", LinkLayer.INFINIBAND: "InfiniBand"}.get(
            p.link_layer, "Unknown"
        )
        address = index = problem = None
        try:
            if p.link_layer == LinkLayer.ETHERNET:
                index = host.roce_gid_index(p.device, p.port) if gid_index is None else gid_index
                for g in host.gids(f"{p.device}/{p.port}"):
                    if g.index == index:
                        address = g.ip
                if address is None and gid_index is not None:
                    problem = f"no IP-based GID at --gid-index {gid_index}"
            else:
                index = gid_index  # InfiniBand: the GRH's source GID, where one is sent
                if p.netdev:  # its IPoIB address carries the TCP exchange
                    ipv4 = addresses() if ipv4 is None else ipv4
                    address = next((a for n, a, _ in ipv4 if n == p.netdev), None)
        except IbtoolError as e:
            problem = e.message
        if address and ipaddress.ip_address(address).is_link_local and problem is None:
            problem = (
                f"only a link-local address ({address}) on {p.netdev or 'its netdev'}: give it "
                "an IPv4 or a global IPv6 address"
            )
            address = None
        tcp_port = None
        if address is None and problem is None and link == "InfiniBand":
            address = side()
            if address is not None:
                sides += 1
                tcp_port = sides  # the mesh's port + this (the coordinator knows the base)
        if address is None and problem is None:
            problem = f"no IP address on {p.netdev or 'its netdev'} to serve pings on"
        if p.device not in facts:
            facts[p.device] = _device_facts(host, p.device)
        pfc, trust = _dcb(host, p.netdev) if link == "Ethernet" else (None, None)
        prefix = None
        if address and ":" not in address:  # its subnet, for rails keyed by it
            ipv4 = addresses() if ipv4 is None else ipv4
            prefix = next((n for _, a, n in ipv4 if a == address), None)
        out.append(
            {
                "device": p.device,
                "port": p.port,
                "state": state,
                "link_layer": link,
                "address": address,
                "gid_index": index,
                "hw": False,
                "problem": problem if state == "ACTIVE" else None,
                "rate": p.rate.text if p.rate else None,
                "fw": facts[p.device][0],
                "driver": facts[p.device][1],
                "kernel": kernel,
                **({"pfc": pfc} if pfc is not None else {}),
                **({"trust": trust} if trust is not None else {}),
                "prefix": None if tcp_port else prefix,
                **({"side": tcp_port} if tcp_port else {}),
                # an InfiniBand port's LID and its node's GUID: where its pairs' routes go
                # through the subnet (the coordinator names a cable by them)
                **({"lid": p.lid} if link == "InfiniBand" and p.lid else {}),
                **(
                    {"guid": facts[p.device][2]}
                    if link == "InfiniBand" and p.lid and facts[p.device][2]
                    else {}
                ),
            }
        )
    return out


def _device_facts(host, device: str) -> tuple[str | None, str | None, str | None]:
    """The device's firmware version, driver and node GUID, None where they cannot be read
    (a warning said why)."""
    try:
        (found,) = host.devices(device)
    except (IbtoolError, ValueError):
        return None, None, None
    return found.fw_ver, found.driver, found.node_guid


def _dcb(host, netdev: str | None) -> tuple[str | None, str | None]:
    """A RoCE netdev's PFC priorities ("3", "3,4", "none") and what it trusts ("dscp",
    "pcp,dscp"), None where the kernel or the driver does not say (veth, rxe's netdevs)."""
    if not netdev:
        return None, None
    try:
        dcb = host.dcb(netdev)
    except (IbtoolError, OSError):
        return None, None
    if dcb is None:
        return None, None
    pfc = ",".join(str(p) for p in sorted(dcb.pfc_enabled)) or "none"
    return pfc, None if dcb.trust is None else ",".join(dcb.trust)


class Lines:
    """The coordinator's lines on a file descriptor, each bounded; None at EOF or after
    `idle` seconds of silence."""

    def __init__(self, fd: int, idle: float = IDLE, limit: int = protocol.MAX_PLAN):
        self.fd, self.idle, self.limit, self.buf = fd, idle, limit, bytearray()

    def next(self) -> bytes | None:
        deadline = time.monotonic() + self.idle
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[: nl + 1]
                return line
            if len(self.buf) > self.limit:
                raise protocol.AgentError("a line from the coordinator over the bound")
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the agent dies, however it dies (prctl(2)
    PR_SET_PDEATHSIG), so no server outlives its mesh."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Server:
    """An endpoint's ping server: `ibtool ping --server` in a process of its own, bound to the
    endpoint's address and admitting only the mesh's addresses. Its own process, not a thread
    of the agent: a server busy-polls its CQ, and so does the agent's client on the same
    endpoint; in one process they would take turns at the interpreter's lock, and every
    round trip would carry those turns (milliseconds, not microseconds)."""

    def __init__(self, ep: dict, plan: dict, addresses: list[str], warn, port: int | None = None):
        # In a round an endpoint serves one partner (two with --all-rails' odd groups), with
        # its --qps connections and the full-payload and --bw ones: room for them, and more
        qps = plan.get("qps", 1)
        path = plan.get("path", {})
        argv = [sys.executable, "-m", "ibtool", "ping", "--server",
                "--dev", f"{ep['device']}/{ep['port']}", "--bind", ep["address"],
                "--port", str(port or plan["tcp_port"]), "--no-facts",
                "--max-sessions", str(max(8, 2 * (qps + 2))),
                "--qp-timeout", str(plan.get("qp_timeout", 14)),
                "--max-per-source", str(max(4, qps + 2)), "--idle-timeout", "600",
                "--sl", str(path.get("sl", 0)), "--tclass", str(path.get("tclass", 0))]  # fmt: skip
        if path.get("pkey_index"):
            argv += ["--pkey-index", str(path["pkey_index"])]
        if ep.get("gid_index") is not None:
            argv += ["--gid-index", str(ep["gid_index"])]
        argv += [f"--allow={a}" for a in sorted(set(addresses)) if a]
        self.name = f"{ep['device']}/{ep['port']}"
        self.warn = warn
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        self.listening = threading.Event()
        self.said: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True).start()

    def _read(self, stream) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip()
            if line.startswith("listening on "):
                self.listening.set()
            elif "dropped" in line or "refused" in line or "error" in line:
                self.warn(f"{self.name}: {line[:200]}")
            if len(self.said) < 5:
                self.said.append(line[:200])

    def wait_listening(self, deadline: float) -> str | None:
        """None once it listens; else why not (its exit and last words)."""
        while not self.listening.is_set():
            if self.proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                return "its ping server did not start in time"
            self.listening.wait(0.1)
        if self.listening.is_set():
            return None
        self.proc.wait()
        last = self.said[-1] if self.said else f"exit {self.proc.returncode}"
        return f"its ping server did not start: {last}"

    def stop(self) -> None:
        """SIGTERM (it destroys its sessions' QPs and closes its port), SIGKILL after 60 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_ROUND_DONE = object()  # a round's thread, to the agent's loop: its report is out


def _read_into(lines: Lines, inbox: queue.Queue) -> None:
    """The coordinator's messages into `inbox`, checked; None at its end, or the error."""
    try:
        while True:
            line = lines.next()
            if line is None:
                inbox.put(None)
                return
            inbox.put(protocol.parse_coordinator(line))
    except Exception as e:  # garbage or a read error: the agent ends with it
        inbox.put(e)


class Agent:
    def __init__(
        self,
        host,
        say: Callable[[dict], None],
        warn: Callable[[str], None],
        chosen: PortChoice | None = None,
        gid_index: int | None = None,
    ):
        self.host, self.say, self.warn, self.chosen = host, say, warn, chosen
        self.gid_index = gid_index
        self.id = secrets.token_hex(8)
        self.stop = threading.Event()
        self.servers: list[Server] = []
        self.ladders: dict[int, Any] = {}  # plan index -> the client's Ladder
        self.clocks: dict[int, Any] = {}  # plan index -> HwClock, where the HCA stamps
        self.workers: list[threading.Thread] = []
        self.looped: dict[tuple[int, int], str | None] = {}  # pairs of two own ports
        self.quiet_from: tuple[float, dict] | None = None  # (when, counters) at ready

    def run(self, lines: Lines) -> int:
        mine = local_endpoints(self.host, chosen=self.chosen, gid_index=self.gid_index)
        self.say(
            {"t": "hello", "v": protocol.VERSION, "id": self.id, "node": node_name(),
             "endpoints": mine}
        )  # fmt: skip
        try:
            line = lines.next()
            if line is None:
                return 0
            plan = protocol.parse_coordinator(line)
            if plan["t"] != "plan":
                return 0
            self._setup(plan, mine)
            # The coordinator's next words are read while a round runs: an `end`, an EOF (its
            # ssh or srun gone) or garbage stops the round's pings at once, not at its end.
            inbox: queue.Queue = queue.Queue()
            threading.Thread(target=_read_into, args=(lines, inbox), daemon=True).start()
            running: threading.Thread | None = None
            while True:
                msg = inbox.get()
                if msg is _ROUND_DONE:
                    running = None
                elif isinstance(msg, BaseException) or msg is None or msg["t"] == "end":
                    self.stop.set()  # the pings in flight end within their timeout
                    if running is not None:
                        running.join()
                    if isinstance(msg, BaseException):
                        raise msg
                    return 0
                elif msg["t"] in ("round", "retry"):
                    if running is not None:
                        running.join()  # the coordinator waits for each report: never here
                    if msg["t"] == "round":
                        self.skip.update(msg.get("skip", []))
                        work, args = self._round, (msg["r"], inbox)
                    else:
                        work, args = self._retry, (msg["pairs"], inbox)
                    running = threading.Thread(target=work, args=args, daemon=True)
                    running.start()
        finally:
            self.close()

    def _setup(self, plan: dict, mine: list[dict]) -> None:
        from ibtool.rdma.ladder import MTU_BYTES, Ladder  # pyverbs: only once there is a plan

        eps = plan["endpoints"]  # [index, agent id, its index there, address, up(, port)]
        self.plan, self.mine = plan, mine
        self.addresses = {e[0]: e[3] for e in eps}
        self.ports = {e[0]: e[5] if len(e) == 6 else plan["tcp_port"] for e in eps}
        self.up = {e[0]: bool(e[4]) for e in eps}
        self.skip: set[int] = set()
        self.own = {e[0]: e[2] for e in eps if e[1] == self.id and e[2] < len(mine)}
        wire = plan["schedule"]
        schedule = Schedule(
            {k: tuple(v) for k, v in wire["groups"].items()},
            {k: tuple(v) for k, v in wire["shifts"].items()},
        )
        self.dests = {i: schedule.partners(i) for i in self.own}
        problems: dict[str, str] = {}
        mtus: dict[str, int] = {}
        listening = []
        for i, k in self.own.items():
            if not self.up[i]:
                continue
            ep = mine[k]
            try:
                ladder = Ladder(ep["device"], ep["port"], ep["gid_index"])
            except IbtoolError as e:
                problems[str(k)] = e.message
                continue
            self.ladders[i] = ladder
            self.clocks[i] = _clock(ladder)
            mtu = MTU_BYTES.get(getattr(ladder.port_attr, "active_mtu", None))
            if mtu:
                mtus[str(k)] = mtu
            try:
                server = Server(ep, self.plan, list(self.addresses.values()), self.warn,
                                self.ports[i])  # fmt: skip
            except OSError as e:
                problems[str(k)] = f"cannot start its ping server: {e.strerror or e}"
                continue
            self.servers.append(server)
            listening.append((k, server))
        deadline = time.monotonic() + START_WAIT
        for k, server in listening:
            why = server.wait_listening(deadline)
            if why:
                problems[str(k)] = why
        self.say({"t": "ready", "problems": problems, "mtu": mtus})
        # from here to round 0 no agent pings (the coordinator waits for every one to be
        # ready, then a quiet window): what the ports resend then is someone else's traffic
        self.quiet_from = (time.monotonic(), {i: self._retransmissions(i) for i in self.ladders})

    def _round(self, r: int, inbox: queue.Queue | None = None) -> None:
        try:
            self._pings(r)
        finally:
            if inbox is not None:
                inbox.put(_ROUND_DONE)

    def _retry(self, pairs: list, inbox: queue.Queue | None = None) -> None:
        """The pairs the coordinator asks again (those of this agent's endpoints that lost
        pings): each source's one after the other, the sources side by side, as a round."""
        try:
            mine: dict[int, list[int]] = {}
            for i, d in pairs:
                if i in self.own and d in self.up:
                    mine.setdefault(i, []).append(d)
            results: list[list] = []
            lock = threading.Lock()

            def run(i: int, partners: list[int]) -> None:
                for d in partners:
                    if self.stop.is_set():
                        return
                    why = self._unusable(i, d)
                    if why:
                        row = [i, d, int(PairState.SKIPPED), 0, 0, None, None, None, False, why]
                        with lock:
                            results.append(row)
                        continue
                    self._pair(i, d, results, lock)

            threads = [threading.Thread(target=run, args=(i, ds), name=f"retry {i}")
                       for i, ds in sorted(mine.items())]  # fmt: skip
            self.workers = threads
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if not self.stop.is_set():
                self.say({"t": "retried", "pairs": sorted(results)})
        finally:
            if inbox is not None:
                inbox.put(_ROUND_DONE)

    def _pings(self, r: int) -> None:
        results: list[list] = []
        lock = threading.Lock()
        threads = []
        before = {i: self._retransmissions(i) for i in self.ladders}
        quiet = self._quiet(before)
        for i in sorted(self.own):
            dests = self.dests.get(i, ())
            d = dests[r] if r < len(dests) else -1
            if d < 0:
                continue
            why = self._unusable(i, d)
            if why:
                results.append([i, d, int(PairState.SKIPPED), 0, 0, None, None, None, False, why])
                continue
            t = threading.Thread(target=self._pair, args=(i, d, results, lock), name=f"ping {i}")
            t.start()
            threads.append(t)
        self.workers = threads
        for t in threads:
            t.join()
        if self.stop.is_set():
            return  # ended mid-round: the coordinator is gone or said so
        retrans = {}
        for i, was in before.items():
            now = self._retransmissions(i)
            if was is not None and now is not None and now >= was:
                retrans[str(i)] = now - was
        message = {"t": "result", "r": r, "pairs": sorted(results), "retrans": retrans}
        if quiet:
            message["quiet"] = quiet
        self.say(message)

    def _quiet(self, now: dict[int, int | None]) -> dict[str, list[int]]:
        """Before the first round: each endpoint's retransmissions since this agent was
        ready, and the milliseconds since; {} after it."""
        if self.quiet_from is None:
            return {}
        t0, was = self.quiet_from
        self.quiet_from = None
        ms = min(int((time.monotonic() - t0) * 1000), 1 << 30)
        return {
            str(i): [now[i] - was[i], ms]
            for i in now
            if now[i] is not None and was.get(i) is not None and now[i] >= was[i]
        }

    def _retransmissions(self, i: int) -> int | None:
        ep = self.mine[self.own[i]]
        return retransmissions(self.host.root, ep["device"], ep["port"], self.host.fs)

    def _unusable(self, i: int, d: int) -> str | None:
        for end, what in ((i, "this end"), (d, "the other end")):
            if not self.up.get(end) or end in self.skip:
                return f"not probed: {what} is down or has no agent"
        if i not in self.ladders:
            return "not probed: this end has no verbs context"
        if d in self.own and all(
            self.mine[self.own[e]]["link_layer"] == "Ethernet" for e in (i, d)
        ):  # two RoCE ports of this host (InfiniBand goes by LID, not by the kernel's routes)
            return self._looped(i, d)
        return None

    def _looped(self, i: int, d: int) -> str | None:
        """Two ports of this host: why not, when the kernel routes the partner's address
        (this host's own) from this end's through lo, as it does for every local address
        unless a rule sends the source to a table of its own (and accept_local lets the
        packet in): RoCE packets between them would never leave the host, and the QP cannot
        even find a neighbour for them (INIT->RTR fails)."""
        key = (i, d)
        if key not in self.looped:
            try:
                route = self.host.route(self.addresses[d], self.addresses[i])
            except IbtoolError:
                route = None
            self.looped[key] = (
                f"{LOCAL_ROUTE} {self.addresses[d]}, this host's own, through lo from "
                f"{self.addresses[i]}"
                if route is not None and route.type == "local"
                else None
            )
        return self.looped[key]

    def _pair(self, i: int, d: int, results: list, lock: threading.Lock) -> None:
        row = probe(self.ladders[i], self.clocks.get(i), self.addresses[i], self.addresses[d],
                    self.plan, self.stop, self.ports[d])  # fmt: skip
        with lock:
            results.append([i, d, *row])

    def close(self) -> None:
        """Servers stopped and waited for, then the client ladders closed."""
        self.stop.set()
        for t in self.workers:  # a pair's client: its QP before the ladder goes
            t.join(60)
        for server in self.servers:
            server.stop()
        for ladder in self.ladders.values():
            try:
                ladder.close()
            except Exception as e:  # the next one still closes
                self.warn(f"closing {ladder.device}: {e}")
        self.ladders.clear()


# The requester's retransmissions on a port: what an RC QP sent again because an ACK did not
# come in time (the packet or its ACK was lost). rxe: completer_retry_err (drivers/infiniband/
# sw/rxe/rxe_hw_counters.c); mlx5: local_ack_timeout_err (Documentation/ABI, mlx5 hw_counters).
RETRANSMISSIONS = ("completer_retry_err", "local_ack_timeout_err")


def retransmissions(root: str, device: str, port: int, fs: Any) -> int | None:
    """The port's retransmission counters summed (ports/P/hw_counters, else the device's
    hw_counters), None when it has none of them or one cannot be read; read from `fs` (the
    Host's: ibtool.sources.sysfs.fs)."""
    base = os.path.join(root, "sys/class/infiniband", device)
    for where in (os.path.join(base, "ports", str(port), "hw_counters"),
                  os.path.join(base, "hw_counters")):  # fmt: skip
        total, found = 0, False
        for name in RETRANSMISSIONS:
            try:
                text = fs.read(os.path.join(where, name), 32)
            except FileNotFoundError:
                continue
            except OSError:
                return None
            try:
                total += int(text)
            except ValueError:
                return None
            found = True
        if found:
            return total
    return None


def _clock(ladder):
    from ibtool.rdma.hwclock import HwClock

    try:
        return HwClock(ladder)
    except IbtoolError:
        return None  # software round trips (rxe, siw, and HCAs without completion stamps)


def quantile(values: list[float], q: float) -> float | None:
    """The nearest-rank quantile of sorted `values`."""
    if not values:
        return None
    k = max(0, min(len(values) - 1, int(-(-q * len(values) // 1)) - 1))
    return values[k]


class Stopped(Exception):
    """The agent is ending: a pair's pings stop where they are."""


class Abandoned(Exception):
    """A pair given up: too many losses in a row."""


class GiveUp:
    """When a pair is no longer worth its time: `limit` losses in a row. A black-holed end
    (ACTIVE, every packet dropped) would otherwise cost the round every ping's timeout (20 x
    2 s by default), in every round it is in; a lossy link still answers some of any few in a
    row, so it is measured whole."""

    def __init__(self, limit: int):
        self.limit = limit
        self.run = 0

    def reply(self) -> None:
        self.run = 0

    def loss(self) -> bool:
        """Counts a loss; True when the pair is to be abandoned."""
        self.run += 1
        return self.run >= self.limit


class _Series:
    """One series of pings of a pair, over `qps` QPs in turn (each its own connection, so
    its own QP number, so its own UDP source port on RoCE v2: its own ECMP path), each QP's
    share run whole before the next, every QP kept until the end so that no two share a
    number."""

    def __init__(self, ladder, source: str, target: str, plan: dict, path, stop, port=None):
        self.ladder, self.source, self.target = ladder, source, target
        self.port = port or plan["tcp_port"]  # the target's server's
        self.plan, self.path, self.stop = plan, path, stop
        self.sent = self.received = 0
        self.rtts: list[float] = []
        self.hw_rtts: list[float] = []
        self.errors: list[str] = []
        self.answered: list[int] = []  # each QP's replies
        self.connected = True  # False when a connection could not be made at all

    def run(self, size: int, mode, count: int, interval: float, hw=None, qps: int = 1) -> None:
        from ibtool.rdma.ping.client import Client, PingStats, run_client

        timeout = float(self.plan["timeout"])
        clients = []
        try:
            for k in range(qps):
                share = count // qps + (k < count % qps)
                if not share or self.stop.is_set():
                    break
                try:
                    client = Client(self.ladder, self.target, self.port, size,
                                    mode, timeout, self.path, hw=hw, source=self.source,
                                    connect_timeout=timeout)  # fmt: skip
                except IbtoolError as e:
                    self.errors.append(e.message)
                    self.connected = bool(clients)
                    break
                clients.append(client)
                stats, rtts = PingStats(), []
                give_up = GiveUp(self.plan.get("abandon", 3))
                try:
                    run_client(client, share, interval, None, self._reply(give_up),
                               self._loss(give_up), stats, rtts)  # fmt: skip
                except Stopped:
                    self.errors.append("stopped: the mesh ended")
                except Abandoned:
                    self.errors.append(
                        f"abandoned after {self.plan.get('abandon', 3)} losses in a row: "
                        f"{self.errors[-1]}"
                    )
                except IbtoolError as e:
                    self.errors.append(e.message)
                except OSError as e:
                    self.errors.append(e.strerror or str(e))
                self.sent += stats.sent
                self.received += stats.received
                self.rtts += rtts
                self.answered.append(stats.received)
                if self.stop.is_set():
                    break
                # a black hole, not one bad path: two QPs given up with nothing answered
                if len(self.answered) >= 2 and not any(self.answered):
                    break
        finally:
            for client in clients:
                client.close()

    def _reply(self, give_up: GiveUp):
        def reply(seq: int, rtt: float, hw_us: float | None) -> None:
            give_up.reply()
            if hw_us is not None:
                self.hw_rtts.append(hw_us)
            if self.stop.is_set():
                raise Stopped

        return reply

    def _loss(self, give_up: GiveUp):
        def loss(seq: int, why: str) -> None:
            self.errors.append(why)
            if self.stop.is_set():
                raise Stopped
            if give_up.loss():
                raise Abandoned

        return loss

    def silent(self) -> int:
        """QPs that lost every ping while another QP was answered: paths of their own."""
        if not any(self.answered):
            return 0
        return sum(1 for n in self.answered if not n)


def probe(
    ladder, hw, source: str, target: str, plan: dict, stop: threading.Event, port=None
) -> list:
    """One pair: `count` pings from `source` to the server at `target`, at most `rate` a
    second, over `qps` QPs, until `stop` is set; then, if every one was answered, `full`
    pings of the path MTU's full payload, and with `bw` an RDMA WRITE burst.
    [state, sent, received, median, p90, p99, hw, error, extras]."""
    from ibtool.rdma import wire
    from ibtool.rdma.ladder import MTU_BYTES, PathSpec

    p = plan.get("path", {})
    path = PathSpec(sl=p.get("sl", 0), traffic_class=p.get("tclass", 0),
                    pkey_index=p.get("pkey_index", 0),
                    ack_timeout=plan.get("qp_timeout", 14))  # fmt: skip
    qps = plan.get("qps", 1)
    main = _Series(ladder, source, target, plan, path, stop, port)
    main.run(plan["size"], wire.MODES[plan["mode"]], plan["count"], 1.0 / plan["rate"], hw, qps)
    extra: dict[str, Any] = {}
    errors = main.errors
    if qps > 1 and main.sent:
        extra["qps"] = [len(main.answered), main.silent()]
        if main.silent():
            errors.append(
                f"{main.silent()} of {len(main.answered)} QPs lost every ping while the "
                "others were answered: some of the pair's ECMP paths drop (a QP's UDP "
                "source port picks its path)"
            )
    whole = main.sent and main.received == main.sent and not stop.is_set()
    mtu = MTU_BYTES.get(getattr(ladder.port_attr, "active_mtu", None))
    if whole and plan.get("full", 0) and mtu:
        full = _Series(ladder, source, target, plan, path, stop, port)
        full.run(mtu, wire.Mode.SEND, plan["full"], 0.0)
        if full.sent:
            extra["full"] = [mtu, full.sent, full.received]
            if full.received < full.sent:
                errors.append(
                    f"{full.received}/{full.sent} pings of {mtu} bytes (the full payload of "
                    f"an MTU of {mtu}) answered: {full.errors[-1] if full.errors else 'lost'}"
                )
    if whole and plan.get("bw") and not stop.is_set():
        burst = _Series(ladder, source, target, plan, path, stop, port)
        burst.run(protocol.BW_SIZE, wire.Mode.WRITE_IMM, protocol.BW_PINGS, 0.0)
        if burst.received == burst.sent == protocol.BW_PINGS:
            rtt = quantile(sorted(burst.rtts[1:]), 0.5)
            if rtt:  # bits over microseconds: Mb/s; / 1e3: Gb/s
                extra["bw"] = round(2 * protocol.BW_SIZE * 8 / rtt / 1e3, 3)
        elif burst.errors:
            said = f"bandwidth burst: {burst.errors[-1]}"
            if burst.sent and burst.connected:
                # a megabyte each way took longer than the timeout: what it carries is below
                # that, and a port that slow is named by it, not left out for saying nothing
                bound = 2 * protocol.BW_SIZE * 8 / (float(plan["timeout"]) * 1e6) / 1e3
                extra["bw"] = round(bound, 6)
                said += f" (below {bound:.3g} Gb/s)"
            errors.append(said)
    on_hca = bool(hw) and bool(main.rtts) and len(main.hw_rtts) == len(main.rtts)
    times = sorted(main.hw_rtts if on_hca else main.rtts)
    return [
        int(PairState.PROBED),
        main.sent,
        main.received,
        quantile(times, 0.5),
        quantile(times, 0.9),
        quantile(times, 0.99),
        on_hca,
        errors[-1] if errors else None,
        extra or None,
    ]


def main(
    host,
    out=None,
    err=None,
    fd: int = 0,
    chosen: PortChoice | None = None,
    gid_index: int | None = None,
    connect: tuple[str, int] | None = None,
    detach: bool = False,
) -> int:
    """The agent on this host, meshing the ports `chosen` (through the GID at `gid_index`,
    else the --best rule's); its exit code. It reads its join from `fd` (its standard input),
    connects back to the coordinator at `connect` (its address "" where the node's ssh or
    srun says it) and speaks over that connection; `detach`: then it leaves its ssh, which
    ends and frees its place in ClusterShell's window. Without `connect` (a test's), it
    speaks over `fd` and `out`."""
    out = out or sys.stdout
    err = err or sys.stderr
    lock = threading.Lock()
    joined: list[socket.socket] = []

    def say(message: dict) -> None:
        data = protocol.dumps(message)
        with lock:
            if joined:
                try:
                    joined[0].sendall(data.encode())
                except OSError:
                    raise BrokenPipeError from None
                return
            out.write(data)
            out.flush()

    def warn(line: str) -> None:
        if joined:
            with contextlib.suppress(BrokenPipeError):
                say({"t": "warn", "text": line[: protocol.MAX_ERROR]})
            return
        with lock:
            err.write(f"ibtool mesh agent: {line}\n")
            err.flush()

    try:
        if connect is None:
            lines = Lines(fd)
        else:
            lines = _join(connect, Lines(fd, JOIN_WAIT, channel.MAX_JOIN), joined, detach)
        return Agent(host, say, warn, chosen, gid_index).run(lines)
    except protocol.AgentError as e:
        warn(f"the coordinator's message: {e}")
        return 7
    except BrokenPipeError:
        return 0  # the coordinator is gone; everything was closed on the way out
    except IbtoolError as e:
        with contextlib.suppress(BrokenPipeError):
            say({"t": "error", "message": e.message, "hint": e.hint})
        raise
    finally:
        for sock in joined:
            sock.close()


JOIN_WAIT = 60.0  # s for the join on standard input (ssh and Python started before it)


def _join(connect: tuple[str, int], stdin: Lines, joined: list, detach: bool) -> Lines:
    """The join read, the coordinator reached and joined; its connection's lines."""
    given = channel.read_join(stdin.next())
    address = channel.coordinator_address(connect[0])
    if address is None:
        raise IbtoolError(
            "an ibtool mesh agent cannot tell where its coordinator is: neither ssh "
            "(SSH_CONNECTION) nor srun (SLURM_LAUNCH_NODE_IPADDR) says it",
            "ibtool mesh --listen ADDR gives the nodes the coordinator's address",
        )
    sock = channel.join(address, connect[1], given)
    joined.append(sock)
    if detach:
        detach_from_starter()
    return Lines(sock.fileno())


def detach_from_starter() -> None:
    """Leave the ssh that started this agent: the parent exits (its ssh ends, ClusterShell's
    window moves on), the child goes on in a session of its own, its standard streams on
    /dev/null. Nothing of the agent is running yet (no thread, no verbs), so fork is safe."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(null, std)
    if null > 2:
        os.close(null)

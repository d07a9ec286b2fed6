"""The coordinator: start the agents through an engine, learn the endpoints, hand out the
plan, run the rounds as a barrier (round r+1 starts when every agent reported round r, or
its time ran out), gather every pair, end the agents, and judge.

Whatever goes wrong on a node -- no ssh, no ibtool, no RDMA device, garbage on its stdout,
an agent that dies or hangs mid-mesh -- is that node's fault in the result (unreachable, or
its pairs MISSING), never the end of the mesh for the others.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import field

from ibtool.errors import IbtoolError
from ibtool.mesh import protocol, rails
from ibtool.mesh.analysis import analyse, slow_limits
from ibtool.mesh.channel import Link
from ibtool.mesh.engines import EXIT, LINE, STDERR, Engine
from ibtool.mesh.schedule import Partners, plan
from ibtool.model.deferred import dataclass
from ibtool.model.mesh import Endpoint, MeshResult, Pair, PairState, PairTable, Settings
from ibtool.model.names import printable
from ibtool.views.mesh import us

START_TIMEOUT = 120.0  # s for every agent's hello (ssh, Python, the RDMA ports read)
# Rounds in a row in which every pair with an endpoint was lost while its partners were fine
# with their other partners: then it is quarantined, out of the rounds left. One such round
# can be chance (a partner's stall); two are the endpoint. Without it, a black-holed endpoint
# (ACTIVE, every packet dropped) costs every round its pairs' timeouts: N - 1 rounds of them.
QUARANTINE_ROUNDS = 2
# s every port is left alone before round 0: what its retransmission counters move then is
# another job's (a busy node), the rate the rounds' counts are judged beyond
QUIET = 2.0
RETRY_MAX = 64  # pairs retried after the last round, at most: more are no host's stalls
RETRY_EACH = 4  # of them from one endpoint (its retries run one after the other)
READY_TIMEOUT = 120.0  # s for every agent's servers to listen (verbs opened)
ROUND_SLACK = 30.0  # s a round may take beyond its pings' own worst case
CLOSE_GRACE = 30.0  # s the agents have to stop their servers and exit after `end`
MAX_STDERR = 5  # lines of an agent's stderr kept to say why it failed


@dataclass
class Options:
    count: int = 20
    size: int = 64
    mode: str = "send"
    rate: float = 100.0
    timeout: float = 2.0
    rounds: int | None = None
    all_rails: bool = False
    slow_factor: float = 10.0
    tcp_port: int = 18521
    start_timeout: float = START_TIMEOUT
    # The QPs' local ACK timeout exponent (ladder.PathSpec.ack_timeout): 18, 1.07 s a try. A
    # job's QPs wait as long or longer (NCCL's IB_TIMEOUT is 20 today, 18 and 14 before:
    # src/transport/net_ib.cc); 14, 67 ms, made every host stall longer than that (a busy
    # or emulated node off its CPU) a resend counted as loss; a lost packet is still resent
    # within a ping's 2 s, its retransmission counted and its round trip slow.
    qp_timeout: int = 18
    deadline: float | None = None  # s for the whole mesh: no round starts after it
    abandon: int = 3  # losses in a row after which an agent gives a pair up
    sl: int = 0  # the pairs' QPs' path (--sl, --tclass, --pkey-index)
    tclass: int = 0
    pkey_index: int = 0
    gid_index: int | None = None  # --gid-index, told the agents on their command line
    full_payload: int = 3  # pings of the path MTU's full payload a pair (0: none)
    qps: int = 1
    bw: bool = False
    quiet: float = QUIET  # s between every agent ready and round 0, when no one pings
    rail_map: tuple[tuple[str, int], ...] = ()  # --rail: (DEV[/PORT] pattern, rail)
    retry: bool = True  # the pairs that lost pings probed once more after the last round


@dataclass
class _Node:
    key: str  # the engine's name for it
    name: str = ""  # the mesh's name for it
    agent: str = ""  # its agent's id
    hello: dict | None = None
    ready: bool = False
    gone: str | None = None  # why it left the mesh
    stderr: list[str] = field(default_factory=list)
    endpoints: list[int] = field(default_factory=list)
    mine: set[int] = field(default_factory=set)  # the same, for lookups


def _rounds_said(rounds: list[int]) -> str:
    """[1, 2] as "1-2", [1, 3] as "1 and 3"."""
    if rounds == list(range(rounds[0], rounds[-1] + 1)):
        return f"{rounds[0]}-{rounds[-1]}"
    return ", ".join(map(str, rounds[:-1])) + f" and {rounds[-1]}"


def round_timeout(o: Options) -> float:
    """The longest a round may take: every ping to its timeout, each of a pair's
    connections (a QP each: --qps of them, the full-payload pings', the --bw burst's) to its
    timeout."""
    connections = o.qps + (o.full_payload > 0) + o.bw
    pings = o.count + o.full_payload + (protocol.BW_PINGS if o.bw else 0)
    return connections * o.timeout + pings * (o.timeout + 1.0 / o.rate) + ROUND_SLACK


class Coordinator:
    def __init__(
        self,
        engine: Engine,
        options: Options,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.engine, self.o, self.say, self.clock = engine, options, say, clock
        self.nodes: dict[str, _Node] = {}
        self.unreachable: dict[str, str] = {}
        self.gone: set[str] = set()  # the keys of nodes out of the mesh
        # the engine itself ended (srun gone; ClusterShell's task, every ssh done, as when
        # its agents have all joined and left their ssh)
        self.engine_done = False
        self.quarantined: dict[int, str] = {}  # endpoint -> why, from the round it was found
        self.stopped: str | None = None  # why the rounds stopped before the last one
        # endpoint -> (retransmissions, ms) of its port in the quiet window before round 0
        self.quiet: dict[int, tuple[int, int]] = {}

    # -- events ----------------------------------------------------------------------------

    def _node(self, key: str) -> _Node:
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = _Node(key, key if self.engine.name != "srun" else "")
        return node

    def _name(self, node: _Node) -> str:
        """The node's name: the one it said, or the engine's word for its key (srun's line
        about a task that ended names its node), or the key itself."""
        if not node.name:
            known = self.engine.name_of(node.key)
            if known is not None and not any(n.name == known for n in self.nodes.values()):
                node.name = known
        return node.name or node.key

    def _drop(self, node: _Node, why: str) -> None:
        if node.gone is None:
            node.gone = why
            self.gone.add(node.key)
            self.say(f"{self._name(node)}: {why}")

    def _pump(
        self, deadline: float, handle: Callable[[_Node, dict], None], done: Callable[[], bool]
    ):
        """Events until `done()` or the deadline; each agent's message to `handle`."""
        while not done():
            left = deadline - self.clock()
            if left <= 0:
                return
            ev = self.engine.get(min(left, 1.0))
            if ev is None:
                continue
            if ev.kind == EXIT and not ev.node:  # the whole engine ended
                # those that joined talk over their own connections: the others never will
                for n in self.nodes.values():
                    if not n.gone and not self.engine.joined(n.key):
                        self._drop(n, self._why_exit(n, ev.data))
                self.engine_done = True
                if not self._talking():
                    return  # nobody joined is left: nothing more can come
                continue
            node = self._node(ev.node)
            if ev.kind == STDERR:
                if len(node.stderr) < MAX_STDERR and ev.data:
                    node.stderr.append(printable(str(ev.data), 160))
            elif ev.kind == EXIT:
                if not node.gone:
                    self._drop(node, self._why_exit(node, ev.data))
            elif ev.kind == LINE and not node.gone:
                text = str(ev.data)
                if not text.startswith("{"):
                    if len(node.stderr) < MAX_STDERR and text.strip():
                        node.stderr.append(printable(text, 160))
                    continue  # a login banner, a shell's noise: not ours
                try:
                    msg = protocol.parse_agent(text)
                except protocol.AgentError as e:
                    self._drop(node, f"spoke garbage: {e}")
                    continue
                if msg["t"] == "error":
                    hint = f" ({msg['hint']})" if msg.get("hint") else ""
                    self._drop(node, f"its agent: {msg['message']}{hint}")
                    continue
                if msg["t"] == "warn":
                    if len(node.stderr) < MAX_STDERR and msg["text"]:
                        node.stderr.append(printable(msg["text"], 160))
                    continue
                handle(node, msg)

    def _talking(self) -> bool:
        """Whether an agent may still speak: one that joined and is still in, or, before
        the engine ended, one yet to join."""
        if not self.engine_done:
            return True
        return any(not n.gone and self.engine.joined(n.key) for n in self.nodes.values())

    def _why_exit(self, node: _Node, rc) -> str:
        tail = f": {node.stderr[-1]}" if node.stderr else ""
        if rc == 255:
            return f"ssh failed (exit 255){tail}"
        if rc == 127:
            return f"no ibtool there (exit 127){tail}"
        if rc is None:
            return f"its agent ended{tail}"
        return f"its agent exited {rc}{tail}"

    # -- the phases --------------------------------------------------------------------------

    def run(self, agent_argv: list[str]) -> MeshResult:
        o = self.o
        settings = Settings(o.count, o.size, o.mode, o.rate, o.timeout, o.all_rails,
                            o.slow_factor, o.tcp_port, self.engine.name, o.sl, o.tclass,
                            o.pkey_index, o.gid_index, o.full_payload, o.qps,
                            o.bw)  # fmt: skip
        started_wall, t0 = time.time(), self.clock()
        self.engine.start(agent_argv)
        try:
            result = self._mesh(settings)
        finally:
            self.engine.broadcast(protocol.dumps({"t": "end"}))
            self.engine.close(CLOSE_GRACE)
        turned_away = self.engine.strangers()
        if turned_away:
            self.say(turned_away)
        result.started, result.elapsed = started_wall, self.clock() - t0
        return result

    def _mesh(self, settings: Settings) -> MeshResult:
        o = self.o
        expected = len(self.engine.nodes)

        def hello(node: _Node, msg: dict) -> None:
            if msg["t"] != "hello" or node.hello is not None:
                self._drop(node, f"said {msg['t']} before its hello")
                return
            if self.engine.name == "srun":
                name = msg["node"]
                if name not in self.engine.nodes or any(
                    n.name == name for n in self.nodes.values() if n is not node
                ):
                    self._drop(node, f"says it is {name}, not a node of the step or a second one")
                    return
                node.name = name
            node.hello, node.agent = msg, msg["id"]
            said.add(node.key)
            if not msg["endpoints"]:
                self._drop(node, "has no RDMA port")

        said: set[str] = set()

        def all_said() -> bool:
            return len(said | self.gone) >= expected

        self._pump(self.clock() + o.start_timeout, hello, all_said)
        endpoints, ids = self._endpoints()
        keyed = rails.assign(endpoints, self._prefixes, o.rail_map)
        settings = dataclasses.replace(settings, rails=keyed)
        answered = sum(1 for n in self.nodes.values() if n.hello and not n.gone)
        self.say(f"mesh: {len(endpoints)} endpoints on {answered} of {expected} nodes")
        schedule = plan(endpoints, o.all_rails, o.rounds)
        table = PairTable(schedule.rounds, len(endpoints))
        partners = Partners(schedule, len(endpoints))
        for r in range(schedule.rounds):
            for src, dst in schedule.pairs(r):
                table.schedule(r, src, dst)
        result = MeshResult(settings, endpoints, table, schedule.rounds,
                            {k: list(v) for k, v in schedule.shifts.items()})  # fmt: skip
        live = [n for n in self.nodes.values() if n.hello and not n.gone]
        if live and endpoints:
            self._plans(live, endpoints, ids, schedule, settings)
            self._ready(live, endpoints)
            self._quiet_window(live)
            self._rounds(live, endpoints, partners, table, result)
            self._retry(live, table, result, schedule)
            for e, (n, ms) in self.quiet.items():
                rate = n * 1000.0 / ms if ms else 0.0
                endpoints[e] = dataclasses.replace(endpoints[e], busy=rate)
        for e, why in self.quarantined.items():
            endpoints[e] = dataclasses.replace(endpoints[e], problem=why)
        result.stopped = self.stopped
        for n in live:
            if n.gone:  # what was probed before it left stays; the rest is its fault
                for i in n.endpoints:
                    if endpoints[i].up:
                        why = f"its agent left the mesh: {n.gone}"
                        endpoints[i] = dataclasses.replace(endpoints[i], problem=why)
        self._unreachable()
        result.unreachable = dict(self.unreachable)
        result.endpoints = endpoints
        analyse(result, schedule)
        return result

    def _endpoints(self) -> tuple[list[Endpoint], list[tuple[str, int]]]:
        """The mesh's endpoints, node by node in the engine's order, each node's ports in
        its (device, port) order, each on the rail of its rank (rails.assign then keys them
        by subnet or the operator's map)."""
        order = {name: i for i, name in enumerate(self.engine.nodes)}
        nodes = sorted(
            (n for n in self.nodes.values() if n.hello and not n.gone),
            key=lambda n: order.get(n.name, len(order)),
        )
        endpoints, ids = [], []
        self._prefixes: list[int | None] = []
        seen: dict[tuple[str, int | None], str] = {}
        for node in nodes:
            for k, e in enumerate(node.hello["endpoints"]):
                problem = e["problem"]
                address = e["address"] or ""
                port = self.o.tcp_port + e["side"] if e.get("side") else None
                if port is not None and port > 65535:
                    port, problem = None, "no TCP port left for its side channel"
                where = (address, port)
                if address and where in seen:
                    problem = f"its address {address} is also {seen[where]}'s"
                elif address:
                    seen[where] = f"{node.name}/{e['device']}/{e['port']}"
                node.endpoints.append(len(endpoints))
                node.mine.add(len(endpoints))
                endpoints.append(
                    Endpoint(
                        node.name,
                        e["device"],
                        e["port"],
                        k,
                        address,
                        e["state"],
                        e["link_layer"],
                        e["gid_index"],
                        e["hw"],
                        problem,
                        e.get("rate"),
                        e.get("fw"),
                        tcp_port=port,
                        driver=e.get("driver"),
                        kernel=e.get("kernel"),
                        pfc=e.get("pfc"),
                        trust=e.get("trust"),
                        lid=e.get("lid"),
                        guid=e.get("guid"),
                    )  # fmt: skip
                )
                ids.append((node.agent, k))
                self._prefixes.append(e.get("prefix"))
        return endpoints, ids

    def _plans(self, live: list[_Node], endpoints, ids, schedule, settings) -> None:
        """Each agent its plan: its endpoints, those they meet in the rounds, and their
        groups of the schedule. Agents whose groups are all probed whole (every shift) get
        one and the same text, made once."""
        o, encoded, made = self.o, {}, {}
        for node in live:
            names = tuple(sorted({schedule.group_of(i) for i in node.endpoints} - {None}))
            whole = all(schedule.whole(g) for g in names)
            line = made.get(names) if whole else None
            if line is None:
                line = protocol.plan_message(
                    endpoints, ids, schedule.to_wire(names), settings, o.qp_timeout,
                    o.abandon, needed=schedule.met(node.endpoints), encoded=encoded,
                )  # fmt: skip
                if whole:
                    made[names] = line
            self.engine.send_to(node.key, line)

    def _ready(self, live: list[_Node], endpoints: list[Endpoint]) -> None:
        def ready(node: _Node, msg: dict) -> None:
            if msg["t"] != "ready":
                self._drop(node, f"said {msg['t']} before it was ready")
                return
            node.ready = True
            for k, why in msg["problems"].items():
                if k < len(node.endpoints):
                    i = node.endpoints[k]
                    endpoints[i] = dataclasses.replace(endpoints[i], problem=why)
            for k, mtu in msg.get("mtu", {}).items():
                if k < len(node.endpoints):
                    i = node.endpoints[k]
                    endpoints[i] = dataclasses.replace(endpoints[i], mtu=mtu)

        self._pump(self.clock() + READY_TIMEOUT, ready,
                   lambda: all(n.ready or n.gone for n in live))  # fmt: skip
        for n in live:
            if not n.ready:
                self._drop(n, "its ping servers did not start in time")

    def _quiet_window(self, live: list[_Node]) -> None:
        """QUIET seconds with every agent ready and none pinging; a word from one is out of
        turn."""

        def early(node: _Node, msg: dict) -> None:
            self._drop(node, f"said {msg['t']} before round 0")

        if self.o.quiet > 0 and self._talking():
            self._pump(self.clock() + self.o.quiet, early, lambda: False)

    def _rounds(self, live, endpoints, partners: Partners, table: PairTable, result) -> None:
        dead: set[int] = set()
        told: set[int] = set()
        keys = {n.key for n in live}
        o = self.o
        # the rounds (1-based) each endpoint failed whole since a pair with it was answered
        failing: list[list[int]] = [[] for _ in endpoints]
        ends_at = None if o.deadline is None else self.clock() + o.deadline
        r = 0
        for r in range(partners.rounds):
            for n in live:
                if n.gone:
                    dead.update(n.endpoints)
            dead.update(self.quarantined)
            if all(n.gone for n in live) or not self._talking():
                break
            if ends_at is not None and self.clock() >= ends_at:
                self.stopped = (
                    f"--deadline {o.deadline:g} s reached: {r} of {partners.rounds} rounds run"
                )
                break
            skip = sorted(dead - told)
            told |= dead
            t_round = self.clock()
            self.engine.broadcast(protocol.dumps({"t": "round", "r": r, "skip": skip}))
            reported: set[str] = set()

            def result_of(node: _Node, msg: dict, r=r, reported=reported) -> None:
                if msg["t"] != "result" or msg["r"] != r:
                    self._drop(node, f"answered round {r} with {msg['t']} {msg.get('r', '')}")
                    return
                mine = node.mine
                of = partners.of
                for p in msg["pairs"]:
                    src, dst = p[0], p[1]
                    if src not in mine or of(r, src) != dst:
                        self._drop(node, f"reported a pair {src} -> {dst} not its own in round {r}")
                        return
                for p in msg["pairs"]:
                    table.record(r, *p[:10])
                    if p[10]:
                        table.extras(r, p[0], p[10])
                    if p[2] == PairState.SKIPPED:
                        self._said_quarantined(table, r, p[0], p[1], endpoints)
                for i, n in msg["retrans"].items():
                    if i in mine:
                        table.retrans[table.slot(r, i)] = min(n, 2**31 - 1)
                for i, quiet in msg["quiet"].items():
                    if i in mine and i not in self.quiet:
                        self.quiet[i] = (quiet[0], quiet[1])
                reported.add(node.key)

            round_ends = self.clock() + round_timeout(o)
            cut = ends_at is not None and ends_at < round_ends
            self._pump(
                min(round_ends, ends_at) if cut else round_ends,
                result_of,
                lambda reported=reported: len(reported | (self.gone & keys)) >= len(keys),
            )
            result.round_seconds.append(self.clock() - t_round)
            if cut and len(reported | (self.gone & keys)) < len(keys):
                # the deadline came in the middle of the round: its pings are stopped, and
                # what was not reported is not probed, no node's fault
                self.stopped = (
                    f"--deadline {o.deadline:g} s reached in round {r + 1} of {partners.rounds}"
                )
                self.engine.broadcast(protocol.dumps({"t": "end"}))
                self._unrun(r, r + 1, live, reported, partners, table)
                r += 1
                break
            for n in live:
                if n.key not in reported and not n.gone:
                    self._drop(n, f"did not report round {r} in {round_timeout(o):.0f} s")
            self._fill(r, live, reported, endpoints, partners, table)
            self._quarantine(r, endpoints, partners, table, failing, dead)
            if (r + 1) % max(1, partners.rounds // 10) == 0 or r + 1 == partners.rounds:
                self.say(f"mesh: round {r + 1}/{partners.rounds}")
        else:
            return
        if self.stopped is not None:
            self.say(f"mesh: {self.stopped}")
            self._unrun(r, partners.rounds, live, set(), partners, table)

    def _retry(self, live: list[_Node], table: PairTable, result: MeshResult, schedule) -> None:
        """The pairs that lost pings or were slow (as the analysis will judge them: p90 over
        its group's limit), probed once more after the last round (at most RETRY_MAX,
        RETRY_EACH a source): an end that stalled (a busy or emulated host off its CPU) loses
        or delays pings once, a broken path or port every time. A retry that answers every
        ping, within the limit, makes the first a transient, not judged; one that fails again
        adds its count to the pair's error. Not after --deadline stopped the rounds, nor for
        quarantined or departed endpoints."""
        if self.stopped is not None or not self._talking() or not self.o.retry:
            return
        t = table
        limit = slow_limits(result, schedule)
        group_of = {e: g for g, members in schedule.groups.items() for e in members}

        def slow(i: int) -> bool:  # NaN compares False: not slow
            return t.p90[i] > limit[group_of[i % t.width]]

        dead = set(self.quarantined)
        for n in live:
            if n.gone:
                dead.update(n.endpoints)
        wanted: dict[tuple[int, int], int] = {}
        per: dict[int, int] = {}
        for i in t.slots():
            if t.state[i] != PairState.PROBED or not t.sent[i]:
                continue
            if t.received[i] >= t.sent[i] and not slow(i):
                continue
            s, d = i % t.width, t.dst[i]
            if s in dead or d in dead or per.get(s, 0) >= RETRY_EACH:
                continue
            per[s] = per.get(s, 0) + 1
            wanted.setdefault((s, d), i)
        if not wanted or len(wanted) > RETRY_MAX:
            return  # none, or so many that they are no host's stall
        keys = {n.key for n in live if not n.gone and n.mine & {s for s, _ in wanted}}
        self.say(f"mesh: retrying {len(wanted)} pairs that lost pings or were slow")
        self.engine.broadcast(protocol.dumps({"t": "retry", "pairs": [list(p) for p in wanted]}))
        answered: set[str] = set()
        whole = 0

        def retried(node: _Node, msg: dict) -> None:
            nonlocal whole
            if msg["t"] != "retried":
                self._drop(node, f"answered a retry with {msg['t']}")
                return
            for p in msg["pairs"]:
                slot = wanted.get((p[0], p[1]))
                if slot is None or p[0] not in node.mine:
                    self._drop(node, f"retried a pair {p[0]} -> {p[1]} not asked of it")
                    return
            for p in msg["pairs"]:
                slot = wanted[(p[0], p[1])]
                sent, got, p90 = p[3], p[4], p[6]
                was = t.errors.get(slot) or f"{t.received[slot]}/{t.sent[slot]} answered" + (
                    f", p90 {us(t.p90[slot])}" if slow(slot) else ""
                )
                fast = p90 is not None and p90 <= limit[group_of[p[0]]]
                if p[2] == PairState.PROBED and sent and got == sent and fast:
                    whole += 1
                    t.transient.add(slot)
                    t.errors[slot] = printable(
                        f"{was}; retried after the last round: {got}/{sent} answered, p90 "
                        f"{us(p90)} (a stall, not the network)",
                        2 * protocol.MAX_ERROR,
                    )
                else:
                    again = p[9] or f"{got}/{sent} answered, p90 {us(p90)}"
                    t.errors[slot] = printable(
                        f"{was}; retried after the last round: {again}", 2 * protocol.MAX_ERROR
                    )
            answered.add(node.key)

        most = max(per.values())
        self._pump(self.clock() + most * round_timeout(self.o), retried,
                   lambda: len(answered | (self.gone & keys)) >= len(keys))  # fmt: skip
        result.retried = (len(wanted), whole)

    def _unrun(self, first, last, live, reported, partners: Partners, table) -> None:
        """Rounds first..last-1's pairs that were never reported, unscheduled: the mesh ended
        before them (--deadline), which says nothing of either end, so they count neither
        for nor against anyone, as the pairs of the shifts --rounds leaves out."""
        for r in range(first, last):
            for n in live:
                if n.key in reported:
                    continue
                for src in n.endpoints:
                    i = table.slot(r, src)
                    if table.state[i] == PairState.UNSCHEDULED:
                        table.dst[i] = -1

    def _said_quarantined(self, table: PairTable, r: int, src: int, dst: int, endpoints) -> None:
        for end in (src, dst):
            if end in self.quarantined:
                table.errors[table.slot(r, src)] = (
                    f"not probed: {endpoints[end].name} is quarantined"
                )
                return

    def _quarantine(self, r, endpoints, partners: Partners, table, failing, dead) -> None:
        """Endpoints whose every pair of round r was lost while a partner was fine with its
        other partner that round; QUARANTINE_ROUNDS such rounds take one out, unless a pair
        with it was answered in between. A round that says nothing either way (its partners'
        other pairs were with it too: in a small group, the middle shift) neither counts nor
        clears."""
        t = table

        def lost(slot: int) -> bool:
            return t.state[slot] == PairState.PROBED and not t.received[slot]

        def answered(slot: int) -> bool:
            return t.state[slot] == PairState.PROBED and t.received[slot] > 0

        for e in range(len(endpoints)):
            if e in dead:
                continue
            d, s = partners.of(r, e), partners.by(r, e)
            mine = ([t.slot(r, e)] if d >= 0 else []) + ([t.slot(r, s)] if s >= 0 else [])
            if any(answered(x) for x in mine):
                failing[e] = []
                continue
            if len(mine) < 2 or not all(lost(x) for x in mine):
                continue
            # the partners are fine elsewhere: d's own pair, and the pair s served
            dd, ss = partners.of(r, d), partners.by(r, s)
            if not (
                (dd >= 0 and dd != e and answered(t.slot(r, d)))
                or (ss >= 0 and ss != e and answered(t.slot(r, ss)))
            ):
                continue
            failing[e].append(r + 1)
            if len(failing[e]) >= QUARANTINE_ROUNDS:
                said = t.errors.get(t.slot(r, e)) or t.errors.get(t.slot(r, s)) or "no reply"
                self.quarantined[e] = (
                    f"quarantined after rounds {_rounds_said(failing[e])}: every pair with it "
                    f"lost while its partners were answered by others ({said})"
                )
                self.say(f"{endpoints[e].name}: {self.quarantined[e]}")
                dead.add(e)

    def _fill(self, r, live, reported, endpoints, partners: Partners, table: PairTable) -> None:
        """Round r's pairs no agent reported: MISSING (its node gone), or SKIPPED."""
        for n in live:
            if n.key in reported:
                continue
            for src in n.endpoints:
                dst = partners.of(r, src)
                if dst >= 0:
                    table.put(Pair(r, src, dst, PairState.MISSING, error=f"{n.name}: {n.gone}"))
        for src, e in enumerate(endpoints):
            dst = partners.of(r, src)
            if dst >= 0 and table.state[table.slot(r, src)] == PairState.UNSCHEDULED:
                why = "not probed: " + (e.why_down() if not e.up else endpoints[dst].why_down())
                table.put(Pair(r, src, dst, PairState.SKIPPED, error=why))

    def _unreachable(self) -> None:
        seen = set()
        for n in self.nodes.values():
            name = self._name(n)
            if n.gone and not n.endpoints:  # out before the plan: none of its ports meshed
                self.unreachable[name] = n.gone
            seen.add(name)
        for name in self.engine.nodes:
            if name not in seen and name not in self.unreachable:
                self.unreachable[name] = "no word from its agent in time" + (
                    "" if self.engine.name != "srun" else " (no hello from its srun task)"
                )


def mesh(
    engine: Engine,
    options: Options,
    agent_argv: list[str],
    say,
    clock: Callable[[], float] = time.monotonic,
    listen: tuple[str, int] = ("", 0),
) -> MeshResult:
    """One mesh through `engine`, its agents joining this host at `listen` (address, port:
    "" and 0 for any); `say` gets its progress lines; `clock` is what its deadlines and
    durations are read from (a test's virtual clock). An engine that is a link already (a
    simulated cluster's) is spoken through as it is."""
    if options.rate <= 0:
        raise IbtoolError("--rate must be above 0")
    link = engine if hasattr(engine, "broadcast") else Link(engine, listen)
    return Coordinator(link, options, say, clock).run(agent_argv)

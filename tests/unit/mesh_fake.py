"""A simulated cluster behind the mesh's Engine interface: agents that speak the real protocol
(hello, ready, a result line a round, as ibtool.mesh.agent writes them) with pings that are
not sent but computed from the faults injected. The coordinator, the schedule and the
analysis run over it as they do over ClusterShell or srun.
"""

from __future__ import annotations

import json
import queue

from ibtool.mesh.agent import GiveUp
from ibtool.mesh.engines import EXIT, LINE, STDERR, Engine, Event
from ibtool.mesh.protocol import VERSION
from ibtool.mesh.schedule import Partners, Schedule
from ibtool.model.mesh import LOCAL_ROUTE

RTT = 3.0  # us, a healthy pair's median
P90 = 3.6
P99 = 5.0
ROUND_OVERHEAD = 0.05  # s a round costs beyond its slowest pair: messages, QPs to RTS


class VirtualClock:
    """Seconds that pass only when the simulated cluster says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeCluster(Engine):
    """`nodes` x `rails` endpoints, rxe<k>/1 on node i at 10.<k>.<i//250>.<i%250+1>.

    Faults, by endpoint name (node/device/port), node name or pair of names:
    - down: the port is DOWN (in the hello)
    - slow: every pair with it has a p90 of 40 ms (a lossy link under RC: retransmissions)
    - lossy: every pair with it loses half its pings
    - blocked: (a, b) pairs whose connection times out, both ways
    - silent: nodes that never answer (ssh failed: exit 255)
    - garbage: nodes whose agent prints something that is not the protocol
    - dies: {node: round} an agent that exits before reporting that round
    - resends: endpoints whose link loses 20% of what they send, under RC: no ping lost, no
      RTT remarkable, but their ports' retransmission counters move (20% of the pings
      through them), and their partners' (10%, their ACKs to them lost) in rounds they meet
    - jitter: every port retransmits one packet every round (a busy host's stalls)
    - ports: {node: n} a node with n ports where the others have `rails`
    - drift: {node or endpoint: {field: value}} what its hello says otherwise (gid_index,
      rate, fw; mtu, in its ready) than every other endpoint's (1, 100 Gb/s, 16.35.2000, 4096)
    - black: endpoints ACTIVE and connected, every ping to or from them lost (a black hole):
      each pair with one sends what the real agent's GiveUp lets it before abandoning
    - small_mtu: endpoints whose link drops packets of the full 4096-byte payload (a switch
      port at 1500): their pings pass, their full-payload pings are lost
    - shaped: {endpoint: Gb/s} the bandwidth of every pair with it (the others: 90 Gb/s)
    - ecmp: (a, b) pairs one of whose --qps QPs' paths drops everything (the other QPs
      answered)
    - dscp: endpoints that drop packets of a traffic class other than 0 (a DSCP rule)
    - looped: nodes whose ports share a subnet without a routing table each: the kernel
      routes each one's address through lo, and their agent does not probe them
    - missing: {node: [k, ...]} a node without its rxe<k> (an HCA out): its other ports keep
      their devices and addresses (10.<k>..., one subnet a rail)
    - prefix: the prefix length every hello gives its address (16: rails by subnet); None,
      as agents before it, says none
    - flaky: (a, b) pairs that lose a quarter of their pings in the rounds (an end off its
      CPU longer than a ping's timeout) and answer every one when retried
    - busy: {endpoint: per second} ports a job's traffic makes resend at that rate, in the
      quiet window before round 0 and in every round alike (its link itself healthy)

    Time is virtual (`clock`, for the coordinator): a round lasts as long as its slowest
    pair would, each answered ping costing 1/rate, each lost one the plan's timeout, a
    connection that times out one timeout, plus ROUND_OVERHEAD.
    """

    name = "fake"

    def __init__(self, nodes: int, rails: int, *, down=(), slow=(), lossy=(), blocked=(),
                 silent=(), garbage=(), dies=None, count: int = 20, resends=(),
                 jitter: bool = False, black=(), ports=None, drift=None, small_mtu=(),
                 shaped=None, ecmp=(), dscp=(), looped=(), busy=None,
                 quiet: bool = True, missing=None, prefix=None, flaky=(),
                 stalled: bool = False):  # fmt: skip
        super().__init__()
        self.stalled = stalled  # the flaky pairs' replies are late (40 ms), not lost
        self.flaky = {frozenset(p) for p in flaky}
        self.retried: list[tuple[int, int]] = []
        self.missing, self.prefix = dict(missing or {}), prefix
        self.devs: dict[str, list[int]] = {}  # node -> its devices' numbers, in hello order
        self.busy, self.quiet = dict(busy or {}), quiet  # quiet: its agents say the window
        self.looped = set(looped)
        self.small_mtu, self.shaped = set(small_mtu), dict(shaped or {})
        self.ecmp = {frozenset(p) for p in ecmp}
        self.dscp = set(dscp)
        self.drift = dict(drift or {})  # endpoint or node name -> {field: value} of its hello
        self.ports = dict(ports or {})  # node -> its number of ports, where not `rails`
        self.black = set(black)
        self.clock = VirtualClock()
        self.skip: set[int] = set()
        self.nodes = [f"node{i:04d}" for i in range(1, nodes + 1)]
        self.rails = rails
        self.down, self.slow, self.lossy = set(down), set(slow), set(lossy)
        self.blocked = {frozenset(p) for p in blocked}
        self.silent, self.garbage = set(silent), set(garbage)
        self.dies = dict(dies or {})
        self.count = count
        self.resends, self.jitter = set(resends), jitter
        self.ids = {n: f"{i:016x}" for i, n in enumerate(self.nodes)}
        self.sent: list[str] = []
        self.closed = False
        self.partners = None
        self.alive: list[str] = []
        self._parsed: dict[int, tuple] = {}
        self._eps: dict[int, list] = {}
        self._groups: dict[str, tuple] = {}
        self._shifts: dict[str, tuple] = {}
        self._slices: dict[str, dict] = {}
        self.plan_bytes = self.plan_max = 0  # what the plans carried: all, the largest

    def address(self, node_index: int, rail: int) -> str:
        return f"10.{rail}.{node_index // 250}.{node_index % 250 + 1}"

    def start(self, argv: list[str]) -> None:
        self.argv = argv
        for i, node in enumerate(self.nodes):
            if node in self.silent:
                self.events.put(Event(node, STDERR, "ssh: connect to host: No route to host"))
                self.events.put(Event(node, EXIT, 255))
                continue
            if node in self.garbage:
                self.events.put(Event(node, LINE, '{"t": "hello", "v": 1, "id": "zz"}'))
                continue
            eps = []
            for k in range(self.ports.get(node, self.rails)):
                if k in self.missing.get(node, ()):
                    continue
                self.devs.setdefault(node, []).append(k)
                name = f"{node}/rxe{k}/1"
                eps.append(
                    {"device": f"rxe{k}", "port": 1,
                     "state": "DOWN" if name in self.down else "ACTIVE",
                     "link_layer": "Ethernet", "address": self.address(i, k), "gid_index": 1,
                     "hw": False, "problem": None, "rate": "100 Gb/sec (4X EDR)",
                     "fw": "16.35.2000", "prefix": self.prefix,
                     **self.drift.get(node, {}), **self.drift.get(name, {})}
                )  # fmt: skip
            hello = {
                "t": "hello",
                "v": VERSION,
                "id": self.ids[node],
                "node": node,
                "endpoints": eps,
            }
            self.events.put(Event(node, LINE, json.dumps(hello)))

    def get(self, timeout: float):
        """The next event; with none, `timeout` seconds of virtual time pass (a coordinator
        that waits, for its quiet window or a silent node, waits on this clock)."""
        try:
            return self.events.get_nowait()
        except queue.Empty:
            self.clock.now += max(0.0, timeout)
            return None

    def joined(self, key: str) -> bool:
        return key in self.ids and key not in self.silent and key not in self.garbage

    def strangers(self) -> None:
        return None

    def send_to(self, key: str, line: str) -> None:
        """An agent's own plan: its endpoints and those they meet. The simulation keeps the
        union (the mesh as a whole) and checks that each agent got what it needs."""
        self.sent.append(line[:200])
        msg = self._parsed.get(id(line))
        if msg is None:  # one text for many agents (their groups probed whole): read once
            msg = self._parsed[id(line)] = (line, json.loads(line))
        line_, msg = msg
        assert msg["t"] == "plan"
        self.plan = msg
        for e in msg["endpoints"]:
            self._eps[e[0]] = e
        self._groups.update({k: tuple(v) for k, v in msg["schedule"]["groups"].items()})
        self._shifts.update({k: tuple(v) for k, v in msg["schedule"]["shifts"].items()})
        self._slices[key] = msg
        self.plan_bytes += len(line)
        self.plan_max = max(self.plan_max, len(line))
        own = [e[0] for e in msg["endpoints"] if e[1] == self.ids[key]]
        mtus = {str(e[2]): self.drift.get(f"{key}/rxe{self.devs[key][e[2]]}/1", {}).get(
            "mtu", 4096) for e in msg["endpoints"] if e[1] == self.ids[key]}  # fmt: skip
        assert own, key
        ready = {"t": "ready", "problems": {}, "mtu": mtus}
        self.events.put(Event(key, LINE, json.dumps(ready)))

    def broadcast(self, line: str) -> None:
        self.sent.append(line[:200])
        msg = json.loads(line)
        if msg["t"] == "round":
            if self.partners is None:
                self._whole()
            self.skip.update(msg["skip"])  # as the agent keeps them: for the rest of the mesh
            self._round(msg["r"], self.skip)
        elif msg["t"] == "retry":
            self._retry([tuple(p) for p in msg["pairs"]])
        elif msg["t"] == "end":
            for node in self.alive:
                self.events.put(Event(node, EXIT, 0))

    def _whole(self) -> None:
        """The mesh from the agents' plans, each checked: every endpoint its own meet in the
        rounds is in its plan, with its address."""
        n = self.plan["n"]
        assert sorted(self._eps) == list(range(n)), "an endpoint in no agent's plan"
        eps = [self._eps[i] for i in range(n)]
        by_id = {v: k for k, v in self.ids.items()}
        self.names = [f"{by_id[e[1]]}/rxe{self.devs[by_id[e[1]]][e[2]]}/1" for e in eps]
        self.node_of = [by_id[e[1]] for e in eps]
        self.up = [e[4] for e in eps]
        schedule = Schedule(self._groups, self._shifts)
        self.partners = Partners(schedule, n)
        self.own: dict[str, list[int]] = {}
        for i, node in enumerate(self.node_of):
            self.own.setdefault(node, []).append(i)
        self.alive = [node for node in self.nodes if node in self.own]
        for node in self.alive:
            have = {e[0] for e in self._slices[node]["endpoints"]}
            for i in self.own[node]:
                for r in range(self.partners.rounds):
                    for p in (self.partners.of(r, i), self.partners.by(r, i)):
                        assert p < 0 or p in have, f"{node}'s plan lacks endpoint {p}"

    def _pair(self, i: int, d: int) -> tuple[list, float]:
        """The pair's row as the agent reports it, and the seconds it took."""
        names = self.names
        a, b = names[i], names[d]
        count = self.count
        timeout, interval = self.plan["timeout"], 1.0 / self.plan["rate"]
        if i in self.skip or d in self.skip:
            why = "not probed: the other end is down or has no agent"
            return [i, d, 2, 0, 0, None, None, None, False, why], 0.0
        if not (self.up[i] and self.up[d]):
            return [i, d, 2, 0, 0, None, None, None, False, "not probed: down"], 0.0
        if self.node_of[i] == self.node_of[d] and self.node_of[i] in self.looped:
            why = f"{LOCAL_ROUTE} {self._eps[d][3]}, this host's own, through lo"
            return [i, d, 2, 0, 0, None, None, None, False, why], 0.0
        if frozenset((a, b)) in self.blocked:
            return [i, d, 1, 0, 0, None, None, None, False, "cannot reach: timed out"], timeout
        tclass = self.plan.get("path", {}).get("tclass", 0)
        if a in self.black or b in self.black or (tclass and {a, b} & self.dscp):
            give_up, sent = GiveUp(self.plan["abandon"]), 0
            while sent < count:
                sent += 1
                if give_up.loss():
                    break
            why = f"abandoned after {give_up.run} losses in a row: ping {sent}: no reply"
            return [i, d, 1, sent, 0, None, None, None, False, why], sent * timeout
        if frozenset((a, b)) in self.flaky and self.stalled:  # late replies, none lost
            return [i, d, 1, count, count, RTT, 40000.0, 41000.0, False, None], count * interval
        if frozenset((a, b)) in self.flaky:
            lost = count // 4
            took = (count - lost) * interval + lost * timeout
            return [i, d, 1, count, count - lost, RTT, P90, P99, False, "ping 3: no reply"], took
        if a in self.lossy or b in self.lossy:
            took = (count - count // 2) * interval + (count // 2) * timeout
            return [i, d, 1, count, count // 2, RTT, P90, P99, False, "ping: no reply"], took
        if a in self.slow or b in self.slow:
            return [i, d, 1, count, count, RTT * 2, 40000.0, 67000.0, False, None], 0.07 * count
        return self._extras([i, d, 1, count, count, RTT, P90, P99, False, None],
                            count * interval)  # fmt: skip

    def _extras(self, row: list, took: float) -> tuple[list, float]:
        """A pair whose pings were all answered: its QPs, full-payload pings and burst."""
        plan, i, d = self.plan, row[0], row[1]
        a, b = self.names[i], self.names[d]
        extra = {}
        qps = plan.get("qps", 1)
        if qps > 1:
            if frozenset((a, b)) in self.ecmp:  # QP 1 of them lost all its share
                share = self.count // qps + (0 < self.count % qps)
                row[3] -= share - min(share, plan["abandon"])  # given up after those
                row[4] -= share
                row[9] = f"1 of {qps} QPs lost every ping while the others were answered"
                took += share * plan["timeout"]
                extra["qps"] = [qps, 1]
            else:
                extra["qps"] = [qps, 0]
        if plan.get("full") and row[4] == row[3]:
            n = plan["full"]
            if a in self.small_mtu or b in self.small_mtu:
                got = 0
                row[9] = f"0/{n} pings of 4096 bytes answered: ping 1: no reply"
                took += min(n, plan["abandon"]) * plan["timeout"]
            else:
                got = n
            extra["full"] = [4096, min(n, plan["abandon"]) if not got else n, got]
        if plan.get("bw") and row[4] == row[3]:
            extra["bw"] = min(self.shaped.get(a, 90.0), self.shaped.get(b, 90.0))
        if extra:
            row.append(extra)
        return row, took

    def _round(self, r: int, skip: set[int]) -> None:
        of = self.partners.of
        slowest = 0.0
        for node in list(self.alive):
            if self.dies.get(node) == r:
                self.alive.remove(node)
                self.events.put(Event(node, EXIT, 1))
                continue
            pairs = []
            retrans = {}
            for i in self.own[node]:
                d = of(r, i)
                if d >= 0:
                    row, took = self._pair(i, d)
                    pairs.append(row)
                    slowest = max(slowest, took)
                if self.resends or self.jitter:
                    retrans[str(i)] = self._retrans(r, i)
            msg = {"t": "result", "r": r, "pairs": pairs}
            if self.busy:
                for i in self.own[node]:
                    retrans[str(i)] = self._retrans(r, i)
            if retrans:
                msg["retrans"] = retrans
            if self.busy and self.quiet and r == 0:  # the quiet window: 2 s of the job alone
                msg["quiet"] = {str(i): [int(self.busy.get(self.names[i], 0) * 2), 2000]
                                for i in self.own[node]}  # fmt: skip
            line = json.dumps(msg, separators=(",", ":"))
            self.events.put(Event(node, LINE, line))
        self.clock.now += slowest + ROUND_OVERHEAD

    def _retry(self, pairs: list[tuple[int, int]]) -> None:
        """The pairs asked again: each probed as in a round, but a flaky pair (an end that
        stalled once) answers every ping now."""
        self.retried = pairs
        longest = 0.0
        for node in list(self.alive):
            rows, took = [], {}
            for i, d in pairs:
                if self.node_of[i] != node:
                    continue
                if frozenset((self.names[i], self.names[d])) in self.flaky:
                    row = [i, d, 1, self.count, self.count, RTT, P90, P99, False, None]
                    spent = self.count / self.plan["rate"]
                else:
                    row, spent = self._pair(i, d)
                rows.append(row[:10])
                took[i] = took.get(i, 0.0) + spent
            if rows:
                line = json.dumps({"t": "retried", "pairs": rows}, separators=(",", ":"))
                self.events.put(Event(node, LINE, line))
                longest = max(longest, *took.values())
        self.clock.now += longest + ROUND_OVERHEAD

    def _retrans(self, r: int, i: int) -> int:
        partners = [p for p in (self.partners.of(r, i), self.partners.by(r, i)) if p >= 0]
        pings = self.count * len(partners)
        if self.names[i] in self.busy:  # the job's, over the round's time
            took = self.count / self.plan["rate"] + ROUND_OVERHEAD
            return int(self.busy[self.names[i]] * took)
        if self.names[i] in self.resends:
            return pings // 5
        if any(self.names[p] in self.resends for p in partners):
            return self.count // 10 + 1
        return 1 if self.jitter else 0

    def close(self, grace: float) -> None:
        self.closed = True

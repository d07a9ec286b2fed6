"""The N guests of `testbed mesh`: node1 (this guest, the runner) and node2..nodeN on one shared
Ethernet segment (the fabric), each with rxe0 on its NIC, reached with `ssh nodeK` over a
second, management network that the faults leave alone (tests/testbed/guest.sh, setup_mesh:
dropbear on every node, one key per run, a master connection per node).

`Mesh.nodes` are `Node`s, pair.py's `Host` with the mesh's names: `run(argv, timeout)` -> a
CompletedProcess (on node1 here, elsewhere through ssh from the node's checkout with its
testbed environment, bounded there too), `start(argv)` -> a `Process` (its stdout lines as
they come, `wait_for_lines`, `finish`, `stop`), and the node's facts. The fault helpers return
an undo (callable once or more) and are undone at the fixture's teardown whatever happened.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from tests.integration.faults import ipv4_gid, wait_for
from tests.integration.pair import ENV_FILE, Host

MESH_ONLY = "needs the guests of `testbed mesh` (tests/testbed/testbed mesh-suite; make mesh)"
SYS = "/sys/class/infiniband"

# Run on a node by /usr/bin/python3 -S (stdlib, no site: quick under emulation): its ibtool
# processes (an argv with `-m ibtool`, or `ibtool` itself, the wrapper on PATH), then `rdma -j
# res show qp` and `... cm_id`, as one JSON line.
_LEFTOVERS = r"""
import json, os, subprocess
procs = []
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        continue
    names = [os.path.basename(a) for a in argv[:2]]
    pairs = list(zip(argv, argv[1:]))
    if ("-m", "ibtool") in pairs or names[:1] == ["ibtool"] or (
        names[:1] in (["sh"], ["bash"], ["dash"]) and names[1:2] == ["ibtool"]
    ):
        procs.append(f"{pid} {' '.join(argv)}")
res = {}
for kind in ("qp", "cm_id"):
    out = subprocess.run(["rdma", "-j", "res", "show", kind], capture_output=True, text=True)
    res[kind] = json.loads(out.stdout or "[]") if out.returncode == 0 else None
print(json.dumps({"procs": procs, "res": res}))
"""


def in_mesh() -> bool:
    return os.environ.get("IBTOOL_TESTBED") == "1" and os.environ.get("IBTOOL_TB_MESH") == "1"


def link_local(mac: str) -> str:
    """The EUI-64 link-local address of a MAC (the NIC's fe80:: address, its GID 0)."""
    octets = [int(x, 16) for x in mac.split(":")]
    octets[0] ^= 0x02
    eui = bytes(octets[:3] + [0xFF, 0xFE] + octets[3:])
    return str(ipaddress.IPv6Address(b"\xfe\x80" + bytes(6) + eui))


class Node(Host):
    """One guest of the mesh: `name` (nodeK), `address` (10.77.0.K, on the fabric), `ipv6`,
    `device` (rxe0), `netdev` (its fabric NIC), `gid_index` (the IPv4 GID's), `mac`, `mgmt`
    (10.78.0.K, the management NIC's: `ssh nodeK` goes there), `kernel`, `release`, `repo`."""

    def __init__(self, facts: dict[str, str], remote: bool):
        super().__init__(facts["node"], facts, remote)
        self.address = self.ipv4
        self.mac = facts.get("mac", "")
        self.mgmt = facts.get("mgmt_ipv4", "")  # the management address: ssh, Slurm

    def _ssh(self, command: str) -> list[str]:
        return [
            "ssh",
            self.name,
            f"cd {shlex.quote(self.repo)} && set -a && . {ENV_FILE} && set +a && {command}",
        ]

    def __repr__(self) -> str:
        return f"<{self.name} {self.ipv4} {self.netdev}>"

    def sh(self, line: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """The shell line `line` on this node."""
        return self.run(["sh", "-c", line], timeout=timeout)

    def check(self, argv: Sequence[str], timeout: float = 120) -> str:
        """Run `argv` here; its stdout, or an AssertionError naming the node and its stderr."""
        proc = self.run(argv, timeout=timeout)
        assert proc.returncode == 0, (
            f"{self.name}: {shlex.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}"
        )
        return proc.stdout

    def port_state(self) -> str:
        """rxe0/1's state as sysfs says (ACTIVE, DOWN, ...); ABSENT when it cannot be read."""
        proc = self.run(["cat", f"{SYS}/{self.device}/ports/1/state"], timeout=60)
        return proc.stdout.split(":", 1)[-1].strip() if proc.returncode == 0 else "ABSENT"

    def port_ready(self) -> bool:
        """rxe0/1 ACTIVE, with the node's IPv4 GID at its index again."""
        base = f"{SYS}/{self.device}/ports/1"
        proc = self.run(["cat", f"{base}/state", f"{base}/gids/{self.gid_index}"], timeout=60)
        lines = proc.stdout.split()
        return proc.returncode == 0 and "ACTIVE" in lines and ipv4_gid(self.address) in lines

    def leftovers(self) -> tuple[list[str], set[tuple[str, str]]]:
        """Its running ibtool processes ("pid argv") and its QPs and rdma_cm ids that belong to
        a process (the kernel's own, e.g. the GSI QP, have no pid), as pair.Host.resources
        names them."""
        out = self.check(["/usr/bin/python3", "-S", "-c", _LEFTOVERS], timeout=60)
        found = json.loads(out)
        res = found["res"]
        assert res["qp"] is not None and res["cm_id"] is not None, f"{self.name}: rdma res failed"
        qps = {("qp", f"{q.get('ifname')}/{q.get('lqpn')}") for q in res["qp"] if "pid" in q}
        cms = {("cm_id", json.dumps(c, sort_keys=True)) for c in res["cm_id"] if "pid" in c}
        return found["procs"], qps | cms


class Mesh:
    """node1 (`runner`, this guest) and the others, from the testbed topology: node1's own
    (`topology`), the others' from their rwdirs (`OUT/nodeK/topology.json`)."""

    def __init__(self, topology: dict[str, str]):
        self.topology = topology
        names = topology["nodes"].split()
        self.nodes: list[Node] = []
        for name in names:
            if name == topology["node"]:
                self.nodes.append(Node(topology, remote=False))
                continue
            with open(os.path.join(topology["out"], name, "topology.json")) as f:
                self.nodes.append(Node(json.load(f), remote=True))
        self.runner = self.nodes[0]
        self._undos: list[Callable[[], None]] = []

    def __getitem__(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def names(self) -> list[str]:
        return [node.name for node in self.nodes]

    def on_all(
        self, call: Callable[[Node], object], nodes: Iterable[Node] | None = None
    ) -> dict[str, object]:
        """`call(node)` on every node (or `nodes`) at once, one thread each: {name: result}."""
        nodes = list(self.nodes if nodes is None else nodes)
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            results = list(pool.map(call, nodes))
        return {node.name: result for node, result in zip(nodes, results)}

    def run_all(self, argv: Sequence[str], timeout: float = 120) -> dict[str, object]:
        """`argv` on every node at once: {name: CompletedProcess}."""
        return self.on_all(lambda node: node.run(argv, timeout=timeout))

    # -- faults: each returns its undo, also run at teardown ---------------------------------

    def _undo(self, undo: Callable[[], None]) -> Callable[[], None]:
        done = []

        def once() -> None:
            if not done:
                done.append(True)
                undo()

        self._undos.append(once)
        return once

    def lossy(self, node: Node, percent: float) -> Callable[[], None]:
        """netem `loss PERCENT%` as the root qdisc of the node's fabric NIC: every frame it
        sends there (its egress) to any other node is lost at that rate. ssh is untouched: it
        goes over the management NIC."""
        dev = node.netdev
        node.check(["tc", "qdisc", "replace", "dev", dev, "root", "netem", "loss", f"{percent}%"])

        def undo() -> None:
            if "netem" in node.check(["tc", "qdisc", "show", "dev", dev, "root"]):
                node.check(["tc", "qdisc", "del", "dev", dev, "root"])

        return self._undo(undo)

    def port_down(self, node: Node, timeout: float = 60) -> Callable[[], None]:
        """The node's NIC down: its rxe0/1 goes DOWN (waited for). The undo brings the NIC up
        and waits until rxe0/1 is ACTIVE with its IPv4 GID again."""
        node.check(["ip", "link", "set", node.netdev, "down"])

        def undo() -> None:
            node.check(["ip", "link", "set", node.netdev, "up"])
            wait_for(node.port_ready, f"{node.name}'s {node.device}/1 ACTIVE again", timeout)

        once = self._undo(undo)
        wait_for(
            lambda: node.port_state() == "DOWN", f"{node.name}'s {node.device}/1 DOWN", timeout
        )
        return once

    def block_pair(self, a: Node, b: Node) -> Callable[[], None]:
        """Everything between a and b on the fabric dropped, both ways, by an nft table on
        each (`inet ibtool_block_<other>`: input from and output to the other's IPv4, IPv6 and
        link-local fabric addresses); every other pair untouched, and so is the management
        network (ssh, Slurm)."""
        tables = []
        for here, there in ((a, b), (b, a)):
            table = f"ibtool_block_{there.name}"
            v6 = ", ".join(x for x in (there.ipv6, link_local(there.mac) if there.mac else "") if x)
            rules = "".join(
                f"chain {chain} {{\ntype filter hook {chain} priority -10; policy accept;\n"
                f"ip {d} {there.address} drop\n"
                + (f"ip6 {d} {{ {v6} }} drop\n" if v6 else "")
                + "}\n"
                for chain, d in (("input", "saddr"), ("output", "daddr"))
            )
            ruleset = f"table inet {table} {{\n{rules}}}\n"
            here.check(["sh", "-c", 'printf %s "$1" | nft -f -', "sh", ruleset])
            tables.append((here, table))

        def undo() -> None:
            for here, table in tables:
                if table in here.check(["nft", "list", "tables"]):
                    here.check(["nft", "delete", "table", "inet", table])

        return self._undo(undo)

    def _nft(self, node: Node, table: str, rules: dict[str, list[str]]) -> Callable[[], None]:
        """An nft table `inet TABLE` on `node`: {chain (input, output): [rule, ...]}; the undo
        deletes it."""
        body = "".join(
            f"chain {chain} {{\ntype filter hook {chain} priority -10; policy accept;\n"
            + "".join(f"{rule}\n" for rule in lines)
            + "}\n"
            for chain, lines in rules.items()
        )
        ruleset = f"table inet {table} {{\n{body}}}\n"
        node.check(["sh", "-c", 'printf %s "$1" | nft -f -', "sh", ruleset])

        def undo() -> None:
            if table in node.check(["nft", "list", "tables"]):
                node.check(["nft", "delete", "table", "inet", table])

        return self._undo(undo)

    def drop_dscp(self, node: Node, dscp: int) -> Callable[[], None]:
        """RoCE packets of DSCP `dscp` dropped as they reach `node` (a switch port or host
        whose DCB/ACL configuration drops that class): class 0 untouched."""
        return self._nft(node, "ibtool_dscp", {"input": [f"udp dport 4791 ip dscp {dscp} drop"]})

    def drop_larger(self, node: Node, length: int) -> Callable[[], None]:
        """RoCE packets over `length` bytes (IP length) dropped as they reach `node` and as it
        sends them: a link on its path with a smaller MTU than the ends'."""
        rule = f"udp dport 4791 meta length gt {length} drop"
        return self._nft(node, "ibtool_mtu", {"input": [rule], "output": [rule]})

    def black_hole(self, node: Node) -> Callable[[], None]:
        """Every RoCE packet to and from `node` dropped, its port ACTIVE and its TCP side
        channel open: QPs connect, no ping is ever answered."""
        rule = "udp dport 4791 drop"
        return self._nft(node, "ibtool_black", {"input": [rule], "output": [rule]})

    def shape(self, node: Node, rate: str) -> Callable[[], None]:
        """tbf at `rate` (e.g. 20mbit) as the root qdisc of the node's fabric NIC: what it
        sends is slowed, queued not dropped (a second of queue)."""
        dev = node.netdev
        node.check(["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                    "burst", "64kb", "latency", "1s"])  # fmt: skip

        def undo() -> None:
            if "tbf" in node.check(["tc", "qdisc", "show", "dev", dev, "root"]):
                node.check(["tc", "qdisc", "del", "dev", dev, "root"])

        return self._undo(undo)

    def move_gid(self, node: Node, timeout: float = 60) -> Callable[[], None]:
        """The node's IPv4 GID moved to a higher index, as on a node where another address
        took its slots first: its IPv4 address deleted, a temporary IPv6 one added (it takes
        the freed slots), the IPv4 one added again (the next free ones). Waited for."""
        dev, v6 = node.netdev, f"fd00:77::{node.name[4:] or 1}/64"
        prefix = node.check(["sh", "-c", f"ip -o -4 addr show dev {dev} | awk '{{print $4}}'"])
        cidr = next(x for x in prefix.split() if x.split("/")[0] == node.address)
        node.check(["ip", "addr", "del", cidr, "dev", dev])
        node.check(["ip", "-6", "addr", "add", v6, "dev", dev, "nodad"])
        node.check(["ip", "addr", "add", cidr, "dev", dev])

        def moved() -> int | None:
            out = node.sh(f"grep -l {ipv4_gid(node.address)} "
                          f"{SYS}/{node.device}/ports/1/gids/* 2>/dev/null").stdout  # fmt: skip
            found = [int(line.rsplit("/", 1)[1]) for line in out.split()]
            return max(found) if found else None

        wait_for(lambda: (moved() or 0) > node.gid_index, f"{node.name}'s IPv4 GID moved", timeout)

        def undo() -> None:
            node.run(["ip", "-6", "addr", "del", v6, "dev", dev], timeout=60)
            node.check(["ip", "addr", "del", cidr, "dev", dev])
            node.check(["ip", "addr", "add", cidr, "dev", dev])
            wait_for(node.port_ready, f"{node.name}'s IPv4 GID at its index again", timeout)

        return self._undo(undo)

    def undo_all(self) -> None:
        """Every fault still in place undone, the newest first; the first error raised after."""
        errors = []
        while self._undos:
            try:
                self._undos.pop()()
            except Exception as e:  # every undo runs; the first error is raised after
                errors.append(e)
        if errors:
            raise errors[0]

    # -- leftovers ---------------------------------------------------------------------------

    def resources(self) -> dict[str, set[tuple[str, str]]]:
        """Every node's QPs and rdma_cm ids that belong to a process."""
        return {name: res for name, (_, res) in self.on_all(Node.leftovers).items()}

    def wait_nothing_left(
        self, before: dict[str, set[tuple[str, str]]] | None = None, timeout: float = 60
    ) -> None:
        """Until no node runs an ibtool process and none holds a QP or rdma_cm id of a process
        (beyond `before`, a `resources()` taken earlier, if given). Polls, never sleeps a fixed
        time; an AssertionError naming what is left after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            left = {}
            for name, (procs, res) in self.on_all(Node.leftovers).items():
                res = res - (before or {}).get(name, set())
                if procs or res:
                    left[name] = {"ibtool": procs, "rdma": sorted(res)}
            if not left:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"left behind after {timeout} s: {left}")
            time.sleep(0.2)

    def stop_all(self) -> None:
        for node in self.nodes:
            node.stop_all()

"""A doctor run: which port, this end's facts, the peer's (asked of its ping server), what the
kernel's routing shows, the checklist, and the probe at the end.

Nothing here changes either host: the facts are read, the peer is asked on a connection that
builds nothing, and the probe's QPs are destroyed before the run ends.

The peer is asked first, and answers while this end reads its own facts: its server reads its
facts anew for each query, which takes seconds on a slow host (an emulated one), and it has
the whole --timeout from the question for it; this end waits for what is left of that.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING

from ibtool.doctor.checks import Context, run_checks
from ibtool.doctor.facts import collect
from ibtool.doctor.gpu import gpudirect
from ibtool.errors import IbtoolError, NotFoundError
from ibtool.model.deferred import dataclass
from ibtool.model.doctor import Facts, Finding, Verdict, is_infiniband
from ibtool.model.records import PortState
from ibtool.model.system import same_subnet

if TYPE_CHECKING:
    from ibtool.doctor.ib import IbPath


@dataclass(frozen=True)
class Options:
    peer: str | None = None
    tcp_port: int = 18520
    compat: str | None = None  # "rc_pingpong" or "rping": a stock peer, asked nothing
    gid_index: int | None = None
    tclass: int | None = None
    count: int = 3
    size: int = 64
    timeout: float = 2.0
    probe: bool = True
    pid: int | None = None  # the process whose limits, cgroup and CPUs count (None: doctor's)
    # InfiniBand: the error counters' thresholds (infiniband-diags' error_thresholds), read
    # only when the port is InfiniBand (None: none, any error counts)
    thresholds: Callable[[], dict[str, int]] | None = None


@dataclass
class Report:
    local: Facts
    peer: Facts | None
    findings: list[Finding] = field(default_factory=list)
    peer_address: str | None = None
    process: object | None = None  # ibtool.model.system.Process, with --pid
    fabric: IbPath | None = None  # InfiniBand: what the subnet answered (ibtool.doctor.ib)

    @property
    def verdict(self) -> Verdict:
        return Verdict.worst(f.verdict for f in self.findings)

    def to_json(self) -> dict:
        data = {
            "status": self.verdict.value,
            "peer": self.peer_address,
            "checks": [f.to_json() for f in self.findings],
            "local": self.local.to_json(),
            "remote": self.peer.to_json() if self.peer is not None else None,
        }
        if self.process is not None:
            data["process"] = self.process.to_json()
        if self.fabric is not None:
            data["fabric"] = self.fabric.to_json()
        return data


def resolve(peer: str) -> str:
    """The peer's address (the first of its name's)."""
    try:
        return socket.getaddrinfo(peer, None, type=socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError, UnicodeError) as e:
        raise NotFoundError(f"cannot resolve {peer}: {getattr(e, 'strerror', None) or e}",
                            "give the peer's address") from None  # fmt: skip


def pick_port(host, selector: str | None, route_dev: str | None) -> tuple[str, int]:
    """The port doctor looks at: the one asked for; else the one whose netdev the kernel routes
    the peer through; else the first ACTIVE one; else the first."""
    ports = host.ports(selector, fields=("state", "netdev", "link_layer"))
    if not ports:
        raise NotFoundError("no RDMA port" + (f" matches {selector}" if selector else ""))
    if selector is None and route_dev is not None:
        vlans = host.vlans()
        lower = vlans.get(route_dev, (None, route_dev))[1]
        for p in ports:
            if p.netdev in (route_dev, lower):
                return p.device, p.port
    active = [p for p in ports if p.state == PortState.ACTIVE]
    chosen = (active or ports)[0]
    return chosen.device, chosen.port


class PeerQuery:
    """The question to the peer's server, asked when made and answered in a thread of its own
    while this end reads its facts: the peer has the whole --timeout from the question (the
    connection, its server reading its facts, the answer), and `answer()` waits for what is
    left of it. Nothing is built on either side: the connection carries one query and one
    answer (ibtool.rdma.ping.facts)."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.asked = time.monotonic()
        self.result: tuple[Facts | None, str | None, str | None] | None = None
        self.thread: threading.Thread | None = None
        if opts.compat:
            self.result = (None, f"a stock {opts.compat} peer has no facts to tell", None)
            return
        self.thread = threading.Thread(target=self._ask, name="doctor-peer", daemon=True)
        self.thread.start()

    def _ask(self) -> None:
        from ibtool.rdma.ping.facts import query_facts

        opts = self.opts
        try:
            data = query_facts(opts.peer, opts.tcp_port, opts.timeout)
        except IbtoolError as e:
            self.result = (None, *self._why(e))
            return
        except Exception as e:  # a thread must tell its end, whatever it is
            self.result = (None, f"{type(e).__name__}: {e}", None)
            return
        try:
            self.result = (Facts.from_wire(data), None, None)
        except ValueError as e:
            self.result = (None, f"its facts are unusable: {e}", None)

    def _why(self, e: IbtoolError) -> tuple[str, str | None]:
        """Why no facts came, and the fix when it is not "start a server": a server that
        took the whole --timeout without answering (it was reached: its connection is
        not what failed, which would carry a hint) is slow, not missing."""
        took = time.monotonic() - self.asked
        if e.hint is None and took >= self.opts.timeout * 0.9 and "timed out" in e.message:
            t = f"{self.opts.timeout:g}"
            return (
                f"{self.opts.peer}:{self.opts.tcp_port} took the question but answered nothing "
                f"within --timeout ({t} s)",
                f"give its server longer: --timeout {max(10, 4 * self.opts.timeout):g} (it reads "
                "its facts anew for each query: seconds on a slow or emulated host)",
            )
        return e.message, None

    def answer(self) -> tuple[Facts | None, str | None, str | None]:
        """(facts, why not, what to do about it) once the peer answered or its time is up."""
        if self.thread is not None:
            # query_facts keeps to its deadline; the margin is for the thread's own end
            left = self.asked + self.opts.timeout - time.monotonic()
            self.thread.join(max(left, 0.0) + 1.0)
        if self.result is None:
            t = f"{self.opts.timeout:g}"
            return None, f"no answer within --timeout ({t} s)", None
        return self.result


def route_for(host, destination: str | None, source: str | None = None):
    """The kernel's route to `destination` (from `source`), or None on a capture."""
    if destination is None or not host.live:
        return None
    return host.route(destination, source)


def _same_family(a: str | None, b: str | None) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(a).version == ipaddress.ip_address(b).version
    except ValueError:
        return False


def diagnose(host, selector: str | None, opts: Options, warn) -> Report:
    opened = host.open_process(opts.pid) if opts.pid is not None else None
    peer_ip = resolve(opts.peer) if opts.peer else None
    query = PeerQuery(opts) if opts.peer else None  # answered while this end reads its own
    first_route = None
    if peer_ip is not None and host.live:
        try:
            first_route = host.route(peer_ip)
        except (IbtoolError, OSError) as e:
            warn(f"route to {peer_ip}: {getattr(e, 'message', None) or e}")
    device, port = pick_port(host, selector, first_route.dev if first_route else None)
    process = host.read_process(opts.pid, *opened) if opened is not None else None
    local = collect(host, device, port, opts.gid_index, process=process)
    link, link_why = link_facts(host, local)
    # InfiniBand: this end's cable and SM asked while the peer answers, the route after
    fabric = None
    if is_infiniband(local) is not False and host.live:  # the fabric's modules: IB only
        from ibtool.doctor import ib

        fabric = ib.gather_local(host, local, opts.thresholds, warn)
    peer, no_facts, no_facts_fix = (None, None, None)
    if query is not None:
        peer, no_facts, no_facts_fix = query.answer()
    if fabric is not None:
        from ibtool.doctor import ib

        why = f"{opts.peer} told nothing: {no_facts}" if no_facts else None
        fabric = ib.gather_route(host, fabric, peer, why)
    # The RDMA path goes to the peer's GID address, which may not be the one we asked.
    target = peer_ip
    if peer is not None and peer.gid_index is not None:
        used = next((g for g in peer.gids if g.index == peer.gid_index), None)
        if used is not None and used.ip:
            target = used.ip
    # RoCE leaves from the GID's address: a host that routes by source (ip rule from ...)
    # sends it where a lookup of the destination alone would not
    gid = next((g for g in local.gids if g.index == local.gid_index), None)
    source = gid.ip if gid is not None and gid.ip and _same_family(gid.ip, target) else None
    route = first_route if target == peer_ip and source is None else None
    if route is None and target is not None:
        try:
            route = route_for(host, target, source)
        except (IbtoolError, OSError) as e:
            warn(f"route to {target}: {getattr(e, 'message', None) or e}")
    siblings: tuple[str, ...] | None = None
    netdev = gid.netdev if gid is not None and gid.netdev else local.netdev
    if host.live and netdev:
        try:
            siblings = same_subnet(netdev, host.interface_addresses())
        except (OSError, ImportError, ValueError) as e:
            warn(f"IPv4 addresses not read: {e}")
    ctx = Context(opts.peer, peer_ip, route, no_facts, opts.tclass, opts.compat, siblings,
                  no_facts_fix=no_facts_fix, process=process, link=link,
                  link_why=link_why, fabric=fabric)  # fmt: skip
    findings = run_checks(local, peer, ctx)
    gpu = gpudirect(host, device)  # a host with GPUs: this end's side of GPUDirect RDMA
    if gpu is not None:
        findings.append(gpu)
    report = Report(local, peer, findings, opts.peer, process, fabric)
    if opts.peer and opts.probe:
        report.findings.extend(_probe(local, peer, opts))
    return report


def link_facts(host, local: Facts):
    """The link modes of this end's netdev (Ethernet ports), or None and why not."""
    from ibtool.doctor import link

    netdev = local.netdev
    if local.link_layer != "Ethernet" or local.state != "ACTIVE":
        return None, None
    if not netdev:
        return None, "no netdev: its link modes not known"
    if not host.live or host.root != "/":
        return None, f"{netdev}'s supported link modes need the running kernel (ethtool)"
    try:
        return link.link_settings(netdev), None
    except OSError as e:
        return None, f"{netdev}'s link modes not known (ethtool: {e.strerror or e})"
    except ValueError as e:
        return None, f"{netdev}'s link modes not known ({e})"


def _path_mtu(local: Facts, peer: Facts | None) -> int | None:
    """The MTU a connection between the two ends takes: the smaller active MTU."""
    mtus = [f.active_mtu for f in (local, peer) if f is not None and f.active_mtu]
    return min(mtus) if mtus else None


def _probe(local: Facts, peer: Facts | None, opts: Options) -> list[Finding]:
    from ibtool.doctor import probe

    try:
        if opts.compat == "rping":
            return probe.probe_rping(opts.peer, opts.tcp_port, opts.count, opts.size, opts.timeout)
        where = (local.device, local.port, local.gid_index, opts.peer, opts.tcp_port, opts.count,
                 opts.size, opts.timeout)  # fmt: skip
        if opts.compat == "rc_pingpong":
            return probe.probe_pingpong(*where)
        return probe.probe_native(*where, opts.tclass, _path_mtu(local, peer))
    except IbtoolError as e:
        hint = f" ({e.hint})" if e.hint else ""
        return [Finding("probe", Verdict.FAIL, f"not run: {e.message}{hint}")]

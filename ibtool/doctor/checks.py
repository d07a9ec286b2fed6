"""The checklist: each check reads this end's Facts and, when the peer told its own, the
peer's, and gives one Finding (PASS / WARN / FAIL / SKIP) with the evidence and the fix.

The order is the order a path is built in, and roughly how often each cause turns up in the
threads operators file (NCCL, UCX, perftest, rdma-core): the stack, the port and its rate, the
GID, the rdma_cm mode, memlock (and with --pid the process's rdma cgroup), the MTU, routing and
ARP on multi-NIC hosts, UDP 4791, the traffic class against DCB, the P_Key, PCIe, NUMA. A
check never raises: what it cannot know is a SKIP saying why.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import field
from typing import TYPE_CHECKING

from ibtool.model.deferred import dataclass
from ibtool.model.doctor import Facts, Finding, Verdict

if TYPE_CHECKING:
    from ibtool.doctor.ib import IbPath
    from ibtool.doctor.link import LinkSettings
    from ibtool.model.system import Process

PASS, WARN, FAIL, SKIP = Verdict.PASS, Verdict.WARN, Verdict.FAIL, Verdict.SKIP
PROBE_MEMORY = 1 << 20  # what doctor's probe pins: two buffers, a QP, a CQ (a generous bound)
# What one RC connection holds against an rdma cgroup (kernel/cgroup/rdma.c): the opened device
# (a user context) is one hca_handle; its PD, CQ, QP and MR are one hca_object each
# (drivers/infiniband/core/rdma_core.c). Doctor's probe builds exactly these.
PROBE_HANDLES, PROBE_OBJECTS = 1, 4
PKEY_FULL = 0x8000
PKEY_BASE = 0x7FFF


@dataclass(frozen=True)
class Context:
    """What the checks know beyond the facts: the peer as given, what the wire showed."""

    peer: str | None = None  # the address or name the operator gave
    peer_ip: str | None = None  # what it resolved to
    route: object | None = None  # the kernel's route to the peer's RDMA address (Host.route)
    no_facts: str | None = None  # why the peer told nothing, when it did not
    tclass: int | None = None  # the traffic class the run uses (--tclass)
    compat: str | None = None  # the peer runs this stock tool: it is asked nothing
    # other netdevs with an address in the GID netdev's subnet; None: not known (a capture)
    siblings: tuple[str, ...] | None = ()
    extra: dict = field(default_factory=dict)
    no_facts_fix: str | None = None  # what to do about it, when not starting a server
    # --pid: the process whose limits, cgroup and CPUs this end's facts are (None: doctor's own)
    process: Process | None = None
    link: LinkSettings | None = None  # this end's netdev's link modes (ethtool), when read
    link_why: str | None = None  # why they were not
    # InfiniBand: what was asked of the subnet through this end's port (ibtool.doctor.ib);
    # None on any other port, or a capture: no InfiniBand checks then
    fabric: IbPath | None = None


def run_checks(local: Facts, peer: Facts | None, ctx: Context) -> list[Finding]:
    checks = CHECKS
    if ctx.process is not None:  # the process's cgroup, after its memlock
        at = checks.index(check_memlock) + 1
        checks = checks[:at] + (check_cgroup,) + checks[at:]
    if ctx.fabric is not None:  # InfiniBand: the SM, both cables, the route, after the rate
        from ibtool.doctor import ib

        at = checks.index(check_rate) + 1
        checks = checks[:at] + ib.CHECKS + checks[at:]
    return [check(local, peer, ctx) for check in checks]


def _both(local: Facts, peer: Facts | None, one: Callable[[Facts], tuple]) -> tuple:
    """(verdict, evidence, fix) of `one` on each end, combined: the worst verdict, each side's
    evidence labelled ("both:" when the two ends say the same)."""
    here = one(local)
    if peer is None:
        return here
    there = one(peer)
    if here == there:
        fix = f"on both ends: {here[2]}" if here[2] else None
        return here[0], f"both: {here[1]}", fix
    verdict = Verdict.worst([here[0], there[0]])
    evidence = f"here: {here[1]}; peer: {there[1]}"
    fixes = [f for v, f in ((here[0], here[2]), (there[0], f"on the peer: {there[2]}"))
             if v in (WARN, FAIL) and f and not f.endswith(": None")]  # fmt: skip
    return verdict, evidence, "; ".join(fixes) or None


def _finding(check: str, result: tuple) -> Finding:
    verdict, evidence, fix = result
    return Finding(check, verdict, evidence, fix if verdict in (WARN, FAIL) else None)


def _roce(f: Facts) -> bool:
    return f.link_layer == "Ethernet" and f.protocol != "iw"


def _ip(f: Facts) -> bool:
    """RoCE and iWARP: the data path is IP, routed by the kernel's tables."""
    return f.link_layer == "Ethernet"


def _not_roce(check: str, f: Facts) -> Finding | None:
    if f.protocol == "iw":
        return Finding(check, SKIP, "iWARP port: it connects through rdma_cm over TCP, by IP "
                       "address")  # fmt: skip
    if not _roce(f):
        return Finding(check, SKIP, "InfiniBand port: " + _IB_WHY[check])
    return None


_IB_WHY = {
    "gid": "addressed by LID, GIDs need no choosing",
    "roce_mode": "no RoCE mode",
    "udp4791": "no UDP",
    "qos": "service levels, not DSCP",
    "arp": "no IP routing on the data path",
    "route": "no IP routing on the data path",
}


# -- the stack -------------------------------------------------------------------------------


def check_stack(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    def one(f: Facts):
        if f.modules is None:
            return SKIP, "module state not known (a capture without /sys/module)", None
        missing = [m for m in ("ib_core", "ib_uverbs", "rdma_ucm") if m not in f.modules]
        if "ib_uverbs" in missing:
            return FAIL, "ib_uverbs not loaded: no verbs for user space", "modprobe ib_uverbs"
        if f.uverbs is None:
            return (
                FAIL,
                f"{f.device} has no uverbs device: user space cannot open it",
                "modprobe ib_uverbs (and the device's driver: mlx5_ib, rdma_rxe, ...)",
            )
        if f.uverbs_node is False:
            return (
                FAIL,
                f"/dev/infiniband/{f.uverbs} missing",
                "udevadm trigger (rdma-core's udev rules create the node)",
            )
        if "rdma_ucm" in missing:
            return (
                FAIL,
                "rdma_ucm not loaded: rdma_cm applications (librdmacm: rping, "
                "perftest -R, UCX, ibtool ping --cm) cannot connect",
                "modprobe rdma_ucm",
            )
        if f.rdma_cm_node is False:
            return FAIL, "/dev/infiniband/rdma_cm missing", "udevadm trigger"
        if f.provider is False:
            return (
                FAIL,
                f"no libibverbs provider for driver {f.driver} in /etc/libibverbs.d",
                "install the providers (Debian: ibverbs-providers; RHEL: libibverbs)",
            )
        said = f"{', '.join(f.modules)} loaded, {f.uverbs}"
        if f.provider:
            said += f", provider for {f.driver}"
        return PASS, said, None

    return _finding("stack", _both(local, peer, one))


def check_port(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    def one(f: Facts):
        where = f"{f.device}/{f.port}"
        if f.state is None:
            return SKIP, f"{where}: state not known", None
        said = f"{where} {f.state}, {f.physical_state or '?'}" + (f", {f.rate}" if f.rate else "")
        if f.state == "ACTIVE":
            if f.link_layer == "InfiniBand" and not f.lid:
                return FAIL, f"{said}, no LID", "check the subnet manager (sminfo, ibstat)"
            return PASS, said, None
        if _roce(f):
            fix = f"ip link set dev {f.netdev or 'NETDEV'} up; check the cable and the switch port"
        else:
            fix = "check the cable and the subnet manager (ibstat, sminfo)"
        return FAIL, said, fix

    verdict, evidence, fix = _both(local, peer, one)
    if verdict == PASS and peer is not None:
        verdict, evidence, fix = _alike(local, peer, evidence)
    return _finding("port", (verdict, evidence, fix))


def _alike(local: Facts, peer: Facts, evidence: str) -> tuple:
    """Two ACTIVE ends that should match and do not: a rate (one end trained down, or a
    cable or port slower than the rest: the slower sets the pace, and an end that trained
    down often drops more) or, on one driver, a firmware version (what one fixed the other
    may still do). WARNs: the path works, it is not what it should be."""
    said, fixes = [], []
    if local.rate and peer.rate and local.rate != peer.rate:
        said.append("the ends run at different rates")
        fixes.append("reseat or replace the cable of the slower end, or check its port's speed")
    if local.driver and local.driver == peer.driver and local.fw and peer.fw:
        if local.fw != peer.fw:
            said.append(f"firmware {local.fw} here, {peer.fw} on the peer")
            fixes.append("bring both adapters to one firmware version")
    if not said:
        return PASS, evidence, None
    return WARN, f"{evidence}: {'; '.join(said)}", "; ".join(fixes)


_IB_MAXIMUM = (
    "its maximum is not known here: InfiniBand keeps the widths and speeds a port supports in "
    "its PortInfo, which only a MAD reads (iblinkinfo marks a link below what both its ends "
    "support)"
)


def check_rate(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    """This end's rate against the most its port supports: on Ethernet (RoCE, iWARP) the
    netdev's fastest supported link mode (ethtool), whose speed the port's rate translates;
    on InfiniBand not knowable without a MAD, and said so. The peer's rate is the port
    check's to compare."""
    where = f"{local.device}/{local.port}"
    if not local.rate:
        return Finding("rate", SKIP, f"{where}: rate not known")
    if local.state != "ACTIVE":
        return Finding("rate", SKIP, f"{where} not ACTIVE: no rate to judge")
    said = f"{where} at {local.rate}"
    if not _ip(local):
        return Finding("rate", SKIP, f"{said}; {_IB_MAXIMUM}")
    link = ctx.link
    if link is None:
        why = ctx.link_why or f"{local.netdev or 'its netdev'}'s link modes not known"
        return Finding("rate", SKIP, f"{said}; {why}")
    return _judge_rate(said, local.rate, link)


def _judge_rate(said: str, rate: str, link: LinkSettings) -> Finding:
    from ibtool.doctor.link import mode_lanes, mode_speed, speed_text

    netdev = link.netdev
    if not link.supported:
        if link.unknown_bits:
            why = f"{netdev} supports only link modes newer than this ibtool knows: not judged"
        elif link.speed is None:
            if "1X SDR" in rate:
                said += " (1X SDR is what the kernel shows for an unknown speed)"
            why = (
                f"{netdev} reports no speed and no supported link modes (a virtual NIC): "
                "nothing to judge it against"
            )
        else:
            why = (
                f"{netdev} runs at {speed_text(link.speed)} and reports no supported link "
                "modes (a bond or a virtual NIC): nothing to judge it against"
            )
        return Finding("rate", SKIP, f"{said}; {why}")
    best = link.fastest
    top = mode_speed(best)
    if link.speed is None:
        why = f"{netdev} reports no speed now (it supports up to {speed_text(top)}, {best})"
        return Finding("rate", SKIP, f"{said}; {why}")
    now = speed_text(link.speed)
    if link.speed >= top:
        if link.unknown_bits:
            why = f"{netdev} at {now} also supports link modes newer than this ibtool knows"
            return Finding("rate", SKIP, f"{said}; {why}: not judged")
        return Finding("rate", PASS, f"{said}: {netdev} at {now}, the fastest it supports ({best})")
    lanes = mode_lanes(best)
    width = re.search(r"\((\d+)X", rate)
    mode = best
    if lanes and width and int(width.group(1)) < lanes:
        mode += f": {lanes} lanes, {width.group(1)}X here"
    evidence = f"{said}: {netdev} runs at {now}, below the {speed_text(top)} it supports ({mode})"
    fix = (
        "reseat or replace the cable (or its transceiver) and check the switch port (its speed "
        f"setting, its cable): `ethtool {netdev}` shows what both ends advertise"
    )
    if link.partner:
        theirs = link.partner_fastest
        if mode_speed(theirs) <= link.speed:
            evidence += f"; the link partner advertises no more ({theirs})"
            fix = (
                f"check the switch port first: it advertises no more than {theirs} (its speed "
                f"setting, its port type); then the cable: `ethtool {netdev}`"
            )
        else:
            evidence += f"; the link partner advertises {theirs}"
    return Finding("rate", WARN, evidence, fix)


# -- addressing ------------------------------------------------------------------------------


def _used_gid(f: Facts):
    return next((g for g in f.gids if g.index == f.gid_index), None)


def _family(ip: str | None) -> str:
    if ip is None:
        return "none"
    addr = ipaddress.ip_address(ip)
    if addr.version == 4:
        return "IPv4"
    return "link-local IPv6" if addr.is_link_local else "IPv6"


def check_gid(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    skipped = _not_roce("gid", local)
    if skipped is not None:
        return skipped

    def one(f: Facts):
        if f.gid_index is None:
            kinds = sorted({_family(g.ip) for g in f.gids if g.type == "RoCE v2"}) or ["none"]
            return (
                FAIL,
                f"no routable RoCE v2 GID on {f.netdev} (RoCE v2 GIDs: {', '.join(kinds)})",
                f"ip addr add ADDRESS/PREFIX dev {f.netdev}",
            )
        g = _used_gid(f)
        if g is None:
            return SKIP, f"GID {f.gid_index} not in the table", None
        said = f"GID {g.index} {g.ip or g.gid} {g.type} on {g.netdev}"
        if g.vlan is not None:
            said += f" (VLAN {g.vlan})"
        if g.type != "RoCE v2":
            return (
                WARN,
                f"{said}: RoCE v1 is not routable",
                "use a RoCE v2 GID (ibtool gids --best)",
            )
        if _family(g.ip) == "link-local IPv6":
            return (
                FAIL,
                f"{said}: link-local only, no IPv4 or global IPv6 address",
                f"ip addr add ADDRESS/PREFIX dev {g.netdev}",
            )
        return PASS, said, None

    verdict, evidence, fix = _both(local, peer, one)
    a, b = _used_gid(local), _used_gid(peer) if peer is not None else None
    if a is not None and b is not None and verdict != FAIL:
        if a.type != b.type:
            verdict, fix = FAIL, "use the same RoCE version on both ends (RoCE v2: gids --best)"
            evidence += f"; {a.type} here against {b.type} on the peer"
        elif _family(a.ip) != _family(b.ip):
            verdict, fix = FAIL, "give both ends an address of one family on their RoCE netdevs"
            evidence += f"; {_family(a.ip)} here against {_family(b.ip)} on the peer"
        elif (a.vlan is None) != (b.vlan is None):
            verdict = WARN
            fix = "tag both ends alike: a VLAN GID against an untagged one meets only if routed"
            evidence += f"; VLAN {a.vlan} here against VLAN {b.vlan} on the peer"
    return _finding("gid", (verdict, evidence, fix))


def _default_mode(f: Facts) -> tuple[str, bool]:
    """rdma_cm's RoCE mode for the port: configfs, or the kernel's default, the first GID
    type the port supports (drivers/infiniband/core/cma.c, cma_add_one: find_first_bit of
    roce_gid_type_mask_support), RoCE v1 on ports that have both."""
    if f.roce_mode is not None:
        return ("RoCE v2" if "v2" in f.roce_mode else "RoCE v1"), True
    types = {g.type for g in f.gids}
    return ("RoCE v1" if "RoCE v1" in types else "RoCE v2"), False


def check_roce_mode(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    skipped = _not_roce("roce_mode", local)
    if skipped is not None:
        return skipped

    def one(f: Facts):
        mode, configured = _default_mode(f)
        said = f"rdma_cm default {mode}" + ("" if configured else " (kernel default)")
        fix = (
            f"echo 'RoCE v2' > /sys/kernel/config/rdma_cm/{f.device}/ports/{f.port}/"
            "default_roce_mode (mkdir /sys/kernel/config/rdma_cm/DEV first; or cma_roce_mode)"
        )
        if mode == "RoCE v1":
            return WARN, f"{said}: rdma_cm connections are not routable", fix
        return PASS, said, None

    return _finding("roce_mode", _both(local, peer, one))


# -- limits ----------------------------------------------------------------------------------


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def check_memlock(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    proc = ctx.process

    def one(f: Facts):
        if proc is not None and f is local:
            return _process_memlock(f, proc)
        if f.memlock_soft is None:
            return SKIP, "memlock limit not known", None
        if f.memlock_soft == -1:
            return PASS, "memlock unlimited", None
        said = f"memlock {_size(f.memlock_soft)}"
        fix = (
            "prlimit --memlock=unlimited --pid PID; for jobs: 'memlock unlimited' in "
            "/etc/security/limits.d/ (LimitMEMLOCK=infinity in systemd units)"
        )
        if f.ipc_lock:
            return (
                PASS,
                f"{said}, not binding: this process has CAP_IPC_LOCK (jobs without it are bound)",
                None,
            )
        if f.memlock_soft < PROBE_MEMORY:
            return FAIL, f"{said}: memory registration beyond it fails (ENOMEM)", fix
        return WARN, f"{said}: MPI and NCCL jobs register more; RDMA stacks ask for unlimited", fix

    return _finding("memlock", _both(local, peer, one))


def _process_memlock(f: Facts, proc: Process) -> tuple:
    """--pid's memlock: the process's own limit (its hard one too when it differs: it may
    raise its soft limit that far itself), and the fix for it and for its next start."""
    who = proc.label
    if f.memlock_soft is None:
        return SKIP, f"{who}: memlock limit not known", None
    if f.memlock_soft == -1:
        return PASS, f"{who}: memlock unlimited", None
    said = f"{who}: memlock {_size(f.memlock_soft)}"
    if f.memlock_hard is not None and f.memlock_hard != f.memlock_soft:
        hard = "unlimited" if f.memlock_hard == -1 else _size(f.memlock_hard)
        said += f" (hard limit {hard})"
    fix = (
        f"prlimit --memlock=unlimited --pid {proc.pid} (now); for its next start: 'memlock "
        "unlimited' in /etc/security/limits.d/, LimitMEMLOCK=infinity in the unit of the "
        "service that starts it (slurmd's for Slurm jobs)"
    )
    if f.ipc_lock:
        return PASS, f"{said}, not binding: it has CAP_IPC_LOCK", None
    if f.memlock_soft < PROBE_MEMORY:
        return FAIL, f"{said}: memory registration beyond it fails (ENOMEM)", fix
    return WARN, f"{said}: MPI and NCCL jobs register more; RDMA stacks ask for unlimited", fix


def check_cgroup(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    """--pid's rdma cgroup: the limits on the device of every cgroup from the process's up
    (each one counts: kernel/cgroup/rdma.c, rdmacg_try_charge), against what one RC
    connection holds (1 hca_handle, 4 hca_objects) and against what is in use."""
    proc = ctx.process
    if proc is None:
        return Finding("cgroup", SKIP, "no --pid given")
    cg = proc.cgroup
    if cg is None:
        return Finding("cgroup", SKIP, f"{proc.label}: cgroup not known ({proc.cgroup_why})")
    where = f"{proc.label} in {cg.path}" + (" (cgroup v1)" if cg.version == 1 else "")
    if cg.levels is None:
        return Finding("cgroup", SKIP, f"{where}: {cg.why}")
    bad = next((lv.bad for lv in cg.levels if lv.bad), None)
    if bad is not None:
        return Finding("cgroup", SKIP, f"{where}: {bad}: its rdma limits not known")
    if not cg.levels:
        said = cg.why or "no rdma.max on its cgroup path"
        return Finding(
            "cgroup", PASS, f"{where}: {said}, nothing limits its RDMA handles or objects"
        )
    dev = local.device
    # (resource, its limit, the cgroup that sets it, how many are in use there)
    limits: list[tuple[str, int, str, int | None]] = []
    for lv in cg.levels:
        maxima = lv.limits.get(dev)  # the kernel lists every registered device
        used = lv.used.get(dev, (None, None))
        for i, name in enumerate(RDMA_RESOURCES):
            if maxima is not None and maxima[i] is not None:
                limits.append((name, maxima[i], lv.cgroup, used[i]))
    if not limits:
        return Finding("cgroup", PASS, f"{where}: no rdma limit on {dev} (rdma.max: max on "
                       "its path)")  # fmt: skip

    def fix(at: str) -> str:
        return (
            f"echo '{dev} hca_handle=max hca_object=max' > {cg.directory(at)}/rdma.max (or "
            "raise it where the job's manager sets it)"
        )

    def source(at: str) -> str:
        return "its rdma.max" if at == cg.path else f"the rdma.max of {at}"

    for name, limit, at, _ in limits:
        if limit < NEEDED[name]:
            return Finding(
                "cgroup", FAIL, f"{where}: {source(at)} gives {dev} {name}={limit}: "
                f"{_TOO_FEW[name]}", fix(at),
            )  # fmt: skip
    for name, limit, at, in_use in limits:
        if in_use is not None and limit - in_use < NEEDED[name]:
            there = "" if at == cg.path else f" in {at}"
            return Finding(
                "cgroup", WARN, f"{where}: {dev} {name} {in_use} of {limit} in use{there}, "
                f"its limit: {_AT_LIMIT[name]} (EAGAIN)", fix(at),
            )  # fmt: skip
    said = []
    for name in RDMA_RESOURCES:
        mine = [x for x in limits if x[0] == name]
        if mine:
            _, limit, at, in_use = min(mine, key=lambda x: x[1])
            extras = [] if at == cg.path else [f"set by {at}"]
            if in_use is not None:
                extras.append(f"{in_use} in use" + ("" if at == cg.path else " there"))
            said.append(f"{name}={limit}" + (f" ({', '.join(extras)})" if extras else ""))
    return Finding("cgroup", PASS, f"{where}: {dev} limited to {', '.join(said)}")


RDMA_RESOURCES = ("hca_handle", "hca_object")
NEEDED = {"hca_handle": PROBE_HANDLES, "hca_object": PROBE_OBJECTS}
_TOO_FEW = {
    "hca_handle": "it cannot open the device at all (ibv_open_device fails: EAGAIN)",
    "hca_object": f"fewer than one RC connection holds ({PROBE_OBJECTS}: a PD, a CQ, a QP and "
    "an MR), so creating them fails (EAGAIN)",
}
_AT_LIMIT = {
    "hca_handle": "its next open of the device fails",
    "hca_object": "its next RC connection fails",
}


# -- MTU -------------------------------------------------------------------------------------


def check_mtu(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    def said(f: Facts) -> str:
        netdev = f" (netdev {f.netdev} {f.netdev_mtu})" if f.netdev_mtu else ""
        if f.active_mtu:
            return f"active MTU {f.active_mtu}{netdev}"
        return f"active MTU not known{netdev}"

    if local.active_mtu is None and local.netdev_mtu is None:
        return Finding("mtu", SKIP, "MTU not known")
    if peer is None:
        return Finding("mtu", PASS, said(local))
    evidence = f"here: {said(local)}; peer: {said(peer)}"
    if local.active_mtu and peer.active_mtu and local.active_mtu != peer.active_mtu:
        small = local if local.active_mtu < peer.active_mtu else peer
        big = peer if small is local else local
        side = "here" if small is local else "on the peer"
        # A WARN, not a FAIL: ibtool, rdma_cm and perftest take the smaller of the two; an
        # application that sets the larger as its path MTU is what fails, and the probe at
        # the path MTU's full payload is what proves the path itself.
        return Finding(
            "mtu",
            WARN,
            f"{evidence}: connections take the smaller, {small.active_mtu}; a QP whose path MTU "
            f"is set to {big.active_mtu} loses every packet larger than {small.active_mtu} "
            "(retry exceeded)",
            f"set one MTU on both netdevs (ip link set dev {small.netdev} mtu "
            f"{big.netdev_mtu} {side}), or use path MTU {small.active_mtu}",
        )
    if local.netdev_mtu and peer.netdev_mtu and local.netdev_mtu != peer.netdev_mtu:
        return Finding(
            "mtu",
            WARN,
            f"{evidence}: the netdev MTUs differ",
            "set one MTU on both netdevs (ip link set dev NETDEV mtu N)",
        )
    return Finding("mtu", PASS, evidence)


# -- routing, ARP, filters -------------------------------------------------------------------


def check_arp(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    if not _ip(local):
        return Finding("arp", SKIP, "InfiniBand port: " + _IB_WHY["arp"])
    if local.rp_filter is None:
        return Finding("arp", SKIP, f"{local.netdev}'s IPv4 settings not known")
    settings = (f"rp_filter {local.rp_filter}, arp_ignore {local.arp_ignore}, "
                f"arp_announce {local.arp_announce}")  # fmt: skip
    if ctx.siblings is None:
        if local.rp_filter == 1:
            return Finding("arp", WARN, f"{settings}: strict rp_filter drops RoCE v2 on hosts "
                           "with several NICs in one subnet (this host's addresses not known)",
                           f"sysctl -w net.ipv4.conf.all.rp_filter=2 "
                           f"net.ipv4.conf.{local.netdev}.rp_filter=2")  # fmt: skip
        return Finding("arp", PASS, f"{settings} (this host's other addresses not known)")
    if not ctx.siblings:
        return Finding("arp", PASS, f"{local.netdev} alone in its subnet; {settings}")
    others = ", ".join(ctx.siblings)
    if local.rp_filter == 1:
        return Finding(
            "arp",
            FAIL,
            f"{local.netdev} shares its subnet with {others} and rp_filter is strict (1): "
            "RoCE v2 packets that arrive on the other NIC are dropped",
            f"sysctl -w net.ipv4.conf.all.rp_filter=2 net.ipv4.conf.{local.netdev}.rp_filter=2",
        )
    if local.arp_ignore == 0 or local.arp_announce == 0:
        return Finding(
            "arp",
            WARN,
            f"{local.netdev} shares its subnet with {others}; {settings}: every NIC answers ARP "
            "for every address (ARP flux), so the peer may send to the wrong NIC",
            f"sysctl -w net.ipv4.conf.{local.netdev}.arp_ignore=2 "
            f"net.ipv4.conf.{local.netdev}.arp_announce=2 (rdma-core Documentation/librdmacm.md)",
        )
    return Finding("arp", PASS, f"{local.netdev} shares its subnet with {others}; {settings}")


def check_route(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    if not _ip(local):
        return Finding("route", SKIP, "InfiniBand port: " + _IB_WHY["route"])
    route = ctx.route
    if ctx.peer is None:
        return Finding("route", SKIP, "no peer given")
    if route is None:
        return Finding("route", SKIP, "the kernel's route not known (not the running kernel)")
    target = route.destination
    if route.type == "local":
        return Finding(
            "route",
            FAIL,
            f"{target} is an address of this host: the kernel delivers to it through lo, so "
            "nothing crosses the network and the peer is this host itself",
            "give another host's address (ibtool loopback DEV/PORT tests this host's own ports)",
        )
    if route.type != "unicast" or not route.dev:
        return Finding("route", FAIL, f"no route to {target} ({route.type})",
                       f"ip route add {target} dev {local.netdev}")  # fmt: skip
    said = f"{target} via {route.dev}" + (f" gateway {route.gateway}" if route.gateway else "")
    said += f" from {route.src}" if route.src else ""
    gid = _used_gid(local)
    wanted = {local.netdev} | ({gid.netdev} if gid is not None and gid.netdev else set())
    if route.dev not in wanted:
        return Finding(
            "route",
            FAIL,
            f"{said}, not {' or '.join(sorted(n for n in wanted if n))} ({local.device}'s): "
            "RoCE v2 packets leave by another NIC than the GID's",
            f"ip route add {target}/32 dev {local.netdev}"
            + (f" src {gid.ip}" if gid is not None and gid.ip else ""),
        )
    if gid is not None and gid.ip and route.src and route.src != gid.ip:
        return Finding("route", WARN, f"{said}, not from the GID's address {gid.ip}",
                       f"ip route change {target} dev {route.dev} src {gid.ip}")  # fmt: skip
    return Finding("route", PASS, said)


def check_udp(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    skipped = _not_roce("udp4791", local)
    if skipped is not None:
        return skipped

    def one(f: Facts):
        if f.udp_filters is None:
            return SKIP, "netfilter rules not known", None
        if not f.udp_filters:
            return PASS, "no netfilter rule drops UDP 4791", None
        rule = f.udp_filters[0]
        more = f" (+{len(f.udp_filters) - 1} more)" if len(f.udp_filters) > 1 else ""
        if f.driver not in ("rxe", "rdma_rxe", None):
            return (
                PASS,
                f"'{rule}'{more} drops UDP 4791, but {f.driver} takes RoCE in the NIC "
                "before netfilter",
                None,
            )
        return (
            FAIL,
            f"'{rule}'{more} drops RoCE v2 (UDP 4791) on input",
            "delete the rule (nft -a list ruleset shows its handle; nft delete rule ... "
            "handle N) or accept udp dport 4791 before it",
        )

    return _finding("udp4791", _both(local, peer, one))


# -- QoS -------------------------------------------------------------------------------------


def check_qos(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    skipped = _not_roce("qos", local)
    if skipped is not None:
        return skipped

    def one(f: Facts):
        tos = ctx.tclass if ctx.tclass is not None else f.roce_tos or 0
        dscp = tos >> 2
        where = (
            "--tclass"
            if ctx.tclass is not None
            else ("default_roce_tos" if f.roce_tos is not None else "default")
        )
        said = f"ToS {tos} ({where}) is DSCP {dscp}"
        if f.dcb is None:
            return SKIP, f"{said}; DCB not known", None
        if not f.dcb:
            return SKIP, f"{said}; {f.netdev} has no DCB (lossless settings live elsewhere)", None
        trust = f.trust or ()
        mapping = dict(f.dscp_prio or ())
        if "dscp" in trust or (not trust and mapping):
            prio = mapping.get(dscp, 0)
            said += f" -> priority {prio} (trust {','.join(trust) or 'dscp'})"
        else:
            prio = 0
            said += f" -> priority 0 (trust {','.join(trust) or 'pcp'}: DSCP ignored)"
        pfc = sorted(f.pfc or ())
        if not pfc:
            return (
                WARN,
                f"{said}; PFC on no priority: RoCE runs lossy",
                (f"dcb pfc set dev {f.netdev} prio-pfc {prio}:on (and on the switch)"),
            )
        if prio not in pfc:
            lossless = pfc[0]
            dscps = sorted(d for d, p in mapping.items() if p == lossless)
            want = f"ToS {dscps[0] << 2} (DSCP {dscps[0]})" if dscps else f"priority {lossless}"
            return (
                FAIL,
                f"{said}, lossy: PFC is on priority {','.join(map(str, pfc))}",
                (
                    f"use {want}: --tclass, or echo {dscps[0] << 2 if dscps else 'TOS'} > "
                    f"/sys/kernel/config/rdma_cm/{f.device}/ports/{f.port}/default_roce_tos"
                ),
            )
        return PASS, f"{said}, lossless (PFC on)", None

    return _finding("qos", _both(local, peer, one))


# -- P_Key -----------------------------------------------------------------------------------


def check_pkey(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    def one(f: Facts):
        if not f.pkeys:
            return SKIP, "P_Key table not known", None
        first = f.pkeys[0]
        member = "full" if first & PKEY_FULL else "limited"
        return PASS, f"P_Key 0x{first:04x} ({member}) at index 0 of {len(f.pkeys)}", None

    verdict, evidence, fix = _both(local, peer, one)
    if peer is None or not local.pkeys or not peer.pkeys:
        return _finding("pkey", (verdict, evidence, fix))
    ours, theirs = local.pkeys[0], peer.pkeys[0]
    if ours & PKEY_BASE != theirs & PKEY_BASE:
        return Finding(
            "pkey",
            FAIL,
            f"{evidence}: different partitions at index 0",
            "use one partition on both ends (--pkey-index, or the SM's partitions)",
        )
    if not (ours | theirs) & PKEY_FULL:
        return Finding(
            "pkey",
            FAIL,
            f"{evidence}: two limited members never talk",
            "make one end a full member (0x8000 set) in the SM's partitions.conf",
        )
    return Finding("pkey", PASS, evidence)


# -- hardware --------------------------------------------------------------------------------

_GTS = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}


def _gen(speed: str | None) -> int | None:
    if not speed:
        return None
    return _GTS.get(speed.split()[0])


def check_pcie(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    def one(f: Facts):
        if not f.pci:
            return SKIP, f"{f.device} has no PCI device (software RDMA)", None
        head = f.pci[0]
        if head.speed is None or head.width is None:
            return SKIP, f"{head.bdf}: link speed or width not known", None
        down = []
        # Each function's current_link_* is the link below it or to its parent: a function
        # and its parent port show the same link. A link is judged once, at its lower end,
        # against the lower maximum of its two ends; the top of the walk (the root port)
        # shows the link to the function below it, judged already.
        for i, link in enumerate(f.pci[:-1] if len(f.pci) > 1 else f.pci):
            if i and (link.speed, link.width) == (f.pci[i - 1].speed, f.pci[i - 1].width):
                continue
            up = f.pci[i + 1] if i + 1 < len(f.pci) else None
            widths = [w for w in (link.max_width, up.max_width if up else None) if w]
            gens = [g for g in (_gen(link.max_speed), _gen(up.max_speed) if up else None) if g]
            slow = bool(gens and _gen(link.speed) and _gen(link.speed) < min(gens))
            narrow = bool(widths and link.width and link.width < min(widths))
            if slow or narrow:
                best = min((up, link) if up else (link,), key=lambda x: _gen(x.max_speed) or 99)
                down.append(f"{link.bdf} {link.speed} x{link.width} of "
                            f"{best.max_speed} x{min(widths) if widths else '?'}")  # fmt: skip
        said = f"{head.bdf} {head.speed} x{head.width}"
        if down:
            return (
                WARN,
                f"trained down: {'; '.join(down)}",
                "reseat the card or move it to a full slot; check the BIOS's link settings",
            )
        return PASS, f"{said} (its maximum)", None

    return _finding("pcie", _both(local, peer, one))


def _cpus(text: str | None) -> set[int] | None:
    if text is None:
        return None
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def check_numa(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    proc = ctx.process

    def one(f: Facts):
        if f.numa_node is None:
            return SKIP, f"{f.device} has no NUMA node", None
        near, allowed = _cpus(f.local_cpus), _cpus(f.allowed_cpus)
        said = f"{f.device} on NUMA node {f.numa_node}" + (
            f" (CPUs {f.local_cpus})" if f.local_cpus else ""
        )
        if proc is not None and f is local:
            return _process_numa(f, proc, said, near, allowed)
        if near is None or allowed is None:
            return PASS, said, None
        if not near & allowed:
            return (
                WARN,
                f"{said}; this process runs on CPUs {f.allowed_cpus}, all remote",
                f"numactl --cpunodebind={f.numa_node} --membind={f.numa_node} COMMAND",
            )
        if allowed <= near:
            return PASS, f"{said}; this process runs on local CPUs", None
        return PASS, f"{said}; pin jobs there (numactl -N {f.numa_node})", None

    return _finding("numa", _both(local, peer, one))


def _process_numa(f: Facts, proc: Process, said: str, near, allowed) -> tuple:
    """--pid's NUMA line: the process's CPUs (its Cpus_allowed_list: its affinity within its
    cpuset) against the adapter's node's."""
    who = proc.label
    if allowed is None:
        return SKIP, f"{said}; the CPUs of {who} not known", None
    if near is None:
        return PASS, f"{said}; {who} runs on CPUs {f.allowed_cpus}", None
    node = f.numa_node
    if not near & allowed:
        return (
            WARN,
            f"{said}; {who} runs on CPUs {f.allowed_cpus}, none of them on node {node}",
            f"start it on node {node} (numactl --cpunodebind={node} --membind={node} COMMAND; "
            f"a batch job: ask its scheduler for node {node}'s cores), or move it there: "
            f"taskset -apc {f.local_cpus} {proc.pid} (within its cpuset)",
        )
    if allowed <= near:
        return PASS, f"{said}; {who} runs on CPUs {f.allowed_cpus}, all on node {node}", None
    return (
        PASS,
        f"{said}; {who} runs on CPUs {f.allowed_cpus}, some on node {node}: pin it there "
        f"(numactl -N {node})",
        None,
    )


def check_peer(local: Facts, peer: Facts | None, ctx: Context) -> Finding:
    if ctx.peer is None:
        return Finding("peer", SKIP, "no peer given: this host's side only")
    if peer is None and ctx.compat:
        return Finding("peer", SKIP, f"{ctx.peer} runs a stock {ctx.compat}: this side only, "
                       "and the probe")  # fmt: skip
    if peer is None:
        return Finding("peer", WARN, f"{ctx.peer} told nothing: {ctx.no_facts}; this side only",
                       ctx.no_facts_fix or f"run `ibtool ping --server` on {ctx.peer}")  # fmt: skip
    who = peer.hostname or ctx.peer
    said = f"{who} {peer.device}/{peer.port}, kernel {peer.kernel}, ibtool {peer.ibtool}"
    return Finding("peer", PASS, said)


CHECKS = (check_peer, check_stack, check_port, check_rate, check_gid, check_roce_mode,
          check_memlock, check_mtu, check_arp, check_route, check_udp, check_qos, check_pkey,
          check_pcie, check_numa)  # fmt: skip


def worst(findings: Iterator[Finding]) -> Verdict:
    return Verdict.worst(f.verdict for f in findings)

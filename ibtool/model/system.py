"""The host around the RDMA devices, as `ibtool doctor` needs it: IPv4 sysctls, the RDMA CM's
RoCE defaults, the PCIe links, NUMA, the locked-memory limit, DCB, a route, netfilter rules.

Plain frozen records; None in a field always means "could not be told" (the reader warned),
except where a record says otherwise (MemLock: unlimited).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from ibtool.model.deferred import dataclass


def _max(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else max(a, b)


@dataclass(frozen=True)
class Ipv4Conf:
    """/proc/sys/net/ipv4/conf/{all,NETDEV}/ values (Documentation/networking/ip-sysctl.rst).

    The `effective_*` properties are what the kernel goes by: the larger of all/ and the
    netdev's for rp_filter, arp_ignore and arp_announce (IN_DEV_MAXCONF in
    include/linux/inetdevice.h), either of them for accept_local (IN_DEV_ORCONF); None when
    either value is unknown."""

    netdev: str
    rp_filter: int | None
    arp_ignore: int | None
    arp_announce: int | None
    accept_local: int | None
    all_rp_filter: int | None
    all_arp_ignore: int | None
    all_arp_announce: int | None
    all_accept_local: int | None = None

    @property
    def effective_rp_filter(self) -> int | None:
        """0 off, 1 strict (RFC 3704 reverse path), 2 loose."""
        return _max(self.all_rp_filter, self.rp_filter)

    @property
    def effective_arp_ignore(self) -> int | None:
        return _max(self.all_arp_ignore, self.arp_ignore)

    @property
    def effective_arp_announce(self) -> int | None:
        return _max(self.all_arp_announce, self.arp_announce)

    @property
    def effective_accept_local(self) -> bool | None:
        if self.all_accept_local is None or self.accept_local is None:
            return None
        return bool(self.all_accept_local or self.accept_local)


# What cma.c gives a port when nothing was written to configfs (cma_add_one): RoCE v2
# (CMA_PREFERRED_ROCE_GID_TYPE, IB_GID_TYPE_ROCE_UDP_ENCAP) where the port supports it, else
# the first GID type it supports; ToS 0 (default_roce_tos).
KERNEL_DEFAULT_ROCE_MODE = "RoCE v2"
KERNEL_DEFAULT_ROCE_TOS = 0
ROCE_MODES = ("IB/RoCE v1", "RoCE v2")  # ib_cache_gid_type_str, as configfs prints them


@dataclass(frozen=True)
class RoceDefaults:
    """What the RDMA CM uses for a RoCE port's connections: /sys/kernel/config/rdma_cm/DEV/
    ports/PORT/default_roce_mode and default_roce_tos (drivers/infiniband/core/cma_configfs.c).

    `configured`: the device's rdma_cm directory exists (someone ran mkdir in configfs; the
    kernel never makes it), so `mode` and `tos` were read; when False they are None and the
    kernel's defaults apply (the `effective_*` properties). `mounted`: configfs is mounted at
    /sys/kernel/config (None: cannot be told, e.g. a tree without /proc/self/mounts).
    `rdma_cm`: /sys/kernel/config/rdma_cm exists (the rdma_cm module is loaded, built with
    CONFIG_INFINIBAND_ADDR_TRANS_CONFIGFS)."""

    mode: str | None
    tos: int | None
    configured: bool
    mounted: bool | None = None
    rdma_cm: bool = False

    @property
    def effective_mode(self) -> str | None:
        """The mode read, or the kernel's default (RoCE v2 on a port that supports it) when
        nothing was configured; None when configured but unreadable."""
        return self.mode if self.configured else KERNEL_DEFAULT_ROCE_MODE

    @property
    def effective_tos(self) -> int | None:
        return self.tos if self.configured else KERNEL_DEFAULT_ROCE_TOS


@dataclass(frozen=True)
class PciLink:
    """One PCI function's link, as its sysfs attributes print it (Documentation/ABI/testing/
    sysfs-bus-pci): speed "8.0 GT/s PCIe" (4.x kernels print "8 GT/s"), width the
    lane count. None: no such attribute (not PCIe) or "Unknown"."""

    bdf: str  # domain:bus:device.function, e.g. 0000:03:00.0
    current_speed: str | None
    current_width: int | None
    max_speed: str | None
    max_width: int | None

    @property
    def current_gts(self) -> float | None:
        return gts(self.current_speed)

    @property
    def max_gts(self) -> float | None:
        return gts(self.max_speed)

    @property
    def degraded(self) -> bool:
        """Trained below what the function can do (speed or width); False when unknown."""
        cur, top = self.current_gts, self.max_gts
        slower = cur is not None and top is not None and cur < top
        narrower = (
            self.current_width is not None
            and self.max_width is not None
            and self.current_width < self.max_width
        )
        return slower or narrower


def gts(speed: str | None) -> float | None:
    """'16.0 GT/s PCIe' -> 16.0."""
    if not speed:
        return None
    try:
        return float(speed.split()[0])
    except ValueError:
        return None


@dataclass(frozen=True)
class Numa:
    """The NUMA node of an RDMA device's PCI function (None: none, as numa_node -1 says, or
    unknown) and the CPUs local to it (local_cpulist)."""

    node: int | None
    local_cpus: frozenset[int] | None


@dataclass(frozen=True)
class MemLock:
    """RLIMIT_MEMLOCK ("Max locked memory" of /proc/PID/limits), in bytes.

    `known` False: the limit could not be read (soft and hard are None then, meaning nothing);
    known with soft or hard None: that limit is unlimited (RLIM_INFINITY)."""

    soft: int | None
    hard: int | None
    known: bool = True

    @property
    def unlimited(self) -> bool:
        return self.known and self.soft is None


@dataclass(frozen=True)
class Dcb:
    """A netdev's DCB as the kernel reports it (DCB_CMD_IEEE_GET, include/uapi/linux/dcbnl.h).

    `pfc_enabled`: the priorities with PFC on (ieee_pfc.pfc_en); `pfc_cap`: how many traffic
    classes may have PFC. `dscp_prio`: (DSCP, priority) pairs of the APP table's DSCP
    entries (selector 5), sorted; empty when the port does not map DSCP. `trust`: the
    selectors the port trusts, in order, as `dcb apptrust` names them (Linux 6.1+); None when
    the kernel or driver does not report it. `apps`: every APP entry (selector, priority,
    protocol)."""

    netdev: str
    pfc_enabled: frozenset[int]
    dscp_prio: tuple[tuple[int, int], ...]
    trust: tuple[str, ...] | None
    pfc_cap: int | None = None
    apps: tuple[tuple[int, int, int], ...] = ()

    def priority_of_dscp(self, dscp: int) -> int | None:
        return dict(self.dscp_prio).get(dscp)


# The route types of include/uapi/linux/rtnetlink.h (enum rtn_type: RTN_UNICAST = 1, ...).
ROUTE_TYPES = (
    "unspec",
    "unicast",
    "local",
    "broadcast",
    "anycast",
    "multicast",
    "blackhole",
    "unreachable",
    "prohibit",
    "throw",
    "nat",
    "xresolve",
)


@dataclass(frozen=True)
class Route:
    """What the kernel answers RTM_GETROUTE for a destination (`ip route get`): the netdev
    and source address it would use, the gateway (None: on-link), the route type
    ('unicast', 'local', 'unreachable', 'prohibit', 'blackhole', ...). A destination
    without a route is type 'unreachable' with dev None; `error` is then the kernel's errno
    name (ENETUNREACH, ...)."""

    destination: str
    dev: str | None
    src: str | None
    gateway: str | None
    type: str
    error: str | None = None


@dataclass(frozen=True)
class FilterRule:
    """A netfilter rule (or a chain's drop policy) on the input path that drops or rejects
    UDP to the port asked about, as `nft list ruleset` or `iptables-save` has it.

    `tool`: 'nft', 'iptables' or 'ip6tables'; `table`: 'inet filter' (nft: family and name)
    or 'filter'; `handle`: the nft rule handle; `line`: the line of iptables-save's output;
    None for a chain policy. `text`: the rule in the tool's own syntax; `verdict`: 'drop' or
    'reject'."""

    tool: str
    table: str
    chain: str
    handle: int | None
    line: int | None
    text: str
    verdict: str


def same_subnet(netdev: str, addresses: Iterable[tuple[str, str, int]]) -> tuple[str, ...]:
    """The other netdevs with an address in a subnet of one of `netdev`'s addresses, of the
    host's (netdev, address, prefix length) IPv4 addresses (Host.interface_addresses): what
    only the whole host shows, several NICs in one subnet, where strict reverse path
    filtering and ARP flux break RoCE v2 (Documentation/networking/ip-sysctl.rst, rp_filter
    and arp_ignore; rdma-core Documentation/librdmacm.md)."""
    addresses = list(addresses)
    nets = [ipaddress.ip_interface(f"{a}/{p}").network for n, a, p in addresses if n == netdev]
    others = {
        n
        for n, a, _ in addresses
        if n != netdev and any(ipaddress.ip_address(a) in net for net in nets)
    }
    return tuple(sorted(others))


def cpu_list(cpus) -> str | None:
    """A set of CPU numbers as the kernel writes lists (0-3,8)."""
    if cpus is None:
        return None
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


# -- a process, as doctor --pid judges it (read by ibtool.sources.process) -------------------

RDMA_RESOURCES = ("hca_handle", "hca_object")  # kernel/cgroup/rdma.c rdmacg_resource_names


@dataclass(frozen=True)
class RdmaLevel:
    """One cgroup on the process's path whose rdma controller counts: its limits and usage per
    device, as (hca_handle, hca_object); None in a limit is "max" (no limit)."""

    cgroup: str  # the path, as /proc/PID/cgroup writes it
    limits: dict  # device -> (handles, objects)
    used: dict  # device -> (handles, objects), from rdma.current (empty when unreadable)
    bad: str | None = None  # why this level's rdma.max could not be used


@dataclass(frozen=True)
class Cgroup:
    """The cgroup whose rdma controller counts the process's RDMA objects."""

    version: int  # 1 or 2
    path: str
    mount: str  # the directory its hierarchy was read from, as the running host has it
    levels: tuple[RdmaLevel, ...] | None  # nearest first; () none limits it; None: not known
    why: str | None = None  # why levels is None, or what else the reader saw

    def directory(self, path: str) -> str:
        return self.mount.rstrip("/") + (path if path != "/" else "")


@dataclass(frozen=True)
class Process:
    pid: int
    name: str | None
    memlock: MemLock
    ipc_lock: bool | None
    cpus: frozenset[int] | None
    cgroup: Cgroup | None
    cgroup_why: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"PID {self.pid}" + (f" ({self.name})" if self.name else "")

    def to_json(self) -> dict:
        cg = self.cgroup
        rdma = None
        if cg is not None and cg.levels is not None:
            rdma = [
                {
                    "cgroup": lv.cgroup,
                    "max": {d: _pair(v) for d, v in sorted(lv.limits.items())},
                    "current": {d: _pair(v) for d, v in sorted(lv.used.items())},
                }
                for lv in cg.levels
            ]
        return {
            "pid": self.pid,
            "name": self.name,
            "memlock_soft": _bytes(self.memlock, self.memlock.soft),
            "memlock_hard": _bytes(self.memlock, self.memlock.hard),
            "ipc_lock": self.ipc_lock,
            "cpus": cpu_list(self.cpus),
            "cgroup": None if cg is None else cg.path,
            "cgroup_version": None if cg is None else cg.version,
            "rdma": rdma,
            "notes": list(self.notes),
        }


def _bytes(lock: MemLock, value: int | None) -> int | None:
    if not lock.known:
        return None
    return -1 if value is None else value


def _pair(value: tuple) -> dict:
    return {name: ("max" if v is None else v) for name, v in zip(RDMA_RESOURCES, value)}

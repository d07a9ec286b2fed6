"""What /proc says of the host's networking and of a process, under a root, plus a netdev's MTU
(/sys/class/net): the settings a RoCE connection depends on beside the RDMA device's.

- /proc/sys/net/ipv4/conf/{all,NETDEV}/{rp_filter,arp_ignore,arp_announce,accept_local}: "%d\\n"
  (proc_dointvec; Documentation/networking/ip-sysctl.rst).
- /proc/PID/limits: fs/proc/base.c proc_pid_limits: a header "Limit  Soft Limit  Hard Limit
  Units" then per limit "%-25s %-20s %-20s %-10s" with "unlimited" for RLIM_INFINITY.
- /proc/PID/status: Cpus_allowed_list "%*pbl" (fs/proc/array.c task_cpus_allowed).
- /sys/class/net/NETDEV/mtu: "%u\\n" (net/core/net-sysfs.c).
"""

from __future__ import annotations

import os

from ibtool.model.system import Ipv4Conf, MemLock
from ibtool.sources.sysfs.pci import parse_cpulist
from ibtool.sources.sysfs.rooted import RootedFiles
from ibtool.sources.sysfs.values import quoted, valid_netdev_name

IPV4_CONF = ("rp_filter", "arp_ignore", "arp_announce", "accept_local")
LIMITS_HEADER = ("Limit", "Soft Limit", "Hard Limit", "Units")
MEMLOCK = "Max locked memory"
# ip-sysctl.rst: rp_filter 0-2, arp_ignore 0-8, arp_announce 0-2, accept_local 0/1; a value
# outside is written by hand, but the kernel keeps any int: bound it only to an int.
_INT_MAX = (1 << 31) - 1
_MTU_MAX = (1 << 32) - 1


def _parse_int(text: str) -> int:
    if not text.isascii() or not text.lstrip("-").isdigit() or text.count("-") > 1:
        raise ValueError(text)
    value = int(text)
    if not -_INT_MAX - 1 <= value <= _INT_MAX:
        raise ValueError(text)
    return value


def _parse_mtu(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) > _MTU_MAX:
        raise ValueError(text)
    return int(text)


def _limit(text: str) -> int | None:
    if text == "unlimited":
        return None
    if not text.isascii() or not text.isdigit():
        raise ValueError(text)
    return int(text)


def parse_memlock(text: str) -> MemLock:
    """The "Max locked memory" line of a limits file; ValueError if there is none or it is
    malformed."""
    lines = text.splitlines()
    if not lines or lines[0].split() != ["Limit", "Soft", "Limit", "Hard", "Limit", "Units"]:
        raise ValueError("no header")
    for line in lines[1:]:
        if line.startswith(MEMLOCK):
            words = line[len(MEMLOCK) :].split()
            if len(words) != 3 or words[2] != "bytes":
                raise ValueError(line)
            return MemLock(_limit(words[0]), _limit(words[1]))
    raise ValueError(f"no {MEMLOCK!r} line")


def parse_cpus_allowed(text: str) -> frozenset[int]:
    """Cpus_allowed_list of a /proc/PID/status."""
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name == "Cpus_allowed_list":
            return parse_cpulist(value.strip())
    raise ValueError("no Cpus_allowed_list line")


class ProcFiles:
    """/proc (and a netdev's MTU) under a root, through `files`."""

    def __init__(self, files: RootedFiles) -> None:
        self.files = files

    def ipv4_conf(self, netdev: str) -> Ipv4Conf:
        """The IPv4 sysctls of `netdev` and of all/; a netdev without a conf directory (no such
        netdev, or IPv4 off on it) gives None for its values and one warning."""
        base = self.files.path("proc/sys/net/ipv4/conf")
        values: dict[str, int | None] = {}
        captured = self.files.isdir(base)
        if not captured and self.files.inside(base) is not None:
            self.files.bad(base, "missing")  # a tree without /proc/sys: one warning
        for scope in ("all", netdev):
            d = os.path.join(base, scope)
            if not captured:
                d = None
            elif scope != "all" and not valid_netdev_name(netdev):
                self.files.bad(d, f"not a netdev name: {quoted(netdev)}")
                d = None
            elif not self.files.isdir(d):
                if self.files.inside(d) is not None:
                    self.files.bad(d, "missing")
                d = None
            for name in IPV4_CONF:
                key = f"all_{name}" if scope == "all" else name
                values[key] = (
                    None if d is None else self.files.parsed(os.path.join(d, name), _parse_int)
                )
        return Ipv4Conf(netdev=netdev, **values)

    def memlock(self, pid: int | None = None) -> MemLock:
        """RLIMIT_MEMLOCK of process `pid` (default: the reading process, /proc/self);
        MemLock(known=False) after a warning when the file is missing or malformed."""
        path = self.files.path("proc", "self" if pid is None else str(pid), "limits")
        found = self.files.parsed(path, parse_memlock)
        return found if found is not None else MemLock(None, None, known=False)

    def cpus_allowed(self, pid: int | None = None) -> frozenset[int] | None:
        """Cpus_allowed_list of /proc/PID/status (default: self) under the root."""
        path = self.files.path("proc", "self" if pid is None else str(pid), "status")
        return self.files.parsed(path, parse_cpus_allowed)

    def netdev_mtu(self, netdev: str) -> int | None:
        if not valid_netdev_name(netdev):
            return None
        return self.files.parsed(self.files.path("sys/class/net", netdev, "mtu"), _parse_mtu)


def live_cpus_allowed(pid: int | None, warn) -> frozenset[int] | None:
    """The running kernel's affinity of `pid` (default: this process), sched_getaffinity(2)."""
    try:
        return frozenset(os.sched_getaffinity(0 if pid is None else pid))
    except (OSError, AttributeError) as e:  # no such pid; a platform without the call
        warn(f"CPU affinity of {'this process' if pid is None else f'pid {pid}'}: {e}")
        return None

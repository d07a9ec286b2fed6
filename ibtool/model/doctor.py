"""`ibtool doctor`: what one end of an RDMA path knows of itself (Facts), and the checklist
verdicts (Finding) that compare two ends.

Facts travel between hosts: a peer's `ibtool ping --server` answers a doctor query with its
own, as JSON. What comes from a peer is untrusted, so `Facts.from_wire` takes nothing on faith:
the payload is bounded, every field is type- and range-checked, every text is made printable
and cut, lists are capped, and a field that fails is dropped (None) rather than trusted; a
payload that is not a JSON object of this version fails as a whole (ValueError).
"""

from __future__ import annotations

import enum
import ipaddress
import json
import re
from dataclasses import asdict, field, fields
from typing import Any

from ibtool.model.deferred import dataclass
from ibtool.model.names import printable

FACTS_VERSION = 1
MAX_FACTS = 16384  # bytes of JSON a peer may send (a port's facts are ~2 KB)
MAX_ITEMS = 64  # GIDs, P_Keys, PCI links, filter rules kept of a peer's lists
MAX_TEXT = 120  # characters of a peer's text kept


class Verdict(str, enum.Enum):
    """A checklist line's verdict; the exit code is Nagios' for the worst. A SKIP (not
    known) is below a PASS: a run that passed what it could know passed."""

    PASS = "PASS"
    SKIP = "SKIP"
    WARN = "WARN"
    FAIL = "FAIL"

    @property
    def exit_code(self) -> int:
        return {"PASS": 0, "SKIP": 0, "WARN": 1, "FAIL": 2}[self.value]

    @classmethod
    def worst(cls, verdicts) -> Verdict:
        order = [cls.SKIP, cls.PASS, cls.WARN, cls.FAIL]
        return max(verdicts, key=order.index, default=cls.SKIP)


@dataclass(frozen=True)
class Finding:
    """One checklist line: `check` (a short id: gid, mtu, memlock...), its verdict, the
    evidence that decided it (what was read, on which side), and the fix (the command or
    setting to change; None when there is nothing to do). `detail`: lines the text shows
    below the evidence (an InfiniBand route's hops), whose data the JSON gives elsewhere."""

    check: str
    verdict: Verdict
    evidence: str
    fix: str | None = None
    detail: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "check": self.check,
            "status": self.verdict.value,
            "evidence": self.evidence,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class GidFact:
    index: int
    gid: str  # 8 groups of 4 hex digits, as sysfs prints it
    type: str | None  # "IB", "RoCE v1", "RoCE v2"
    netdev: str | None
    vlan: int | None = None
    ip: str | None = None


@dataclass(frozen=True)
class PciFact:
    bdf: str
    speed: str | None
    width: int | None
    max_speed: str | None
    max_width: int | None


@dataclass(frozen=True)
class Facts:
    """One end of the path: the port it would use and what decides whether RDMA reaches it.

    None everywhere means "not known" (not readable, not applicable, or a peer's value that
    failed validation); the checks say SKIP for what they cannot know."""

    hostname: str | None = None
    kernel: str | None = None
    ibtool: str | None = None
    device: str | None = None
    port: int | None = None
    driver: str | None = None
    fw: str | None = None  # the device's fw_ver
    protocol: str | None = None  # "ib", "roce", "iw", "opa" (RDMA_NLDEV_ATTR_DEV_PROTOCOL)
    link_layer: str | None = None  # "InfiniBand" or "Ethernet"
    state: str | None = None  # "ACTIVE", ...
    physical_state: str | None = None
    rate: str | None = None
    lid: int | None = None
    active_mtu: int | None = None  # bytes
    netdev: str | None = None
    netdev_mtu: int | None = None
    gid_index: int | None = None  # the GID the data path uses (gids --best)
    gids: tuple[GidFact, ...] = ()
    pkeys: tuple[int, ...] = ()  # the port's P_Key table, empty slots left out
    roce_mode: str | None = None  # rdma_cm default_roce_mode, None: not configured
    roce_tos: int | None = None  # rdma_cm default_roce_tos, None: not configured
    dcb: bool | None = None  # whether the netdev has DCB at all (None: not known)
    pfc: tuple[int, ...] | None = None  # priorities with PFC on
    dscp_prio: tuple[tuple[int, int], ...] | None = None  # DSCP -> priority (dcb app)
    trust: tuple[str, ...] | None = None  # dcb apptrust order
    rp_filter: int | None = None  # effective for the netdev: max(all, netdev)
    arp_ignore: int | None = None
    arp_announce: int | None = None
    memlock_soft: int | None = None  # bytes; -1: unlimited
    memlock_hard: int | None = None
    ipc_lock: bool | None = None  # CAP_IPC_LOCK: the memlock limit does not bind
    modules: tuple[str, ...] | None = None  # RDMA modules loaded, of those doctor looks for
    uverbs: str | None = None  # uverbsN of the device
    uverbs_node: bool | None = None  # /dev/infiniband/uverbsN exists
    rdma_cm_node: bool | None = None  # /dev/infiniband/rdma_cm exists
    provider: bool | None = None  # a libibverbs provider file names the driver
    pci: tuple[PciFact, ...] = ()
    numa_node: int | None = None
    local_cpus: str | None = None  # cpu list
    allowed_cpus: str | None = None
    udp_filters: tuple[str, ...] | None = None  # rules dropping RoCE v2 (UDP 4791) on input
    notes: tuple[str, ...] = field(default=(), compare=False)  # what could not be read

    def to_json(self) -> dict:
        data = asdict(self)
        data["version"] = FACTS_VERSION
        return data

    def to_wire(self) -> bytes:
        data = json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True).encode()
        if len(data) > MAX_FACTS:  # never: a port's facts are far smaller
            raise ValueError(f"facts of {len(data)} bytes exceed {MAX_FACTS}")
        return data

    @classmethod
    def from_wire(cls, data: bytes) -> Facts:
        """A peer's facts, validated field by field; ValueError when it is not facts at all."""
        if len(data) > MAX_FACTS:
            raise ValueError(f"facts of {len(data)} bytes exceed {MAX_FACTS}")
        try:
            raw = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ValueError(f"facts are not JSON ({type(e).__name__})") from None
        if not isinstance(raw, dict):
            raise ValueError("facts are not a JSON object")
        if raw.get("version") != FACTS_VERSION:
            raise ValueError(f"facts version {_text(raw.get('version'))}, want {FACTS_VERSION}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            check = _FIELDS.get(f.name, _text)
            value = check(raw.get(f.name))
            if value is not None:
                values[f.name] = value
        return cls(**values)


def is_infiniband(local: Facts) -> bool | None:
    """True for an InfiniBand port, False for any other, None where sysfs did not say (a
    simulator's stand-in tree: libibumad is asked)."""
    if local.link_layer is None:
        return None
    return local.link_layer == "InfiniBand"


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _text(value) -> str | None:
    return printable(value, MAX_TEXT) if isinstance(value, str) else None


def _int(lo: int, hi: int):
    def check(value) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            return None
        return value

    return check


def _bool(value) -> bool | None:
    return value if isinstance(value, bool) else None


def _list(item, limit: int = MAX_ITEMS):
    def check(value):
        if not isinstance(value, list):
            return None
        kept = (item(v) for v in value[:limit])
        return tuple(v for v in kept if v is not None)

    return check


def _pair(value):
    if isinstance(value, list) and len(value) == 2:
        dscp, prio = _int(0, 63)(value[0]), _int(0, 7)(value[1])
        if dscp is not None and prio is not None:
            return (dscp, prio)
    return None


def _gid(value) -> GidFact | None:
    if not isinstance(value, dict):
        return None
    index, gid = _int(0, 1 << 16)(value.get("index")), value.get("gid")
    if index is None or not isinstance(gid, str):
        return None
    try:
        raw = ipaddress.IPv6Address(gid).packed
        # eight groups of four hex digits, as sysfs prints a GID: `exploded` writes an
        # IPv4-mapped address with a dotted tail from Python 3.13 on
        text = ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))
    except ValueError:
        return None
    ip = value.get("ip")
    try:
        ip = str(ipaddress.ip_address(ip)) if isinstance(ip, str) else None
    except ValueError:
        ip = None
    gtype = value.get("type")
    return GidFact(
        index,
        text,
        gtype if gtype in ("IB", "RoCE v1", "RoCE v2") else None,
        _name(value.get("netdev")),
        _int(0, 4095)(value.get("vlan")),
        ip,
    )


def _pci(value) -> PciFact | None:
    if not isinstance(value, dict) or not isinstance(value.get("bdf"), str):
        return None
    return PciFact(
        printable(value["bdf"], 32),
        _text(value.get("speed")),
        _int(0, 32)(value.get("width")),
        _text(value.get("max_speed")),
        _int(0, 32)(value.get("max_width")),
    )


_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _name(value) -> str | None:
    """A device, netdev, driver or module name as real ones are spelled: letters, digits, '_',
    '.', '-'. The kernel allows more in a netdev name (dev_valid_name refuses only '/', ':'
    and white space), but a peer's name lands in the fix lines an operator may paste into a
    shell: a ';' or '$(' from a peer never does."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        return None
    return value


def _cpus(value) -> str | None:
    if not isinstance(value, str) or len(value) > 4096:
        return None
    return value if all(c in "0123456789,-" for c in value) else None


_MEMLOCK = _int(-1, 1 << 62)
_FIELDS = {
    "port": _int(1, 255),
    "device": _name,
    "driver": _name,
    "protocol": lambda v: v if v in ("ib", "roce", "iw", "opa", "usnic") else None,
    "netdev": _name,
    "lid": _int(0, 0xFFFF),
    "active_mtu": _int(256, 1 << 16),
    "netdev_mtu": _int(68, 1 << 20),
    "gid_index": _int(0, 1 << 16),
    "gids": _list(_gid),
    "pkeys": _list(_int(0, 0xFFFF)),
    "roce_tos": _int(0, 255),
    "dcb": _bool,
    "pfc": _list(_int(0, 7), 8),
    "dscp_prio": _list(_pair),
    "trust": _list(_text, 8),
    "rp_filter": _int(0, 2),
    "arp_ignore": _int(0, 8),
    "arp_announce": _int(0, 2),
    "memlock_soft": _MEMLOCK,
    "memlock_hard": _MEMLOCK,
    "ipc_lock": _bool,
    "modules": _list(_name, 16),
    "uverbs": _name,
    "uverbs_node": _bool,
    "rdma_cm_node": _bool,
    "provider": _bool,
    "pci": _list(_pci, 8),
    "numa_node": _int(0, 4095),
    "local_cpus": _cpus,
    "allowed_cpus": _cpus,
    "udp_filters": _list(_text, 16),
    "notes": _list(_text, 16),
}

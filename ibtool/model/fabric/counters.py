"""The ports' PMA counters and their error counters against infiniband-diags' thresholds:
`ibtool fabric errors`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import field

from ibtool.model.deferred import dataclass
from ibtool.model.fabric.records import FabricNode
from ibtool.model.health import Status

# The error counters ibqueryerrors checks (infiniband-diags' ibqueryerrors.c: PortCounters'
# SymbolErrorCounter to VL15Dropped, then PortXmitWait), by the names its error_thresholds
# file uses. PortXmitWait counts congestion, not errors: checked only where a threshold names
# it (ibqueryerrors checks it against 0 unless told `-s PortXmitWait`).
ERROR_COUNTERS = (
    "SymbolErrorCounter",
    "LinkErrorRecoveryCounter",
    "LinkDownedCounter",
    "PortRcvErrors",
    "PortRcvRemotePhysicalErrors",
    "PortRcvSwitchRelayErrors",
    "PortXmitDiscards",
    "PortXmitConstraintErrors",
    "PortRcvConstraintErrors",
    "LocalLinkIntegrityErrors",
    "ExcessiveBufferOverrunErrors",
    "VL15Dropped",
    "PortXmitWait",
)
CONGESTION = "PortXmitWait"
# The same counters under the names the kernel gives them in sysfs (drivers/infiniband/core/
# sysfs.c, ports/N/counters/), which health.toml's thresholds use for the local ports.
SYSFS_NAMES = {
    "SymbolErrorCounter": "symbol_error",
    "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped",
    "PortXmitWait": "port_xmit_wait",
    "PortXmitData": "port_xmit_data",
    "PortRcvData": "port_rcv_data",
    "PortXmitPkts": "port_xmit_packets",
    "PortRcvPkts": "port_rcv_packets",
}
# What each counts, for the fix (IBTA vol. 1, 16.1.3.5)
ERROR_FIXES = {
    "SymbolErrorCounter": "bit errors on the wire: reseat or replace the cable (or its "
    "transceivers), cleaning the connectors",
    "LinkErrorRecoveryCounter": "the link retrained: reseat or replace the cable",
    "LinkDownedCounter": "the link went down: a cable pulled or failing, a node rebooted",
    "PortRcvErrors": "bad packets received (CRC, length): the cable or the far end's port",
    "PortRcvRemotePhysicalErrors": "packets marked bad upstream: look at the links before this "
    "one on the path",
    "PortRcvSwitchRelayErrors": "packets this switch could not forward (a route to a missing "
    "LID): the SM's routing",
    "PortXmitDiscards": "packets dropped on the way out: congestion or a link down on the "
    "path (timeouts at the head of a queue)",
    "PortXmitConstraintErrors": "packets not sent for a partition or rate constraint: the "
    "SM's partitions",
    "PortRcvConstraintErrors": "packets refused for a partition or rate constraint: the "
    "SM's partitions",
    "LocalLinkIntegrityErrors": "the link's error rate crossed its local threshold: the cable",
    "ExcessiveBufferOverrunErrors": "receive buffers overrun: flow control on this link",
    "VL15Dropped": "subnet management packets dropped: an SM sweeping too hard, or a busy "
    "switch CPU",
    "PortXmitWait": "time the port had data and no credits to send it: congestion",
}
THRESHOLDS_FILE = "/etc/infiniband-diags/error_thresholds"  # ibqueryerrors' own
THRESHOLDS_MAX = 64 << 10


def parse_thresholds(text: str, where: str) -> dict[str, int]:
    """infiniband-diags' error_thresholds format: `Name=value` a line (value as C's strtoul
    reads it in base 0: decimal, 0x hex, 0 octal), '#' comments. ValueError naming the line
    for a name it does not check or a value that is not a number."""
    found: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, value = (part.strip() for part in line.partition("="))
        if not sep or name not in ERROR_COUNTERS:
            known = ", ".join(ERROR_COUNTERS)
            raise ValueError(f"{where}:{number}: {name!r} is not an error counter ({known})")
        try:
            found[name] = _strtoul(value)
        except ValueError:
            raise ValueError(f"{where}:{number}: {value!r} is not a number") from None
    return found


def _strtoul(text: str) -> int:
    t = text.lower()
    if t.startswith("0x"):
        v = int(t[2:], 16)
    elif len(t) > 1 and t.startswith("0"):
        v = int(t[1:], 8)
    else:
        v = int(t, 10)
    if v < 0 or v >= 1 << 64:
        raise ValueError(text)
    return v


@dataclass(frozen=True)
class PortCounters:
    """One port's PMA counters as it answered: by name, each with the width in bits it
    saturates at (64 for PortCountersExtended's)."""

    node: int  # node GUID
    port: int
    lid: int
    values: dict[str, int]
    bits: dict[str, int]

    def saturated(self, name: str) -> bool:
        return _saturated(self.values.get(name), self.bits.get(name, 64))


def _saturated(value: int | None, bits: int) -> bool:
    """A PMA counter at all ones: it counts no more until cleared (IBTA 16.1.3.5)."""
    return value == (1 << bits) - 1


def over(
    values: dict[str, int], bits: dict[str, int], thresholds: dict[str, int]
) -> Iterator[tuple[str, int, int, bool]]:
    """(counter, value, threshold, saturated) of each error counter above its threshold or
    saturated, as ibqueryerrors lists them (value > threshold; 0 where the file names none;
    PortXmitWait only where it is named)."""
    for name in ERROR_COUNTERS:
        if name == CONGESTION and name not in thresholds:
            continue
        value = values.get(name)
        if value is None:
            continue
        limit = thresholds.get(name, 0)
        saturated = _saturated(value, bits.get(name, 64))
        if value > limit or saturated:
            yield name, value, limit, saturated


@dataclass(frozen=True)
class CountersRead:
    """What a read of a fabric's port counters gave: the ports read, what did not answer
    (named), and the switches left to the sum of their ports (node, how many ports) because
    the sum held nothing to look at."""

    counters: list[PortCounters]
    unanswered: list[str]
    summed: list[tuple[FabricNode, int]] = field(default_factory=list)


@dataclass(frozen=True)
class CounterFinding:
    """A port's error counter over its threshold (or saturated), with its growth since the
    last run where one is known (None: no baseline, or the counter was cleared since)."""

    counters: PortCounters
    name: str
    value: int
    threshold: int
    delta: int | None
    status: Status
    saturated: bool = False


def judge_counters(
    ports: list[PortCounters],
    thresholds: dict[str, int],
    before: dict[tuple[int, int], dict[str, int]] | None,
) -> list[CounterFinding]:
    """Each error counter above its threshold or saturated (`over`). With the counters of
    the last run (`before`), one that has not grown since is listed, OK: it is old news until
    cleared (perfquery -R); one that grew, or has no baseline (a new port, a cleared counter),
    is a WARNING, as is a counter saturated at its maximum, which counts no more."""
    found = []
    for pc in ports:
        old = before.get((pc.node, pc.port)) if before is not None else None
        for name, value, limit, saturated in over(pc.values, pc.bits, thresholds):
            delta = None
            if old is not None and isinstance(old.get(name), int) and old[name] <= value:
                delta = value - old[name]
            status = Status.OK if delta == 0 and not saturated else Status.WARNING
            found.append(CounterFinding(pc, name, value, limit, delta, status, saturated))
    return found


def clean_sum(thresholds: dict[str, int]) -> Callable[[PortCounters], bool]:
    """Whether a switch's sum of its ports' counters holds nothing `judge_counters` would list:
    every error counter of the sum at or under its threshold means every port's is (a counter
    saturated in the sum is not clean)."""

    def clean(total) -> bool:
        return not any(over(total.values, total.bits, thresholds))

    return clean

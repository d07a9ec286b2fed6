"""What a self-test operation returns (OpResult, its Status) and how it fails (Mismatch,
OpUnsupported); the operations' names."""

from __future__ import annotations

import enum
import statistics
from dataclasses import field

from ibtool.errors import IbtoolError
from ibtool.model.deferred import dataclass

OPS = (
    "send",
    "write",
    "write_imm",
    "read",
    "fetch_add",
    "cmp_swap",
    "ud_send",
    "ud_qkey",
    "mcast",
    "apm",
)
BANDWIDTH_OPS = ("send", "write", "read")
ATOMIC_OPS = ("fetch_add", "cmp_swap")


class Status(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    TIMEOUT = "TIMEOUT"
    UNSUPPORTED = "UNSUPPORTED"


@dataclass
class OpResult:
    op: str
    status: Status
    size: int
    iters: int = 0
    latencies_us: list[float] = field(default_factory=list, repr=False)
    bandwidth_mbps: float | None = None  # MB/s (10^6 bytes), pipelined
    error: str | None = None
    detail: str | None = None  # what the operation proved, in words (ud_qkey, mcast, apm)
    facts: dict = field(default_factory=dict)  # the same as -j keys of its own

    def percentile(self, p: float) -> float | None:
        if not self.latencies_us:
            return None
        ordered = sorted(self.latencies_us)
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]

    @property
    def summary(self) -> dict:
        lat = self.latencies_us
        return {
            "min": min(lat) if lat else None,
            "p50": self.percentile(50),
            "p99": self.percentile(99),
            "max": max(lat) if lat else None,
            "mean": statistics.fmean(lat) if lat else None,
        }


class Mismatch(IbtoolError):
    """The data that arrived is not what was sent (or a message arrived that must not)."""


class OpUnsupported(IbtoolError):
    """The device, port or library cannot run this operation: UNSUPPORTED, the reason said."""


def drop_wait(timeout: float) -> float:
    """How long a message that must not arrive is waited for: 1/100 of an iteration's
    timeout, at least 5 ms (a UD delivery takes well under 1 ms on hardware, ~2 ms on rxe
    under emulation)."""
    return min(timeout, max(0.005, timeout / 100))

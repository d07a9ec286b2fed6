"""The HCA's own clock, for `ibtool ping --hw-timestamps`: round trips without the software.

A device that stamps its completions (mlx5: ConnectX-4 and later) says so in
ibv_query_device_ex(3): `completion_timestamp_mask`, the width of its free-running counter, and
`hca_core_clock`, its frequency in kHz. ibv_query_rt_values_ex(3) with IBV_VALUES_MASK_RAW_CLOCK
reads the same counter now. So a ping's hardware round trip is the counter read just before the
post, up to the timestamp of the reply's receive completion: the doorbell, the wire, the peer
and the wire back, but not this side's polling, which a Python loop makes slow. (A device in
real-time clock mode stamps completions in nanoseconds of wall time instead; pyverbs cannot
tell which, so this reads the free-running counter, the default of every mlx5 firmware.)
"""

from __future__ import annotations

from ibtool.errors import UnsupportedError
from ibtool.sources.verbs import too_old

HINT = "completion timestamps are an mlx5 (ConnectX-4 and later) feature: leave --hw-timestamps out"


class HwClock:
    def __init__(self, ladder):
        pv, ctx, name = ladder.pv, ladder.ctx, ladder.device
        if not pv.cqex:
            raise too_old("extended CQ (pyverbs.cq.CQEX), which carries completion timestamps")
        if not hasattr(ctx, "query_rt_values_ex"):
            raise too_old("Context.query_rt_values_ex, which reads the HCA clock", 36)
        try:
            attr = ctx.query_device_ex()
        except pv.Error as e:
            raise UnsupportedError(f"{name}: query_device_ex: {e}", HINT) from None
        self.mask, self.khz = attr.completion_timestamp_mask, attr.hca_core_clock
        if not self.mask or not self.khz:
            raise UnsupportedError(
                f"{name} does not timestamp its completions (completion_timestamp_mask "
                f"{self.mask:#x}, hca_core_clock {self.khz} kHz)",
                HINT,
            )
        self._read = ctx.query_rt_values_ex

    def now(self) -> int:
        """The counter, in ticks (mlx5 gives them as the nanoseconds of a zero second)."""
        seconds, nanoseconds = self._read()
        return seconds * 1_000_000_000 + nanoseconds

    def us(self, ticks: int) -> float:
        """Microseconds of a difference of two readings; the counter wraps at its mask."""
        return (ticks & self.mask) * 1000.0 / self.khz

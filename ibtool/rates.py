"""Per-second rates from two counter samples: a view, never written back into the samples.

PMA counters saturate at all ones instead of wrapping (IBTA PortCounters), so a PMA counter
that went down was cleared (`perfquery -R`, a driver reload, a re-created device): a reset,
never a wrap. mlx5 Q counters are 32-bit and wrap, but a device re-created between the samples
also makes them go down: a drop is taken for a wrap only when the counter would have moved less
than half its range to make it. Each case is reported, not guessed.
"""

from __future__ import annotations

from ibtool import counterinfo
from ibtool.counterinfo import WRAPS_AT_32
from ibtool.model import CounterSample

_WRAP = 1 << 32


def counter_rate(
    old: CounterSample, new: CounterSample, seconds: float
) -> tuple[float | None, str | None]:
    """(units per second, note): note is None, "wrapped", "saturated", "reset" or "unknown"."""
    if old.value is None or new.value is None or seconds <= 0:
        return None, "unknown"
    delta = new.value - old.value
    note = None
    if delta < 0:
        if new.source != "hw" or new.name not in WRAPS_AT_32 or old.value >= _WRAP:
            return None, "reset"
        delta += _WRAP
        if delta >= _WRAP // 2:
            return None, "reset"  # from 1000 to 5 is a reset, not 4294962000 more events
        note = "wrapped"
    elif is_saturated(new):
        return None, "saturated"
    # Python ints: a 64-bit word count times 4 stays exact until the division.
    return delta * new.scale / seconds, note


def is_saturated(sample: CounterSample) -> bool:
    """A PMA counter at the maximum of its own width (4, 8, 16, 32 or 64 bits)."""
    return sample.source == "pma" and counterinfo.is_saturated(sample.value, sample.width)

"""Per-second rates from two counter samples: a view, never written back into the samples.

PMA counters saturate at all-ones instead of wrapping; mlx5 Q counters are 32-bit and wrap;
any counter can be reset (driver reload, `perfquery -R`). Each case is reported, not guessed.
"""

from __future__ import annotations

from ibtool.counterinfo import WRAPS_AT_32
from ibtool.model import CounterSample


def counter_rate(
    old: CounterSample, new: CounterSample, seconds: float
) -> tuple[float | None, str | None]:
    """(units per second, note): note is None, "wrapped", "saturated", "reset" or "unknown"."""
    if old.value is None or new.value is None or seconds <= 0:
        return None, "unknown"
    if new.width is not None and new.source == "pma" and new.value >= (1 << new.width) - 1:
        return None, "saturated"
    delta = new.value - old.value
    note = None
    if delta < 0:
        if new.source == "hw" and new.name in WRAPS_AT_32 and old.value < 1 << 32:
            delta += 1 << 32
            note = "wrapped"
        else:
            return None, "reset"
    return delta * new.scale / seconds, note


def is_saturated(sample: CounterSample) -> bool:
    return (
        sample.value is not None
        and sample.width is not None
        and sample.source == "pma"
        and sample.value >= (1 << sample.width) - 1
    )

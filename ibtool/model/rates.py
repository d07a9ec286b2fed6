"""Per-second rates from two counter samples: a view, never written back into the samples.

PMA counters saturate at all ones instead of wrapping (IBTA PortCounters), so a PMA counter
that went down was cleared (`perfquery -R`, a driver reload, a re-created device): a reset,
never a wrap. mlx5 Q counters are 32-bit and wrap, but a device re-created between the samples
also makes them go down: a drop is taken for a wrap only when the counter would have moved less
than half its range to make it. Each case is reported, not guessed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from ibtool.model import counters as counterinfo
from ibtool.model.counters import WRAPS_AT_32
from ibtool.model.records import CounterSample

_WRAP = 1 << 32


def counter_delta(old: CounterSample, new: CounterSample) -> tuple[int | None, str | None]:
    """(how much the counter moved, in its unit, note): note is None, "wrapped",
    "saturated", "reset" or "unknown"; the delta is None unless it is known."""
    if old.value is None or new.value is None:
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
    return delta * new.scale, note


def counter_rate(
    old: CounterSample, new: CounterSample, seconds: float
) -> tuple[float | None, str | None]:
    """(units per second, note): note is None, "wrapped", "saturated", "reset" or "unknown"."""
    if seconds <= 0:
        return None, "unknown"
    delta, note = counter_delta(old, new)
    # Python ints: a 64-bit word count times 4 stays exact until the division.
    return (None if delta is None else delta / seconds), note


def is_saturated(sample: CounterSample) -> bool:
    """A PMA counter at the maximum of its own width (4, 8, 16, 32 or 64 bits)."""
    return sample.source == "pma" and counterinfo.is_saturated(sample.value, sample.width)


class Rated(NamedTuple):
    """A sample with its rate since the one before: rate None with note "new" for a counter
    the previous sample did not have, both None for the first sample."""

    sample: CounterSample
    rate: float | None
    note: str | None


def paired(before: Iterable[CounterSample], after: Iterable[CounterSample]):
    """Each sample of `after` with the same counter's sample in `before` (None if new)."""
    old = {(s.device, s.port, s.source, s.name): s for s in before}
    return [(old.get((s.device, s.port, s.source, s.name)), s) for s in after]


def rates(
    before: Iterable[CounterSample],
    after: Iterable[CounterSample],
    seconds: float,
    deltas: list[int | None] | None = None,
):
    """Each sample of `after` with its rate since `before`; `deltas`, when given, gets how
    much each moved (None where not known), in the same order."""
    rows = []
    for prev, s in paired(before, after):
        if prev is None:
            rate, note, delta = None, "new", None
        elif seconds <= 0:
            rate, note, delta = None, "unknown", None
        else:
            delta, note = counter_delta(prev, s)
            # Python ints: a 64-bit word count times 4 stays exact until the division.
            rate = None if delta is None else delta / seconds
        rows.append(Rated(s, rate, note))
        if deltas is not None:
            deltas.append(delta)
    return rows


class Sampler:
    """Successive counter samples turned into rates, each against the one before.

    `read()` gives the samples; `clock()` the monotonic time, taken after each read. The
    first `sample()` is the baseline (no rates); each later one has them."""

    def __init__(
        self,
        read: Callable[[], list[CounterSample]],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.read = read
        self.clock = clock
        self.last: list[CounterSample] | None = None
        self.at: float | None = None
        self.deltas: list[int | None] = []  # of the last sample(), row for row

    def sample(self) -> list[Rated]:
        samples = self.read()
        now = self.clock()
        if self.last is None:
            rows = [Rated(s, None, None) for s in samples]
            self.deltas = [None] * len(rows)
        else:
            self.deltas = []
            rows = rates(self.last, samples, now - self.at, self.deltas)
        self.last, self.at = samples, now
        return rows

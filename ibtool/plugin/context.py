"""What the plugin API's registered functions are: a health check (HealthCheck) and what it is
given (CheckContext), a metric collector, a dashboard panel factory."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any

from ibtool.model.deferred import dataclass
from ibtool.model.health import HealthResult
from ibtool.views.prometheus import MetricFamily

if TYPE_CHECKING:
    from ibtool.host import Host


@dataclass
class CheckContext:
    """What one health check is given: the host, the configuration, and what it kept last time.

    `previous` is what the check passed to `keep` at its last run (JSON: dicts, lists, str,
    numbers, bool, None), or None on the first run or without a state file; `boot_id` and
    `time` say when that was (the kernel's boot id and the Unix time of that run), so a check
    can tell a baseline taken before a reboot; `stateful` is false when nothing is kept
    (``--no-state``, a capture). `options` is the check's own table of the
    configuration file (``[checks.NAME]``), `config` the whole parsed configuration
    (ibtool.health.config.HealthConfig). `datapath` is true when the user asked for the tests
    that move data (``--datapath``), and `deadline` is the time.monotonic() by which they
    should be done.
    """

    host: Host
    config: Any
    options: Mapping[str, Any] = field(default_factory=dict)
    previous: Any = None
    boot_id: str | None = None  # of the run `previous` was kept at
    time: float | None = None
    now: float = 0.0  # this run's Unix time
    this_boot: str | None = None  # this run's boot id
    stateful: bool = False  # whether what the check keeps is saved for its next run
    datapath: bool = False
    deadline: float | None = None
    kept: Any = None

    @property
    def same_boot(self) -> bool:
        """Whether `previous` was kept since the host last booted (counters still count).

        A boot id that could not be read is unknown, not changed: a --root tree or a snapshot
        (every capture ibtool ships, and a sosreport that left out
        /proc/sys/kernel/random/boot_id) has none, nor has a state kept by a run that could
        not read one. Taking "unknown" for "rebooted" made every run a new baseline, so a
        counter moving 0 -> 500 or a LID the subnet manager moved was never flagged. A reboot
        is what the boot id proves; a check tells a reset counter (lower than kept) or a
        re-created device (a new sysfs inode) on its own."""
        if self.previous is None:
            return False
        if self.boot_id is None or self.this_boot is None:
            return True
        return self.boot_id == self.this_boot

    @property
    def interval(self) -> float | None:
        """Seconds since `previous` was kept, or None."""
        return None if self.time is None or self.previous is None else self.now - self.time

    def keep(self, value: Any) -> None:
        """What the next run gets as `previous` (JSON-serializable)."""
        self.kept = value


HealthCheck = Callable[[CheckContext], Iterable[HealthResult]]

MetricCollector = Callable[["Host"], Iterable[MetricFamily]]
# A panel factory gets the dashboard's ibtool.live.feed.Feed and returns a textual.widget.Widget;
# Any keeps textual (and the dashboard's engine, a layer above) out of this module.
PanelFactory = Callable[[Any], Any]

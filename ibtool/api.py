"""The types of the plugin API (see ibtool.plugin.hookspecs): health results and metric families.

Plain dataclasses and enums, cheap to import: a plugin module imports this at its top. Every
constructor validates its input and raises ValueError on a bad name, unit or value; that is a
bug in the plugin, never something the user typed.

The formats follow their upstream definitions, not any one client library:

* health results and perfdata: the Nagios Plugin Development Guidelines (monitoring-plugins.org,
  "Plugin Return Codes" and "Performance data");
* metric families: the Prometheus data model and text exposition format 0.0.4, written exactly
  as prometheus_client's ``generate_latest`` writes them (ibtool does not depend on it).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Union

if TYPE_CHECKING:
    from ibtool.host import Host
    from ibtool.live.feed import Feed


# -- health -----------------------------------------------------------------------------------


class Status(enum.IntEnum):
    """A health check's verdict; the values are the Nagios plugin exit codes."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3

    @classmethod
    def worst(cls, statuses: Iterable[Status]) -> Status:
        """The most severe of `statuses`; OK when there are none (nothing reported is wrong).

        Severity is not the numeric order: CRITICAL > WARNING > UNKNOWN > OK, the order of
        monitoring-plugins' ``max_state_alt()``. An UNKNOWN (a check that could not decide)
        must not hide behind OK, as it does in their ``max_state()``; but a definite WARNING or
        CRITICAL says more about the host than a check that could not run, so it wins.
        """
        return max(statuses, key=_SEVERITY.__getitem__, default=cls.OK)


_SEVERITY = {Status.OK: 0, Status.UNKNOWN: 1, Status.WARNING: 2, Status.CRITICAL: 3}

# Units of measurement of the Nagios guidelines: none (a count), s ms us, %, B KB MB TB, and c
# (a continuous counter).
UNITS = ("", "s", "ms", "us", "%", "B", "KB", "MB", "TB", "c")
_NUMBER = r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
# A Nagios threshold range, [@]start:end: start and ':' may go when start is 0, end when it is
# infinity, '~' is minus infinity, '@' alerts inside the range instead of outside.
_RANGE = re.compile(rf"@?(?:(?:~|{_NUMBER})?:)?(?:{_NUMBER})?")

Threshold = Union[int, float, str, None]


@dataclass(frozen=True)
class Range:
    """A Nagios threshold range (monitoring-plugins' "Threshold and Ranges"): `text` as given,
    [@]start:end. A value outside start..end (ends included) alerts, or inside it with '@'.
    '10' is 0:10 (alert below 0 or above 10), '10:' is 10 up to infinity, '~:10' minus
    infinity to 10, '@10:20' alerts from 10 to 20."""

    text: str
    start: float
    end: float
    inside: bool = False

    @classmethod
    def parse(cls, value: int | float | str) -> Range:
        """A range from its text, or from a number N (0:N); ValueError saying what is wrong."""
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"a threshold is a number or a range string, not {value!r}")
        text = value if isinstance(value, str) else _number(value, "threshold")
        if not _RANGE.fullmatch(text) or not any(c.isdigit() for c in text):
            raise ValueError(f"{text!r} is not a Nagios range ([@]start:end, e.g. 10, 10:, @5:10)")
        body = text[1:] if text.startswith("@") else text
        low, sep, high = body.rpartition(":") if ":" in body else ("0", "", body)
        start = -math.inf if low == "~" else float(low or 0)
        end = float(high) if high else math.inf
        if start > end:
            raise ValueError(f"{text!r}: the start of a range must not be above its end")
        return cls(text, start, end, text.startswith("@"))

    def alerts(self, value: float) -> bool:
        within = self.start <= value <= self.end
        return within if self.inside else not within


def _one_line(text: object) -> bool:
    return isinstance(text, str) and text.splitlines() == [text]


def _number(value: object, what: str) -> str:
    """A finite int or float in the guidelines' character class [-0-9.]: no exponent, an
    integral float without '.0' (1e-05 -> 0.00001, 2.0 -> 2)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be an int or float, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, not {value}")
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    text = repr(value)
    if "e" in text:
        from decimal import Decimal

        text = format(Decimal(text), "f")
    return text


def _threshold(value: Threshold, what: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        if not value or not _RANGE.fullmatch(value):
            raise ValueError(f"{what} {value!r} is not a Nagios range ([@]start:end)")
        return value
    return _number(value, what)


@dataclass(frozen=True)
class Perfdata:
    """One performance data item of a health result.

    `warn` and `crit` are a number or a Nagios range string ('10', '10:', '~:10', '@5:10');
    `min` and `max` numbers. All share `unit`, one of UNITS.
    """

    label: str
    value: float
    unit: str = ""
    warn: Threshold = None
    crit: Threshold = None
    min: float | None = None
    max: float | None = None

    def __post_init__(self) -> None:
        if not _one_line(self.label):
            raise ValueError(f"perfdata label must be one non-empty line, not {self.label!r}")
        if self.unit not in UNITS:
            units = ", ".join(UNITS[1:])
            raise ValueError(f"perfdata {self.label}: unit {self.unit!r} is not '' nor {units}")
        self.text()  # every field checked now, not when the result is printed

    def text(self) -> str:
        """``'label'=value[UOM];[warn];[crit];[min];[max]``, trailing empty fields dropped.

        The label is quoted when it holds a space, '=' or a single quote, which is doubled.
        """
        label = self.label
        if any(c in label for c in " ='"):
            label = "'" + label.replace("'", "''") + "'"
        what = f"perfdata {self.label}"
        fields = [
            _threshold(self.warn, f"{what}: warn"),
            _threshold(self.crit, f"{what}: crit"),
            "" if self.min is None else _number(self.min, f"{what}: min"),
            "" if self.max is None else _number(self.max, f"{what}: max"),
        ]
        value = _number(self.value, f"{what}: value") + self.unit
        return ";".join([f"{label}={value}", *fields]).rstrip(";")


@dataclass(frozen=True)
class HealthResult:
    """One finding of a health check about one subject.

    `subject` names what was checked (``mlx5_0``, ``mlx5_0/1``) or is '' for the host as a
    whole; `summary` is one line for a person. `check` is the name the check was registered
    under: the core fills it in, a check leaves it empty.
    """

    status: Status
    subject: str
    summary: str
    perfdata: tuple[Perfdata, ...] = ()
    check: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.status, Status):
            raise ValueError(f"status must be an ibtool.api.Status, not {self.status!r}")
        if not isinstance(self.subject, str) or (self.subject and not _one_line(self.subject)):
            raise ValueError(f"subject must be '' or one line, not {self.subject!r}")
        if not _one_line(self.summary):
            raise ValueError(f"summary must be one non-empty line, not {self.summary!r}")
        object.__setattr__(self, "perfdata", tuple(self.perfdata))
        bad = [p for p in self.perfdata if not isinstance(p, Perfdata)]
        if bad:
            raise ValueError(f"perfdata must be ibtool.api.Perfdata items, not {bad[0]!r}")


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


# -- metrics ----------------------------------------------------------------------------------

METRIC_TYPES = ("counter", "gauge")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class Sample(NamedTuple):
    labels: Mapping[str, str]
    value: float


@dataclass
class MetricFamily:
    """A Prometheus metric family: one name, its help text and type, and its samples.

    As in prometheus_client's CounterMetricFamily and GaugeMetricFamily: a `unit` (``bytes``,
    ``seconds``) is appended to the name unless the name already ends in it, and a counter's
    name is kept without ``_total``, which is stripped if given: the exposition writes the
    family as ``NAME_total`` (OpenMetrics names the family without the suffix, the 0.0.4 text
    format names it after its samples).
    """

    name: str
    documentation: str
    type: str
    unit: str = ""
    samples: list[Sample] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.type not in METRIC_TYPES:
            raise ValueError(f"metric {self.name}: type {self.type!r} is not one of {METRIC_TYPES}")
        if self.unit and not _LABEL_NAME.fullmatch(self.unit):
            raise ValueError(f"metric {self.name}: bad unit {self.unit!r}")
        if not isinstance(self.documentation, str):
            raise ValueError(f"metric {self.name}: documentation must be a str")
        if self.type == "counter" and self.name.endswith("_total"):
            self.name = self.name[: -len("_total")]
        if self.unit and not self.name.endswith("_" + self.unit):
            self.name += "_" + self.unit
        if not _METRIC_NAME.fullmatch(self.name):
            raise ValueError(f"bad metric name {self.name!r}")
        self._series: set[frozenset[tuple[str, str]]] = set()

    @property
    def exposed_name(self) -> str:
        """The name in the text format: with ``_total`` for a counter."""
        return self.name + "_total" if self.type == "counter" else self.name

    def add(self, labels: Mapping[str, str], value: float) -> None:
        """Add the sample of one series, e.g. ``add({"device": "mlx5_0", "port": "1"}, 42)``."""
        for name, label_value in labels.items():
            if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name):
                raise ValueError(f"metric {self.name}: bad label name {name!r}")
            if name.startswith("__"):
                raise ValueError(f"metric {self.name}: label {name} is reserved (__ prefix)")
            if not isinstance(label_value, str):
                raise ValueError(
                    f"metric {self.name}: label {name} must be a str, not {label_value!r}"
                )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"metric {self.name}: value must be an int or float, not {value!r}")
        series = frozenset(labels.items())
        if series in self._series:
            raise ValueError(f"metric {self.name}: series {dict(labels)} added twice")
        self._series.add(series)
        self.samples.append(Sample(dict(labels), value))


MetricCollector = Callable[["Host"], Iterable[MetricFamily]]

# A panel factory gets the dashboard's ibtool.live.feed.Feed and returns a textual.widget.Widget;
# Any keeps textual out of this module.
PanelFactory = Callable[["Feed"], Any]


def _go_float(value: float) -> str:
    """A sample value as prometheus_client's floatToGoString writes it: +Inf, -Inf, NaN, Python
    repr otherwise, with a Go-style exponent from a million up (1234567.0 -> 1.234567e+06)."""
    value = float(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def exposition(families: Iterable[MetricFamily]) -> str:
    """The Prometheus text format 0.0.4 of `families`: HELP and TYPE lines, then one line per
    sample with its labels in name order. Byte for byte what prometheus_client's
    ``generate_latest`` writes for the same families."""
    lines = []
    for family in families:
        name = family.exposed_name
        help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines += [f"# HELP {name} {help_text}\n", f"# TYPE {name} {family.type}\n"]
        for labels, value in family.samples:
            pairs = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(labels.items()))
            lines.append(f"{name}{{{pairs}}} " if pairs else f"{name} ")
            lines.append(f"{_go_float(value)}\n")
    return "".join(lines)

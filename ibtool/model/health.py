"""Health findings: a check's Status, its Perfdata and thresholds, and the HealthResult it gives.

Plain frozen dataclasses and enums. Every constructor validates its input and raises ValueError
on a bad value; that is a bug in the check, never something the user typed. The formats are the
Nagios Plugin Development Guidelines' (monitoring-plugins.org, "Plugin Return Codes" and
"Performance data").
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable
from typing import Union

from ibtool.model.deferred import dataclass
from ibtool.model.names import escaped


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
_KIND = re.compile(r"(?:[a-z][a-z0-9]*(?:_[a-z0-9]+)*)?")


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
        if isinstance(self.label, str):
            object.__setattr__(self, "label", escaped(self.label))
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
    under: the core fills it in, a check leaves it empty. `kind` says what was found for a
    program (snake_case, e.g. ``link_degraded``): what a face acts on, so that rewording a
    summary never changes what the dashboard or a consumer does. '' when the check gives none.
    """

    status: Status
    subject: str
    summary: str
    perfdata: tuple[Perfdata, ...] = ()
    check: str = ""
    kind: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.status, Status):
            raise ValueError(f"status must be an ibtool.api.Status, not {self.status!r}")
        # A subject or summary carries names the kernel, a capture or a peer gave (a device
        # may be renamed to anything but '/'): escaped here, once for every face, so that none
        # can forge a Nagios line or drive a terminal.
        for name in ("subject", "summary"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, escaped(value))
        if not isinstance(self.subject, str) or (self.subject and not _one_line(self.subject)):
            raise ValueError(f"subject must be '' or one line, not {self.subject!r}")
        if not _one_line(self.summary):
            raise ValueError(f"summary must be one non-empty line, not {self.summary!r}")
        if not isinstance(self.kind, str) or not _KIND.fullmatch(self.kind):
            raise ValueError(f"kind must be '' or snake_case, not {self.kind!r}")
        object.__setattr__(self, "perfdata", tuple(self.perfdata))
        bad = [p for p in self.perfdata if not isinstance(p, Perfdata)]
        if bad:
            raise ValueError(f"perfdata must be ibtool.api.Perfdata items, not {bad[0]!r}")


def counter_growth(
    name: str, delta: int, limits, since: str, *, downed: bool = False
) -> tuple[Status, str, str] | None:
    """(status, summary, kind) of an error counter that grew by `delta` `since` (a phrase:
    "since the last run"), against `limits` (its warning and critical Ranges, either None);
    None when that is fine. A link-downed counter (`downed`) that grew is a flap, a WARNING,
    below its thresholds too."""
    text = f"{name} +{delta} {since}"
    if limits.critical is not None and limits.critical.alerts(delta):
        return Status.CRITICAL, f"{text} (critical {limits.critical.text})", "counter_errors"
    if limits.warning is not None and limits.warning.alerts(delta):
        return Status.WARNING, f"{text} (warning {limits.warning.text})", "counter_errors"
    if downed and delta > 0:
        times = "once" if delta == 1 else f"{delta} times"
        return Status.WARNING, f"link went down {times} {since} (flap)", "link_flapped"
    return None

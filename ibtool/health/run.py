"""One health run: the checks given their contexts and state, and its report in the formats
the engines read: a Nagios plugin's output (monitoring-plugins' Development Guidelines), JSON,
and Prometheus metric families.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import field
from typing import Any

from ibtool.errors import UsageError
from ibtool.health.config import HealthConfig
from ibtool.health.state import Saved
from ibtool.model.deferred import dataclass
from ibtool.model.health import HealthResult, Status
from ibtool.plugin.context import CheckContext, HealthCheck
from ibtool.plugin.hooks import run_health_checks
from ibtool.views.prometheus import MetricFamily

# Worst first, then in check order: what a person reading the long output looks at first.
_ORDER = {Status.CRITICAL: 0, Status.WARNING: 1, Status.UNKNOWN: 2, Status.OK: 3}
SHOWN_IN_SUMMARY = 3  # problems named on the first line; the rest are counted
# The first line is what a monitoring engine's overview, a notification and an SMS show: on a
# host of 501 devices it grew to 15 KB. Its text is cut to SUMMARY_MAX characters, and the
# perfdata stay on it only while the whole line is at most FIRST_LINE_MAX; otherwise they go
# to the end of the long output, where the Nagios plugin API (Nagios 3 "Plugin Output Spec":
# "LONG TEXT LINE N | PERFDATA LINE 2", then one perfdata line each) puts the rest of them.
SUMMARY_MAX = 200
FIRST_LINE_MAX = 300
# Above this many results the long output lists the non-OK ones and counts the OK ones;
# --verbose lists every result. A node of a few HCAs stays whole (8 HCAs of 2 ports: 33).
LISTED_MAX = 50


# The kind of a finding that a capture (a --root tree, a snapshot) cannot know: the modules
# loaded and the uverbs char devices, which a snapshot does not record. The captured host is
# not unhealthy for it, and an operator reading a capture wants its verdict on what it holds:
# on a capture such a finding is OK, "not checked", and does not make every capture UNKNOWN.
# On the running host a check can always know, and its UNKNOWN stands.
NOT_CAPTURED = "not_captured"


@dataclass
class Report:
    results: list[HealthResult]
    status: Status
    time: float
    notes: list[str] = field(default_factory=list)  # what the run itself did (state, Slurm)
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)  # the next run's state
    faults: list[str] = field(default_factory=list)  # what the run itself failed to do

    @property
    def summary(self) -> str:
        return summary(self.results, self.faults)

    def fault(self, text: str) -> None:
        """Something the run failed to do (write the textfile, drain the node): UNKNOWN."""
        self.faults.append(text)
        self.status = Status.worst([self.status, Status.UNKNOWN])


def run(
    checks: Mapping[str, HealthCheck],
    host,
    config,
    saved: Saved | None,
    *,
    boot_id: str | None,
    datapath: bool = False,
    now: Callable[[], float] = time.time,
) -> Report:
    """Runs `checks` on `host`, each with what it kept in `saved` (None: no state file), and
    returns their results with the state for the next run. On a capture, a finding of kind
    NOT_CAPTURED is OK, not checked."""
    started = now()
    deadline = time.monotonic() + config.datapath_budget
    contexts: dict[str, CheckContext] = {}

    def context(name: str) -> CheckContext:
        previous, kept_boot, kept_time = saved.of(name) if saved is not None else (None,) * 3
        contexts[name] = CheckContext(
            host,
            config,
            options=config.checks.get(name, {}),
            previous=previous,
            boot_id=kept_boot,
            time=kept_time,
            now=started,
            this_boot=boot_id,
            stateful=saved is not None,
            datapath=datapath,
            deadline=deadline,
        )
        return contexts[name]

    results = run_health_checks(checks, context)
    if not getattr(host, "live", True):
        results = [_not_checked(r) for r in results]
    kept = dict(saved.checks) if saved is not None else {}
    for name, ctx in contexts.items():
        if ctx.kept is not None:
            kept[name] = {"data": ctx.kept, "boot_id": boot_id, "time": started}
    status = Status.worst(r.status for r in results) if results else Status.UNKNOWN
    return Report(results, status, started, kept=kept)


def _not_checked(result: HealthResult) -> HealthResult:
    if result.kind != NOT_CAPTURED or result.status != Status.UNKNOWN:
        return result
    return dataclasses.replace(result, status=Status.OK, summary=f"{result.summary}, not checked")


def failed(reason: str, when: float) -> Report:
    """The report of a run that failed before its checks (a bad configuration, a held lock):
    UNKNOWN, with the reason as its one fault."""
    return Report([], Status.UNKNOWN, when, faults=[reason])


def ordered(results: list[HealthResult]) -> list[HealthResult]:
    return sorted(results, key=lambda r: _ORDER[r.status])


def _named(r: HealthResult) -> str:
    return f"{r.subject}: {r.summary}" if r.subject else r.summary


# The Nagios plugin API reserves '|': the first one in the output starts the performance data
# (monitoring-plugins' Development Guidelines, "Plugin Output"), so a '|' in a device name or
# a plugin's summary would make the rest of the line perfdata. It is shown as a broken bar.
def _text(text: str) -> str:
    return text.replace("|", "\u00a6")


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[: max(room - 3, 0)] + "..."


def _counts(statuses: Iterable[Status]) -> str:
    """How many of each status, worst first: '2 CRITICAL, 498 WARNING'."""
    counts: dict[Status, int] = {}
    for status in statuses:
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{counts[s]} {s.name}" for s in sorted(counts, key=_ORDER.__getitem__))


def summary(results: list[HealthResult], faults: Sequence[str] = ()) -> str:
    """The first line's text, at most SUMMARY_MAX characters: what the run failed to do, then
    the problems, worst first (three at most, fewer where they do not fit), then how many more
    of each status; when all is well, how many results of each check. A run that failed
    before its checks says why, whole: that one line is all it has to say."""
    if faults and not results:
        return "; ".join(faults)
    problems = [r for r in ordered(results) if r.status != Status.OK]
    items = [(fault, Status.UNKNOWN) for fault in faults]
    items += [(_named(r), r.status) for r in problems]
    if not problems:
        counts: dict[str, int] = {}
        for r in results:
            counts[r.check] = counts.get(r.check, 0) + 1
        text = "all OK: " + ", ".join(f"{check} {n}" for check, n in counts.items())
        items.append((text if results else "no health check ran", Status.OK))
    more = ""
    for shown in range(min(len(faults) + SHOWN_IN_SUMMARY, len(items)), 0, -1):
        left = [status for _, status in items[shown:]]
        more = f"; and {len(left)} more ({_counts(left)})" if left else ""
        text = "; ".join(t for t, _ in items[:shown]) + more
        if len(text) <= SUMMARY_MAX:
            return text
    return _cut(items[0][0], SUMMARY_MAX - len(more)) + more


def _label(label: str) -> str:
    """A perfdata label every parser reads whole: the guidelines allow any character in a label
    but '=' and the single quote, and a '|' would end the perfdata; each becomes '_'."""
    return label.translate(str.maketrans("='|", "___"))


def _perfdata(results: list[HealthResult], warn: Callable[[str], None]) -> list[str]:
    seen, items = set(), []
    for r in results:
        for p in r.perfdata:
            label = _label(p.label)
            if label in seen:
                warn(f"health check {r.check}: perfdata label {label!r} twice; kept the first")
                continue
            seen.add(label)
            items.append(dataclasses.replace(p, label=label).text())
    return items


def nagios(
    report: Report, warn: Callable[[str], None] = lambda m: None, *, verbose: bool = False
) -> str:
    """`IBTOOL STATUS - summary | perfdata`, then one line per result, worst first, then the
    run's own notes. The first line is bounded (SUMMARY_MAX, FIRST_LINE_MAX); above LISTED_MAX
    results, unless `verbose`, the OK ones are counted, not listed."""
    first = f"IBTOOL {report.status.name} - {_text(report.summary)}"
    perfdata = _perfdata(report.results, warn)
    inline = bool(perfdata) and len(first) + 3 + len(" ".join(perfdata)) <= FIRST_LINE_MAX
    if inline:
        first += " | " + " ".join(perfdata)
    lines = [first, *(f"[UNKNOWN] {_text(fault)}" for fault in report.faults)]
    listed = ordered(report.results)
    if not verbose and len(listed) > LISTED_MAX:
        ok = len([r for r in listed if r.status == Status.OK])
        listed = [r for r in listed if r.status != Status.OK]
        counts = _counts(r.status for r in report.results)
        lines.append(f"results: {counts}; the {ok} OK are listed with --verbose")
    for r in listed:
        lines.append(f"[{r.status.name}] {r.check} {_text(_named(r))}")
    lines += [_text(note) for note in report.notes]
    if perfdata and not inline:
        lines[-1] += " | " + perfdata[0]
        lines += perfdata[1:]
    return "\n".join(lines) + "\n"


def unknown(message: str) -> str:
    """A run that could not check anything: the Nagios first line alone."""
    return f"IBTOOL UNKNOWN - {_text(' '.join(message.split()))}\n"


def _perf_json(p) -> dict[str, Any]:
    return {
        "label": p.label,
        "value": p.value,
        "unit": p.unit,
        "warn": p.warn,
        "crit": p.crit,
        "min": p.min,
        "max": p.max,
    }


def as_json(report: Report) -> dict[str, Any]:
    return {
        "status": report.status.name,
        "exit_code": int(report.status),
        "summary": report.summary,
        "time": round(report.time, 3),
        "results": [
            {
                "check": r.check,
                "status": r.status.name,
                "subject": r.subject,
                "summary": r.summary,
                "perfdata": [_perf_json(p) for p in r.perfdata],
            }
            for r in report.results
        ],
        "notes": report.notes,
        "faults": report.faults,
    }


def status_families(report: Report) -> list[MetricFamily]:
    """The run as metrics: its status (the Nagios code), each check's worst status, each
    result's status by subject, and when it ran."""
    overall = MetricFamily(
        "ibtool_health_status",
        "Health of this node: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN",
        "gauge",
    )
    overall.add({}, int(report.status))
    checks = MetricFamily(
        "ibtool_health_check_status", "Worst status of each health check (Nagios codes)", "gauge"
    )
    subjects = MetricFamily(
        "ibtool_health_subject_status",
        "Worst status of each health check per subject (device, port; '' for the host)",
        "gauge",
    )
    worst_of: dict[str, list[Status]] = {}
    by_subject: dict[tuple[str, str], list[Status]] = {}
    for r in report.results:
        worst_of.setdefault(r.check, []).append(r.status)
        by_subject.setdefault((r.check, r.subject), []).append(r.status)
    for check, statuses in worst_of.items():
        checks.add({"check": check}, int(Status.worst(statuses)))
    for (check, subject), statuses in by_subject.items():
        subjects.add({"check": check, "subject": subject}, int(Status.worst(statuses)))
    when = MetricFamily(
        "ibtool_health_last_run_timestamp", "When the health check ran", "gauge", "seconds"
    )
    when.add({}, round(report.time, 3))
    families = [overall, checks, subjects, when]
    if report.faults:
        faults = MetricFamily(
            "ibtool_health_fault_info",
            "What the health run failed to do (value 1, the reason in label reason)",
            "gauge",
        )
        for fault in dict.fromkeys(report.faults):
            faults.add({"reason": fault}, 1)
        families.append(faults)
    return families


def select_checks(
    checks: Mapping[str, Any],
    wanted: list[str],
    skipped: list[str],
    config: HealthConfig,
    warn: Callable[[str], None],
) -> dict[str, Any]:
    """The checks to run: those `wanted` (all if none), less those skipped here or in the
    configuration."""
    unknown = [n for n in wanted + skipped if n not in checks]
    if unknown:
        raise UsageError(
            f"no health check named {unknown[0]!r}", f"checks: {', '.join(checks) or 'none'}"
        )
    for name in sorted(config.skip - set(checks)):
        warn(f"config {config.path}: skip names no check {name!r}")
    return {
        name: check
        for name, check in checks.items()
        if (not wanted or name in wanted) and name not in skipped and name not in config.skip
    }

"""One health run: the checks given their contexts and state, and its report in the formats
the engines read: a Nagios plugin's output (monitoring-plugins' Development Guidelines), JSON,
and Prometheus metric families.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ibtool.api import CheckContext, HealthCheck, HealthResult, MetricFamily, Status
from ibtool.healthstate import Saved
from ibtool.hooks import run_health_checks

# Worst first, then in check order: what a person reading the long output looks at first.
_ORDER = {Status.CRITICAL: 0, Status.WARNING: 1, Status.UNKNOWN: 2, Status.OK: 3}
SHOWN_IN_SUMMARY = 3  # problems named on the first line; the rest are counted


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
        text = summary(self.results)
        return "; ".join([*self.faults, text]) if self.faults else text

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
    returns their results with the state for the next run."""
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
    kept = dict(saved.checks) if saved is not None else {}
    for name, ctx in contexts.items():
        if ctx.kept is not None:
            kept[name] = {"data": ctx.kept, "boot_id": boot_id, "time": started}
    status = Status.worst(r.status for r in results) if results else Status.UNKNOWN
    return Report(results, status, started, kept=kept)


def ordered(results: list[HealthResult]) -> list[HealthResult]:
    return sorted(results, key=lambda r: _ORDER[r.status])


def _named(r: HealthResult) -> str:
    return f"{r.subject}: {r.summary}" if r.subject else r.summary


def summary(results: list[HealthResult]) -> str:
    """The first line's text: the problems, worst first (three, then how many more); when
    all is well, how many results of each check."""
    if not results:
        return "no health check ran"
    problems = [r for r in ordered(results) if r.status != Status.OK]
    if problems:
        shown = "; ".join(_named(r) for r in problems[:SHOWN_IN_SUMMARY])
        more = len(problems) - SHOWN_IN_SUMMARY
        return shown + (f"; and {more} more" if more > 0 else "")
    counts: dict[str, int] = {}
    for r in results:
        counts[r.check] = counts.get(r.check, 0) + 1
    return "all OK: " + ", ".join(f"{check} {n}" for check, n in counts.items())


def _perfdata(results: list[HealthResult], warn: Callable[[str], None]) -> list[str]:
    seen, items = set(), []
    for r in results:
        for p in r.perfdata:
            if p.label in seen:
                warn(f"health check {r.check}: perfdata label {p.label!r} twice; kept the first")
                continue
            seen.add(p.label)
            items.append(p.text())
    return items


def nagios(report: Report, warn: Callable[[str], None] = lambda m: None) -> str:
    """`IBTOOL STATUS - summary | perfdata`, then one line per result, worst first, then the
    run's own notes."""
    first = f"IBTOOL {report.status.name} - {report.summary}"
    perfdata = _perfdata(report.results, warn)
    if perfdata:
        first += " | " + " ".join(perfdata)
    lines = [first, *(f"[UNKNOWN] {fault}" for fault in report.faults)]
    for r in ordered(report.results):
        lines.append(f"[{r.status.name}] {r.check} {_named(r)}")
    lines += report.notes
    return "\n".join(lines) + "\n"


def unknown(message: str) -> str:
    """A run that could not check anything: the Nagios first line alone."""
    return f"IBTOOL UNKNOWN - {' '.join(message.split())}\n"


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
    return [overall, checks, subjects, when]

"""The far end of this host's cables and the subnet manager, judged for `ibtool health`: what
a node-side check cannot see in sysfs, because it is the switch's.

Each local InfiniBand port's cable (a Cable: both ends' PortInfo, the far port's PMA
counters) is judged as `ibtool fabric links` judges a link (degraded, or an end enabled
below what it could), and the far port's error counters by their growth since the last run,
against the thresholds of the local ports' counters (health.toml's [thresholds], under the
kernel's sysfs names); a counter that went down was cleared, a cable that reaches another
port than last time is a new baseline. The SM this port's SM LID names must answer, be the
master, and its activity count (SMInfo.ActCount, IBTA vol. 1 14.2.5.13) must move between two
runs far enough apart: a master that stopped sweeping answers its SMInfo still.

The kinds of the findings that are not OK, for a program:
far_end_silent       the port is up and its far end did not answer (MADs lost, a dead switch)
width_degraded, speed_degraded, width_enabled_below, speed_enabled_below
                     as `ibtool fabric links` names them
counter_errors       a far port's error counter grew past its threshold since the last run
link_flapped         its LinkDownedCounter grew: the link went down and up again
counter_saturated    a far port's counter stuck at its maximum
counters_silent      the far switch's performance agent did not answer
sm_unreachable       no SM LID set, or the SM there does not answer
sm_not_master        the SM this port was configured by is not the master
sm_idle              the master's activity has not moved between two runs
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ibtool.model.fabric.counters import CONGESTION, ERROR_COUNTERS, SYSFS_NAMES
from ibtool.model.fabric.links import judge
from ibtool.model.fabric.records import Cable, LinkEnd, end_name
from ibtool.model.fabric.sm import SmState, SubnetManager
from ibtool.model.health import HealthResult, Status, counter_growth

SINCE = "since the last run"
# How long a master's activity count may stand still before it is idle: opensm sweeps every
# 10 s by default (opensm.conf sweep_interval), and its count moves at every sweep.
SM_IDLE = 30.0


def _far(c: Cable) -> str:
    assert c.far is not None
    return end_name(LinkEnd(c.far, c.far.ports[c.far_port]))


def judge_cable(
    c: Cable,
    previous: dict | None,
    threshold: Callable[[str], Any],
    no_baseline: str,
) -> tuple[list[HealthResult], dict | None]:
    """The findings about one cable (subject DEV/PORT), and what to keep for the next run.
    `previous`: what the last run kept of it; `threshold(sysfs name)`: the health.toml
    thresholds of that counter (warning and critical Nagios ranges); `no_baseline`: what to
    say when there is no last run to compare with."""
    subject = f"{c.ca}/{c.port}"
    if not isinstance(previous, dict):
        previous = None  # a state file's entry that is not ours: no baseline
    if c.far is None:
        if c.why.endswith("did not answer"):
            fix = "MADs to it are lost: check the cable, and the switch (ibtool fabric links)"
            return [HealthResult(Status.WARNING, subject, f"{c.why}: {fix}",
                                 kind="far_end_silent")], previous  # fmt: skip
        return [], previous  # not up: the port check says why
    far = _far(c)
    link = c.link
    assert link is not None
    found = [
        HealthResult(f.status, subject, f"cable to {far}: {f.what}; {f.fix}", kind=f.kind)
        for f in judge(link, None)
    ]
    kept: dict[str, Any] = {"far": [c.far.guid, c.far_port], "counters": {}}
    moved: list[str] = []
    if c.counters is None:
        found.append(HealthResult(Status.WARNING, subject, f"cable to {far}: {c.silent}",
                                  kind="counters_silent"))  # fmt: skip
        return found, previous
    same_end = previous is not None and previous.get("far") == [c.far.guid, c.far_port]
    old = previous.get("counters", {}) if same_end else {}
    for name in ERROR_COUNTERS:
        value = c.counters.values.get(name)
        if value is None:
            continue
        sysfs = SYSFS_NAMES[name]
        kept["counters"][name] = value
        if c.counters.saturated(name):
            found.append(HealthResult(
                Status.WARNING, subject,
                f"cable to {far}: {name} saturated at {value}: clear it to count",
                kind="counter_saturated",
            ))  # fmt: skip
            continue
        was = old.get(name) if isinstance(old, dict) else None
        if not isinstance(was, int) or isinstance(was, bool):
            continue
        if value < was:
            moved.append(f"{name} reset {SINCE}: new baseline")
            continue
        delta = value - was
        if not delta:
            continue
        limits = threshold(sysfs)
        if name == CONGESTION and limits.warning is None and limits.critical is None:
            moved.append(f"{name} +{delta} {SINCE}")
            continue
        got = counter_growth(name, delta, limits, SINCE, downed=name == "LinkDownedCounter")
        if got is None:
            moved.append(f"{name} +{delta} {SINCE}")
        else:
            status, text, kind = got
            found.append(HealthResult(status, subject, f"cable to {far}: {text}", kind=kind))
    if not found:
        port = link.b.port
        rate = f"{port.width or '?'} {port.speed.active_name() or '?'}"
        if previous is not None and not same_end:
            said = "a new far end since the last run: new baseline"
        elif not same_end:
            said = no_baseline
        else:
            said = "; ".join(moved) if moved else f"no errors {SINCE}"
        found.append(HealthResult(Status.OK, subject, f"cable to {far}: {rate}, {said}"))
    return found, kept


def judge_sm(
    subject: str,
    sm_lid: int,
    sm: SubnetManager | None,
    previous: dict | None,
    now: float,
    idle: float = SM_IDLE,
) -> tuple[list[HealthResult], dict | None]:
    """The findings about the SM port `subject`'s SM LID names, and what to keep: its GUID
    and activity count, with the time (`now`, Unix) of the run that last saw it move."""
    fix = "check the SM (systemctl status opensm on its node; ibtool fabric sm)"
    if not sm_lid:
        text = "no SM LID set: no subnet manager has configured this port"
        return [HealthResult(Status.CRITICAL, subject, f"{text}; {fix}",
                             kind="sm_unreachable")], previous  # fmt: skip
    if sm is None:
        text = f"the subnet manager at LID {sm_lid} does not answer"
        return [HealthResult(Status.CRITICAL, subject, f"{text}; {fix}",
                             kind="sm_unreachable")], previous  # fmt: skip
    who = f"{sm.node.description} (LID {sm_lid})"
    if sm.state != SmState.MASTER:
        state = sm.state.name if sm.state is not None else "in an unknown state"
        text = f"the subnet manager this port names, {who}, is {state}, not the master"
        return [HealthResult(Status.CRITICAL, subject, f"{text}; {fix}",
                             kind="sm_not_master")], previous  # fmt: skip
    kept = {"guid": sm.guid, "activity": sm.activity, "since": now}
    same = (
        isinstance(previous, dict)
        and previous.get("guid") == sm.guid
        and isinstance(previous.get("activity"), int)
        and isinstance(previous.get("since"), (int, float))
    )
    interval = now - previous["since"] if same else None
    if not same or interval is None or interval < 0:
        said = "master" if same or previous is None else "master (a new one since the last run)"
        return [HealthResult(Status.OK, subject, f"subnet manager {who}: {said}")], kept
    moved = (sm.activity - previous["activity"]) % (1 << 32)
    if moved:
        text = f"subnet manager {who}: master, activity +{moved} {SINCE}"
        return [HealthResult(Status.OK, subject, text)], kept
    if interval < idle:
        # too soon to tell: the baseline stays the older run's, so that runs closer together
        # than the SM sweeps still catch an idle master
        text = f"subnet manager {who}: master, activity unchanged in {interval:.0f} s"
        return [HealthResult(Status.OK, subject, text)], previous
    text = (
        f"subnet manager {who}: master, its activity has not moved in {interval:.0f} s: it "
        f"stopped sweeping (hung); restart it, or let a standby take over"
    )
    return [HealthResult(Status.CRITICAL, subject, text, kind="sm_idle")], previous

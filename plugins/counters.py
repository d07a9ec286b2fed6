"""`ibtool counters`: PMA and driver counters, per-second rates, errors only, explanations.

ibtool never resets a counter: rates come from two samples.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from ibtool.api import (
    Invocation,
    NotFoundError,
    UsageError,
    hookimpl,
    number,
    render,
    selector,
)

if TYPE_CHECKING:  # the rest is imported where it is used: no other command pays for it
    from ibtool.api import CounterSample

ACTIONS = ("optional", "enable", "disable")
USAGE = (
    "ibtool counters [show] [DEV[/PORT]] | ibtool counters optional [DEV[/PORT]] | "
    "ibtool counters { enable | disable } DEV[/PORT] NAME[,NAME...] (disable: or all)"
)


# Two samples closer than a millisecond are a busy loop, not a rate; a day apart is as long as
# a rate by eye is worth waiting for (the PMA counters of a busy port saturate long before).
INTERVAL = (0.001, 86400.0)


def configure(parser) -> None:
    parser.add_argument(
        "words",
        nargs="*",
        metavar="[show] [DEV[/PORT]] | optional [DEV[/PORT]] | enable|disable DEV[/PORT] NAME..",
    )
    parser.add_argument(
        "--rate", action="store_true", help="per-second rates from two samples --interval apart"
    )
    parser.add_argument(
        "--interval",
        type=number(float, *INTERVAL, unit="seconds"),
        default=1.0,
        metavar="SECONDS",
        help="time between the two samples of --rate (default 1)",
    )
    parser.add_argument(
        "--watch",
        type=number(float, *INTERVAL, unit="seconds"),
        metavar="SECONDS",
        help="print rates every SECONDS until interrupted",
    )
    parser.add_argument(
        "--errors",
        action="store_true",
        help="only error counters that are not zero (or moving, with rates)",
    )
    parser.add_argument("--explain", metavar="NAME", help="what a counter means and what raises it")


def _info():
    """What each counter means (ibtool.api.counters): imported where a command or check uses
    it, not at every start."""
    from ibtool.api import counters

    return counters


def _saturated(s: CounterSample) -> bool:
    from ibtool.api import is_saturated

    return is_saturated(s)


def _value(s: CounterSample) -> int | None:
    return None if s.value is None else s.value * s.scale


FIELDS = [
    render.Field("ifname", lambda r: r[0].device, header="DEV"),
    render.Field("port", lambda r: r[0].port or None, header="PORT", text=str),
    render.Field("counter", lambda r: r[0].name, header="COUNTER"),
    render.Field("value", lambda r: _value(r[0]), header="VALUE", always=True),
    render.Field("unit", lambda r: _info().unit(r[0].name, r[0].source), header="UNIT"),
    render.Field("source", lambda r: r[0].source, header="SOURCE"),
    render.Field(
        "error",
        lambda r: _info().is_error(r[0].name, r[0].source),
        header="ERR",
        text=lambda v: "yes" if v else "",
    ),
    render.Field(
        "saturated", lambda r: _saturated(r[0]), header="SAT", text=lambda v: "yes" if v else ""
    ),
    render.Field("via", lambda r: r[0].via, header="VIA", details=True),
]
RATE_FIELDS = [
    render.Field("rate_per_sec", lambda r: r[1], header="RATE/s", text=lambda v: f"{v:,.1f}"),
    render.Field("note", lambda r: r[2], header="NOTE"),
]


def _explain(inv: Invocation, name: str) -> None:
    counterinfo = _info()
    info = counterinfo.PMA.get(name) or counterinfo.HW.get(name)
    if info is None:
        known = sorted({*counterinfo.PMA, *counterinfo.HW})
        raise NotFoundError(
            f"no explanation for counter {name!r}",
            f"known counters: {', '.join(known[:8])}, ... ({len(known)} in all)",
        )
    source = "InfiniBand PMA PortCounters" if name in counterinfo.PMA else "driver hw_counters"
    if inv.json:
        inv.emit_json(
            {
                "counter": name,
                "source": source,
                "kind": info.kind,
                "description": info.description,
                "causes": info.causes or None,
                "width": info.width,
            }
        )
        return
    inv.print(f"{name} ({source}, {info.kind}): {info.description}.")
    if info.causes:
        inv.print(f"Usually raised by: {info.causes}.")


def _keep(rows, errors_only: bool):
    counterinfo = _info()
    if not errors_only:
        return rows
    return [
        r
        for r in rows
        if counterinfo.is_error(r[0].name, r[0].source)
        and ((r[0].value or 0) > 0 or (r[1] or 0) > 0)
    ]


def _emit(inv: Invocation, rows, with_rate: bool) -> None:
    fields = FIELDS + (RATE_FIELDS if with_rate else [])
    if inv.json:
        inv.emit_json([render.record_json(r, fields, inv.details) for r in rows])
    else:
        for line in render.table(rows, fields, inv.details):
            inv.print(line)
    inv.out.flush()


# -- optional counters (netlink only) -------------------------------------------------------

OPTIONAL_FIELDS = [
    render.Field("ifname", lambda c: c.device, header="DEV"),
    render.Field("port", lambda c: c.port, header="PORT"),
    render.Field("counter", lambda c: c.name, header="COUNTER"),
    render.Field(
        "enabled", lambda c: c.enabled, header="ENABLED", text=lambda v: "yes" if v else "no"
    ),
    render.Field("index", lambda c: c.index, header="INDEX", details=True),
]


def _ports(inv: Invocation, sel: str | None) -> list[tuple[str, int]]:
    return [
        (name, p)
        for name, port in inv.host.select(sel)
        for p in ([port] if port is not None else inv.host.port_numbers(name))
    ]


def _names(words: list[str]) -> list[str]:
    return [n for w in words for n in w.split(",") if n]


def _optional(inv: Invocation, action: str, words: list[str]) -> None:
    netlink = inv.host.netlink("optional counters exist only in netlink", hint=USAGE)
    if action == "optional" and len(words) > 1:
        raise UsageError(f"unexpected arguments: {' '.join(words[1:])}", USAGE)
    if action != "optional" and len(words) < 2:
        raise UsageError(f"counters {action} takes DEV[/PORT] and counter names", USAGE)
    if action != "optional":
        inv.host.require_live(f"counters {action} changes the running kernel", hint=USAGE)
    targets = _ports(inv, words[0] if words else None)
    names = _names(words[1:])
    indexes = netlink.indexes()
    if action == "optional":
        rows = []
        for device, port in targets:
            rows += [c for c in netlink.counter_status(indexes, device, port) if c.optional]
        if inv.json:
            inv.emit_json([render.record_json(c, OPTIONAL_FIELDS, inv.details) for c in rows])
        else:
            for line in render.table(rows, OPTIONAL_FIELDS, inv.details):
                inv.print(line)
        if not rows:
            inv.warn("no optional counters on " + ", ".join(f"{d}/{p}" for d, p in targets))
        return
    for device, port in targets:
        optional = {c.name: c for c in netlink.counter_status(indexes, device, port) if c.optional}
        wanted = set(optional) if action == "disable" and names == ["all"] else set(names)
        unknown = sorted(wanted - set(optional))
        if unknown:
            raise NotFoundError(
                f"{device}/{port} has no optional counter {unknown[0]!r}",
                f"optional counters of {device}/{port}: {', '.join(sorted(optional)) or 'none'}"
                " (ibtool counters optional)",
            )
        enabled = {n for n, c in optional.items() if c.enabled}
        enabled = enabled | wanted if action == "enable" else enabled - wanted
        netlink.set_optional_counters(
            indexes[device], port, sorted(optional[n].index for n in enabled)
        )


# -- counters -------------------------------------------------------------------------------


def run(inv: Invocation) -> None:
    from ibtool.api import Sampler

    args = inv.args
    if args.explain:
        return _explain(inv, args.explain)
    if args.words and args.words[0] in ACTIONS:
        return _optional(inv, args.words[0], list(args.words[1:]))
    sel = selector(args)
    interval = args.watch if args.watch is not None else args.interval
    if inv.snapshot is not None and (args.rate or args.watch is not None):
        # A snapshot holds one reading of each counter: a rate needs two, taken apart in time.
        flag = "--rate" if args.rate else "--watch"
        raise UsageError(
            f"counters {flag} needs two readings, and a snapshot holds one",
            "ibtool snapshot diff A B shows how the counters moved between two snapshots",
        )
    sampler = Sampler(lambda: inv.host.counters(sel), clock=time.monotonic)
    first = sampler.sample()
    if not (args.rate or args.watch):
        _emit(inv, _keep(first, args.errors), False)
        return
    try:
        while True:
            time.sleep(max(0.0, interval - (time.monotonic() - sampler.at)))
            rows = [
                r
                for r in sampler.sample()
                if args.watch is None or r.rate or r.note not in (None, "new")
            ]
            _emit(inv, _keep(rows, args.errors), True)
            if args.watch is None:
                return
            if not inv.json:
                inv.print()
    except KeyboardInterrupt:
        inv.out.flush()  # the rates shown stay; main() gives the signal's exit code (ibtool(8))
        raise


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "counters",
        run,
        configure=configure,
        aliases=("stats",),
        help="port counters (PMA and driver), rates, errors, explanations",
    )


# -- health and metrics --------------------------------------------------------------------------


def _subject(s: CounterSample) -> str:
    return s.device if s.port == 0 else f"{s.device}/{s.port}"


def _watched(s: CounterSample, config) -> bool:
    """Error counters, and whatever has a configured threshold (port_xmit_wait, say)."""
    return s.name in config.thresholds or _info().is_error(s.name, s.source)


def _baseline(ctx, incarnation) -> tuple[dict, set[str]]:
    """What the last run kept, per device, where it still counts: same boot and the same
    device (not one re-created under its name); and the devices re-created since."""
    previous = ctx.previous if ctx.same_boot and isinstance(ctx.previous, dict) else {}
    devices = previous.get("devices") if isinstance(previous.get("devices"), dict) else {}
    usable, recreated = {}, set()
    for name, entry in devices.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("counters"), dict):
            continue
        if entry.get("incarnation") != incarnation(name):
            recreated.add(name)
        else:
            usable[name] = entry["counters"]
    return usable, recreated


# The kinds of the findings that are not OK, for a program:
# counter_errors     a counter grew past its warning or critical threshold since the last run
# link_flapped       link_downed grew: the link went down and up again since the last run
# counter_saturated  a counter stuck at its maximum, which counts no more until cleared


def _no_baseline(ctx) -> str:
    if not ctx.stateful:
        return "no state kept: error counters not compared"
    if ctx.previous is not None and not ctx.same_boot:
        return "rebooted since the last run: new baseline"
    return "first run: baseline taken"


def check_counters(ctx):
    """The error counters' deltas since the last run against their thresholds (a link that
    went down and up again between two runs shows in link_downed); saturated counters; resets
    (a cleared counter, a re-created device, a reboot) taken as a new baseline, never an
    alarm."""
    from ibtool.api import HealthResult, Status, counter_delta, is_saturated
    from ibtool.api.health import counter_growth

    host, config = ctx.host, ctx.config
    samples = [s for s in host.counters() if s.value is not None and _watched(s, config)]
    incarnations: dict[str, int | None] = {}

    def incarnation(device: str) -> int | None:  # one stat per device and run
        if device not in incarnations:
            incarnations[device] = host.incarnation(device)
        return incarnations[device]

    baseline, recreated = _baseline(ctx, incarnation)
    since = "since the last run"
    kept: dict = {}
    subjects: dict[str, list] = {}
    for s in samples:
        key = f"{s.port}/{s.source}/{s.name}"
        entry = kept.setdefault(s.device, {"incarnation": incarnation(s.device), "counters": {}})
        entry["counters"][key] = s.value
        findings = subjects.setdefault(_subject(s), [])
        limits = config.threshold(s.name, s.source)
        if is_saturated(s):
            said = f"{s.name} saturated at {s.value}: clear it to count"
            findings.append((Status.WARNING, said, "counter_saturated"))
            continue
        old = baseline.get(s.device, {}).get(key)
        if not isinstance(old, int):
            continue
        delta, note = counter_delta(dataclasses.replace(s, value=old), s)
        if note == "reset":
            findings.append((Status.OK, f"{s.name} reset {since}: new baseline", ""))
        elif delta:
            found = counter_growth(s.name, delta, limits, since, downed=s.name == "link_downed")
            findings.append(found or (Status.OK, f"{s.name} +{delta} {since}", ""))
    for subject, findings in subjects.items():
        device = subject.partition("/")[0]
        bad = [f for f in findings if f[0] != Status.OK]
        for status, text, kind in bad:
            yield HealthResult(status, subject, text, kind=kind)
        if bad:
            continue
        moved = [text for _, text, _ in findings]
        if device in recreated:
            summary = "device re-created since the last run: new baseline"
        elif device not in baseline:
            summary = _no_baseline(ctx)
        else:
            summary = "; ".join(moved) if moved else f"no errors {since}"
        yield HealthResult(Status.OK, subject, summary)
    ctx.keep({"devices": kept})


def counter_metrics(host):
    """Every counter as a Prometheus counter: PMA counters under their own names (the data
    counters in bytes), the driver's in one family labelled with the counter's name."""
    from ibtool.api import MetricFamily

    counterinfo = _info()

    families: dict[str, MetricFamily] = {}
    # promtool refuses a counter named *counter*: rdma(8) calls these statistics
    hw = MetricFamily(
        "ibtool_hw_statistic", "A driver's counter (hw_counters, rdma statistic)", "counter"
    )
    for s in host.counters():
        if s.value is None:
            continue
        labels = {"device": s.device, "port": str(s.port)}
        if s.source != "pma":
            hw.add({**labels, "name": s.name}, s.value)
            continue
        name = s.name.lower()
        name = "ibtool_" + (name if name.startswith("port_") else "port_" + name)
        info = counterinfo.info(s.name, s.source)
        if name not in families:
            families[name] = MetricFamily(
                name,
                info.description if info else s.name,
                "counter",
                "bytes" if s.scale != 1 else "",
            )
        families[name].add(labels, s.value * s.scale)
    return [*families.values(), hw]


@hookimpl
def ibtool_health_checks(register):
    register("counters", check_counters)


@hookimpl
def ibtool_metrics(register):
    register("counters", counter_metrics)

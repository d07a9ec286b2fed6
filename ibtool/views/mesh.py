"""`ibtool mesh`'s result as people and programs read it: the heat map of every ordered pair,
the text report, the JSON document (streamed: a 1,024 x 8 mesh has 8.4 million pairs) and the
node_exporter textfile.

The heat map has one cell per ordered pair (row: the source, column: the destination), a glyph
per health so it reads without colour and when pasted, coloured too on a terminal:

    .  OK       s  SLOW     l  LOSSY    X  FAILED   (blank) no pair probed   \\  self

Past what fits the width, the cells are folded (ibtool.model.mesh.fold, as the last mesh saves
them too): one per (node, node), then one per (bin of nodes, bin of nodes), each holding the
worst health of the pairs it covers.
"""

from __future__ import annotations

import json
import math
import statistics
import textwrap
from collections.abc import Callable, Iterator

from ibtool.model.deferred import dataclass
from ibtool.model.fabric import end_name
from ibtool.model.mesh import (
    CODE,
    NONE,
    SELF,
    CableFinding,
    Fold,
    Full,
    Health,
    Level,
    MeshResult,
    PairState,
    Verdict,
    fold,
    nodes_of,
    refold,
    short_names,
)
from ibtool.views.fabric import guid
from ibtool.views.prometheus import MetricFamily, exposition

# Rich styles (the dashboard) and SGR codes (a terminal) of each cell, one mapping
STYLE = {
    Health.OK: "green",
    Health.SLOW: "yellow",
    Health.LOSSY: "magenta",
    Health.FAILED: "bold red",
    NONE: "dim",
    SELF: "dim",
}
SGR = {"green": "32", "yellow": "33", "magenta": "35", "bold red": "1;31", "dim": "2"}
LEGEND = ". OK  s SLOW  l LOSSY  X FAILED  (blank) no pair  \\ self"
LABEL_MAX = 24  # a row label's characters at most (the name's middle cut)
MAX_VERDICTS = 40  # verdicts in the text report; -j has them all


def us(x: float | None) -> str:
    """An RTT as people read it: 3.2 us, 812 us, 67.1 ms."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x >= 1000:
        return f"{x / 1000:.1f} ms"
    return f"{x:.1f} us" if x < 100 else f"{x:.0f} us"


# -- the heat map ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapLayout:
    """A fold laid out in columns: the header lines (the columns' indices, written down), each
    row as (label, glyphs) with its cells `cell` characters apart, the lines that say what a
    cell is."""

    title: tuple[str, ...]
    header: tuple[str, ...]
    rows: tuple[tuple[str, str], ...]
    cell: int
    notes: tuple[str, ...]


def _cut(name: str, most: int) -> str:
    if len(name) <= most:
        return name
    if most <= 1:
        return name[:most]
    head = (most - 1) // 2
    return name[:head] + "~" + name[len(name) - (most - 1 - head) :]


def _label_width(labels, cells: int, width: int) -> tuple[int, int]:
    """(index digits, name characters) of the row labels for `cells` columns."""
    digits = len(str(max(0, cells - 1)))
    longest = max((len(s) for s in labels), default=1)
    return digits, max(1, min(LABEL_MAX, longest, width - cells - digits - 2))


def layout(f: Fold, width: int) -> MapLayout:
    """`f` within `width` columns (refolded if its cells do not fit), two characters a cell
    where they fit (squarer on a terminal), one otherwise."""
    width = max(8, width)
    while True:
        g = len(f.labels)
        digits, names = _label_width(f.labels, g, width)
        lead = digits + 1 + names + 1
        if lead + g <= width or g <= 1:
            break
        f = refold(f, max(1, width - lead - 1))
    cell = 2 if lead + 2 * g - 1 <= width else 1
    rows = []
    for k, (label, glyphs) in enumerate(zip(f.labels, f.rows())):
        text = f"{k:>{digits}} {_cut(label, names):<{names}} "
        rows.append((text, (" " * (cell - 1)).join(glyphs) if cell > 1 else glyphs))
    header = []
    for place in range(digits - 1, -1, -1):
        marks = []
        for k in range(g):
            s = str(k)
            marks.append(s[len(s) - 1 - place] if place < len(s) else " ")
        line = " " * lead + (" " * (cell - 1)).join(marks)
        header.append(line.rstrip())
    what = {"endpoint": "endpoints", "node": "nodes", "nodes": "nodes", "endpoints": "endpoints"}
    title = f"heat map of {f.total:,} {what[f.unit]}: row = source, column = destination"
    notes = [LEGEND]
    if f.unit == "node":
        notes.append("each cell: a node to a node, the worst of their pairs")
    elif f.per_cell > 1:
        notes.append(
            f"each cell: {f.per_cell} {what[f.unit]} to {f.per_cell}, the worst of their pairs; "
            f"a row is labelled by its first"
        )
    return MapLayout(
        tuple(textwrap.wrap(title, width)),
        tuple(header),
        tuple(rows),
        cell,
        tuple(line for s in notes for line in textwrap.wrap(s, width, break_on_hyphens=False)),
    )


def _fit(result: MeshResult, width: int) -> Fold:
    """The finest fold whose row labels (whole, up to LABEL_MAX) and cells fit `width`."""
    eps = result.endpoints
    n = len(eps)
    names = short_names(result)
    longest = min(LABEL_MAX, max(len(s) for s in names))
    if len(str(n - 1)) + longest + 2 + n <= width:
        return fold(result, n)
    nodes = nodes_of(result)
    longest = min(LABEL_MAX, max(len(s) for s in nodes))
    digits = len(str(len(nodes) - 1))
    if digits + longest + 2 + len(nodes) <= width:
        return fold(result, len(nodes))
    # bins: at most as many as the width leaves beside labels of the bins' count's digits
    for cells in range(max(1, width - longest - 3), 0, -1):
        if len(str(cells - 1)) + longest + 2 + cells <= width:
            return fold(result, cells)
    return fold(result, 1)


def _paint(glyphs: str, color: bool) -> str:
    if not color:
        return glyphs
    out, run, style = [], [], None
    for ch in glyphs:
        if ch == " ":  # a separator or an empty cell: in the run, whatever its colour
            run.append(ch)
            continue
        s = STYLE[CODE[ch]]
        if s != style and run:
            out.append(_sgr("".join(run), style))
            run = []
        style = s
        run.append(ch)
    if run:
        out.append(_sgr("".join(run), style))
    return "".join(out)


def _sgr(text: str, style: str | None) -> str:
    return f"\x1b[{SGR[style]}m{text}\x1b[0m" if style else text


def map_lines(m: MapLayout, color: bool = False) -> list[str]:
    lines = [*m.title, *m.header]
    lines += [(label + _paint(glyphs.rstrip(), color)).rstrip() for label, glyphs in m.rows]
    return lines + list(m.notes)


def heat_map(result: MeshResult, width: int = 80, color: bool = False) -> list[str]:
    """The heat map of every ordered pair within `width` columns, its legend below."""
    if not result.endpoints:
        return ["heat map: no endpoints"]
    return map_lines(layout(_fit(result, width), width), color)


# -- the text report ---------------------------------------------------------------------------


def _rails(result: MeshResult) -> str:
    if result.settings.all_rails:
        return "all rails"
    rails = sorted({e.rail for e in result.endpoints})
    if not rails:
        return "no rails"
    by = {"subnet": " (by subnet)", "map": " (by --rail)"}.get(result.settings.rails, "")
    if len(rails) == 1:
        return f"rail {rails[0]}{by}"
    if rails == list(range(rails[0], rails[-1] + 1)):
        return f"rails {rails[0]}-{rails[-1]}{by}"
    return "rails " + ",".join(map(str, rails)) + by


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(round(s), 60)
    return f"{m} min {s} s" if m < 60 else f"{m // 60} h {m % 60} min"


def counts(result: MeshResult) -> tuple[int, int, int, int]:
    """(pairs scheduled, pairs probed, pings sent, pings answered)."""
    t = result.pairs
    scheduled = probed = sent = got = 0
    state, s_, r_ = t.state, t.sent, t.received
    for i in t.slots():
        scheduled += 1
        if state[i] == PairState.PROBED:
            probed += 1
            sent += s_[i]
            got += r_[i]
    return scheduled, probed, sent, got


def head(result: MeshResult) -> str:
    s = result.settings
    meshed = nodes_of(result)
    nodes = len(meshed) + len(set(result.unreachable) - set(meshed))
    _, probed, _, _ = counts(result)
    return (
        f"mesh: {_plural(len(result.endpoints), 'endpoint')} on {_plural(nodes, 'node')}, "
        f"{_rails(result)}, {_plural(result.rounds, 'round')}, "
        f"{_plural(probed, 'pair')} probed, {s.count} pings a pair ({s.mode}, {s.size} bytes), "
        f"{_path(s)}{s.engine}, {_seconds(result.elapsed)}"
    )


def _path(s) -> str:
    """What of the path differs from the defaults, for the head line: "tclass 104 (DSCP 26),
    4 QPs, ", or nothing."""
    said = []
    if s.tclass:
        said.append(f"tclass {s.tclass} (DSCP {s.tclass >> 2})")
    if s.sl:
        said.append(f"sl {s.sl}")
    if s.gid_index is not None:
        said.append(f"GID index {s.gid_index}")
    if s.pkey_index:
        said.append(f"P_Key index {s.pkey_index}")
    if s.qps > 1:
        said.append(f"{s.qps} QPs")
    if s.bw:
        said.append("bandwidth")
    return "".join(f"{x}, " for x in said)


def baseline_lines(result: MeshResult) -> list[str]:
    out = []
    for b in result.baselines:
        if b.median_us is None:
            out.append(f"{b.group}: no pair answered")
        else:
            out.append(
                f"{b.group}: median {us(b.median_us)}, p90 {us(b.p90_us)} over "
                f"{_plural(b.pairs, 'pair')}"
            )
    return out


def worst_first(verdicts: list[Verdict]) -> list[Verdict]:
    return sorted(verdicts, key=lambda v: -int(v.level))  # stable: the analysis' order within


def verdict_lines(verdicts: list[Verdict], most: int = MAX_VERDICTS) -> list[str]:
    out = []
    ordered = worst_first(verdicts)
    for v in ordered[:most]:
        out.append(f"{v.level.name} {v.culprit.value} {v.subject}: {v.why}")
        out += [f"  next: {cmd}" for cmd in v.next]
    if len(ordered) > most:
        out.append(f"... and {len(ordered) - most} more: -j lists them all")
    return out


def unreachable_line(result: MeshResult, most: int = 20) -> str | None:
    nodes = sorted(result.unreachable)
    if not nodes:
        return None
    shown = ", ".join(nodes[:most]) + (
        f" and {len(nodes) - most} more" if len(nodes) > most else ""
    )
    return f"unreachable (no agent): {shown}"


def busy_line(result: MeshResult, most: int = 10) -> str | None:
    """The endpoints whose ports resent while no agent pinged (a job's traffic)."""
    busy = sorted(
        ((e.busy, e.name) for e in result.endpoints if e.busy), key=lambda x: (-x[0], x[1])
    )
    if not busy:
        return None
    shown = ", ".join(f"{name} ({rate:.3g}/s)" for rate, name in busy[:most])
    more = f" and {len(busy) - most} more" if len(busy) > most else ""
    return (
        f"busy (RC retransmissions before the rounds, when no agent pinged: another job's "
        f"traffic; only what the rounds added is judged): {shown}{more}"
    )


SAMPLE = 1 << 20  # pairs' RTTs a quantile is taken over at most (a stride through the rest)


def _quantiles(values, qs: tuple[float, ...]) -> list[float | None]:
    data = [v for v in values if not math.isnan(v)]
    if not data:
        return [None for _ in qs]
    data.sort()
    return [data[min(len(data) - 1, int(q * len(data)))] for q in qs]


def rtt_quantiles(result: MeshResult) -> tuple[float | None, float | None]:
    """(median of the answered pairs' medians, 99th percentile of their p99s); over a sample
    of at most SAMPLE pairs evenly strided through a bigger mesh (never a list of them all)."""
    t = result.pairs
    state, received = t.state, t.received

    def answered():
        for i in t.slots():
            if state[i] == PairState.PROBED and received[i]:
                yield i

    stride = max(1, math.ceil(sum(1 for _ in answered()) / SAMPLE))
    picked = [i for k, i in enumerate(answered()) if k % stride == 0]
    medians = [v for v in (t.median[i] for i in picked) if not math.isnan(v)]
    med = statistics.median(medians) if medians else None
    p99 = _quantiles((t.p99[i] for i in picked), (0.99,))[0]
    return med, p99


def summary(result: MeshResult) -> str:
    line = _summary(result)
    return f"{line}; {result.stopped}" if result.stopped else line


def _summary(result: MeshResult) -> str:
    n = len(result.endpoints)
    if result.verdicts:
        levels = [v.level for v in result.verdicts]
        parts = [
            f"{levels.count(level)} {level.name}"
            for level in (Level.FAIL, Level.WARN)
            if levels.count(level)
        ]
        return f"mesh: {', '.join(parts)} verdicts over {_plural(n, 'endpoint')}"
    scheduled, probed, sent, got = counts(result)
    if not probed:
        return f"mesh UNKNOWN: no pair probed over {_plural(n, 'endpoint')}: {_why_none(result)}"
    answered = "every ping answered" if got == sent else f"{got:,} of {sent:,} pings answered"
    med, p99 = rtt_quantiles(result)
    return (
        f"mesh healthy: {_plural(n, 'endpoint')}, {_plural(probed, 'pair')}, {answered}, "
        f"RTT median {us(med)} p99 {us(p99)}"
    )


def _why_none(result: MeshResult) -> str:
    nodes = nodes_of(result)
    if len(result.endpoints) < 2:
        return "a mesh needs two endpoints at least"
    if len(nodes) == 1 and not result.settings.all_rails:
        return (
            "rail k pings rail k of the other nodes and there is one node "
            "(--all-rails pings between its ports)"
        )
    return "every pair was left out (see the verdicts and the unreachable nodes)"


def render_text(result: MeshResult, width: int = 80, color: bool = False) -> list[str]:
    """The whole report: the head, the heat map, the baselines, the verdicts worst first with
    their next commands, the unreachable nodes, the summary."""
    lines = [head(result), ""]
    lines += heat_map(result, width, color)
    lines.append("")
    lines += baseline_lines(result)
    verdicts = verdict_lines(result.verdicts)
    if verdicts:
        lines.append("")
        lines += verdicts
    gone = unreachable_line(result)
    if gone:
        lines.append(gone)
    busy = busy_line(result)
    if busy:
        lines.append(busy)
    tried, whole = result.retried
    if tried:
        lines.append(
            f"retried: {_plural(tried, 'pair')} that lost pings or were slow, probed again "
            f"after the last round: {whole} answered every ping in time (a stall of an end: "
            f"not judged), {tried - whole} failed again"
        )
    lines.append(summary(result))
    return lines


# -- JSON --------------------------------------------------------------------------------------


def _r(x: float | None) -> float | None:
    """A float32 figure as JSON writes it: 3 decimals (12.3, not 12.300000190734863)."""
    return None if x is None or math.isnan(x) else round(float(x), 3)


def settings_json(result: MeshResult) -> dict:
    s = result.settings
    return {
        "count": s.count,
        "size": s.size,
        "mode": s.mode,
        "rate": s.rate,
        "timeout": s.timeout,
        "all_rails": s.all_rails,
        "slow_factor": s.slow_factor,
        "tcp_port": s.tcp_port,
        "engine": s.engine,
        "sl": s.sl,
        "tclass": s.tclass,
        "pkey_index": s.pkey_index,
        "gid_index": s.gid_index,
        "full_payload": s.full_payload,
        "qps": s.qps,
        "bw": s.bw,
        "rails": s.rails,
    }


def endpoint_json(e) -> dict:
    return {
        "name": e.name,
        "node": e.node,
        "device": e.device,
        "port": e.port,
        "rail": e.rail,
        "address": e.address,
        "state": e.state,
        "link_layer": e.link_layer,
        "gid_index": e.gid_index,
        "hw_timestamps": e.hw_timestamps,
        "problem": e.problem,
        "rate": e.rate,
        "fw": e.fw,
        "active_mtu": e.mtu,
        "busy_retrans_per_s": None if e.busy is None else round(e.busy, 3),
        "tcp_port": e.tcp_port,
        "driver": e.driver,
        "kernel": e.kernel,
        "pfc": e.pfc,
        "trust": e.trust,
    }


def baseline_json(b) -> dict:
    return {
        "group": b.group,
        "pairs": b.pairs,
        "rtt_median_us": _r(b.median_us),
        "rtt_p90_us": _r(b.p90_us),
    }


def verdict_json(v: Verdict, names: list[str]) -> dict:
    out = {
        "culprit": v.culprit.value,
        "level": v.level.name,
        "subject": v.subject,
        "why": v.why,
        "endpoints": [names[i] for i in v.endpoints if 0 <= i < len(names)],
        "rail": v.rail,
        "next": list(v.next),
    }
    if v.cable is not None:
        out["cable"] = cable_json(v.cable)
    return out


def _end_json(e) -> dict:
    return {
        "name": end_name(e),
        "node": e.node.description,
        "guid": guid(e.node.guid),
        "port": e.port.number,
    }


def cable_json(f: CableFinding) -> dict:
    """A cable verdict's evidence: its ends (the one nearer the hosts first), those it cannot
    be told from, the paths walked through it and in all, its ends' error counters over
    their thresholds, and the local port the subnet was walked through."""
    s = f.suspect
    return {
        "ends": [_end_json(s.near), _end_json(s.far)],
        "ties": [[_end_json(a), _end_json(b)] for a, b in s.ties],
        "failing": s.failing,
        "failing_walked": s.failing_paths,
        "failing_total": f.failing_total,
        "passing": s.passing,
        "passing_walked": s.passing_paths,
        "passing_total": f.passing_total,
        "passing_total_estimated": f.estimated,
        "explained_by_endpoints": s.explained,
        "errors": [
            {
                "end": e.end,
                "counter": e.counter,
                "value": e.value,
                "threshold": e.threshold,
                "saturated": e.saturated,
            }
            for e in f.errors
        ],
        "unread": list(f.unread),
        "endpoints_crossing": list(f.endpoints),
        "paths": list(f.paths),
        "via": f.via,
    }


CHUNK = 2048  # pairs a chunk of the JSON stream


def _num(x: float) -> str:
    """A float32 column's figure as JSON: null for NaN, else 3 decimals (as _r)."""
    return "null" if math.isnan(x) else repr(round(float(x), 3))


def json_chunks(result: MeshResult) -> Iterator[str]:
    """One JSON object, in pieces: everything but the pairs first, then the pairs CHUNK at a
    time (never the whole list in memory). Keys: settings, endpoints, baselines, verdicts,
    unreachable, rounds, started, elapsed, round_seconds, stopped, exit_code, pairs."""
    names = [e.name for e in result.endpoints]
    dumps = json.dumps
    head = {
        "settings": settings_json(result),
        "endpoints": [endpoint_json(e) for e in result.endpoints],
        "baselines": [baseline_json(b) for b in result.baselines],
        "verdicts": [verdict_json(v, names) for v in worst_first(result.verdicts)],
        "unreachable": [{"node": n, "why": w} for n, w in sorted(result.unreachable.items())],
        "rounds": result.rounds,
        "started": round(result.started, 3),
        "elapsed": round(result.elapsed, 3),
        "round_seconds": [round(x, 3) for x in result.round_seconds],
        "stopped": result.stopped,
        "retried": {"pairs": result.retried[0], "answered": result.retried[1]},
        "exit_code": result.exit_code(),
    }
    yield dumps(head)[:-1] + ', "pairs": ['
    # each pair written by hand, the names escaped once: json.dumps of a dict per pair is
    # 4 times slower (a 1,024 x 8 mesh: 8.4 million of them)
    t = result.pairs
    quoted = [dumps(n) for n in names]
    states = {int(s): s.name for s in PairState}
    healths = {int(h): h.name for h in Health}
    fulls = {int(f): f.name for f in Full}
    full, bw = t.full, t.bw
    batch: list[str] = []
    first = True
    for i in t.slots():
        r, s = divmod(i, t.width)
        error = t.errors.get(i)
        batch.append(
            f'{{"src": {quoted[s]}, "dst": {quoted[t.dst[i]]}, "round": {r}, '
            f'"state": "{states[t.state[i]]}", "sent": {t.sent[i]}, '
            f'"received": {t.received[i]}, "rtt_median_us": {_num(t.median[i])}, '
            f'"rtt_p90_us": {_num(t.p90[i])}, "rtt_p99_us": {_num(t.p99[i])}, '
            f'"hw": {"true" if t.hw[i] else "false"}, '
            f'"error": {"null" if error is None else dumps(error)}, '
            f'"full_payload": "{fulls[full[i]]}", '
            + ("" if bw is None else f'"bw_gbps": {_num(bw[i])}, ')
            + f'"health": "{healths[t.health[i]]}"}}'
        )
        if len(batch) >= CHUNK:
            yield ("" if first else ", ") + ", ".join(batch)
            first, batch = False, []
    if batch:
        yield ("" if first else ", ") + ", ".join(batch)
    yield "]}"


# -- node_exporter's textfile ------------------------------------------------------------------

MAX_PAIR_SERIES = 50_000  # pairs with series of their own; past it, only the pairs not OK


def textfile(
    result: MeshResult, now: Callable[[], float] | None = None, max_pairs: int = MAX_PAIR_SERIES
) -> str:
    """The mesh as Prometheus text exposition for node_exporter's textfile collector: every
    pair's RTT quantiles, pings and whether it is up, the verdicts, the run. Past `max_pairs`
    pairs (a 1,024 x 8 mesh has 8.4 million: 40 million series), only the pairs that are not
    OK get series; ibtool_mesh_pairs_exported says how many did."""
    import time

    eps = result.endpoints
    t = result.pairs
    rtt = MetricFamily(
        "ibtool_mesh_pair_rtt",
        "RTT percentiles (50, 90, 99) of an ordered pair's pings in the last mesh",
        "gauge",
        unit="seconds",
    )
    sent = MetricFamily(
        "ibtool_mesh_pair_pings_sent", "Pings the source sent to the destination", "gauge"
    )
    got = MetricFamily(
        "ibtool_mesh_pair_pings_received", "Pings of the pair that were answered", "gauge"
    )
    up = MetricFamily(
        "ibtool_mesh_pair_up", "1 if every ping of the pair was answered, else 0", "gauge"
    )
    health = MetricFamily(
        "ibtool_mesh_pair_health",
        "The pair's health: 0 OK, 1 SLOW, 2 LOSSY, 3 FAILED",
        "gauge",
    )
    total = t.rounds * t.width
    all_pairs = sum(1 for i in range(total) if t.dst[i] >= 0) <= max_pairs
    exported = 0
    for i in t.slots():
        h = t.health[i]
        if not all_pairs and h == Health.OK:
            continue
        s, d = eps[i % t.width], eps[t.dst[i]]
        rail = str(s.rail) if s.rail == d.rail else f"{s.rail}-{d.rail}"
        labels = {"src": s.name, "src_node": s.node, "dst": d.name, "dst_node": d.node}
        labels["rail"] = rail
        for q, column in (("50", t.median), ("90", t.p90), ("99", t.p99)):
            v = column[i]
            if not math.isnan(v):  # a gauge's label: "quantile" is a summary's (promtool)
                rtt.add({**labels, "percentile": q}, round(float(v), 3) / 1e6)
        sent.add(labels, t.sent[i])
        got.add(labels, t.received[i])
        ok = t.state[i] == PairState.PROBED and t.sent[i] and t.received[i] == t.sent[i]
        up.add(labels, 1 if ok else 0)
        health.add(labels, int(h))
        exported += 1
    verdict = MetricFamily(
        "ibtool_mesh_verdict",
        "A verdict of the last mesh (level: WARN or FAIL), 1 while it stands",
        "gauge",
    )
    seen = set()
    for v in result.verdicts:
        key = (v.culprit.value, v.subject, v.level.name)
        if key not in seen:
            seen.add(key)
            verdict.add({"culprit": key[0], "subject": key[1], "level": key[2]}, 1)
    endpoints = MetricFamily("ibtool_mesh_endpoints", "Endpoints of the last mesh", "gauge")
    endpoints.add({}, len(eps))
    pairs = MetricFamily("ibtool_mesh_pairs", "Ordered pairs the last mesh probed", "gauge")
    pairs.add({}, counts(result)[1])
    exported_f = MetricFamily(
        "ibtool_mesh_pairs_exported",
        f"Pairs with series here (past {max_pairs}, only the pairs not OK)",
        "gauge",
    )
    exported_f.add({}, exported)
    unreachable = MetricFamily(
        "ibtool_mesh_unreachable_nodes", "Nodes whose agent did not start", "gauge"
    )
    unreachable.add({}, len(result.unreachable))
    status = MetricFamily(
        "ibtool_mesh_status",
        "The last mesh's exit code: 0 healthy, 1 WARN, 2 FAIL, 3 no pair probed",
        "gauge",
    )
    status.add({}, result.exit_code())
    last = MetricFamily(
        "ibtool_mesh_last_run_timestamp",
        "When the last mesh started (Unix time)",
        "gauge",
        unit="seconds",
    )
    last.add({}, float(result.started or (now or time.time)()))
    duration = MetricFamily(
        "ibtool_mesh_duration", "How long the last mesh took", "gauge", unit="seconds"
    )
    duration.add({}, float(result.elapsed))
    families = [rtt, sent, got, up, health, verdict, endpoints, pairs, exported_f]
    return exposition(families + [unreachable, status, last, duration])

"""`ibtool doctor`'s checklist as text: one line a check (verdict, check, evidence), its detail
lines (an InfiniBand route's hops) and its fix indented below, a head line naming both ends and
a summary line.

The evidence holds a peer's text: everything in Facts was made printable when it came in
(ibtool.model.doctor.Facts.from_wire), so nothing here can drive the terminal.
"""

from __future__ import annotations

from collections import Counter

from ibtool.model.doctor import Facts, Finding, Verdict

WIDTH = 10  # the check column


def _end(f: Facts) -> str:
    where = f"{f.device}/{f.port}"
    gid = next((g for g in f.gids if g.index == f.gid_index), None)
    if gid is not None:
        where += f" GID {gid.index} {gid.ip or gid.gid}"
    elif f.lid:
        where += f" LID {f.lid}"
    return where


def head(local: Facts, peer: Facts | None, peer_address: str | None) -> str:
    line = f"doctor: {_end(local)}"
    if peer_address is not None:
        line += f" -> {peer_address}"
        if peer is not None:
            line += f" ({_end(peer)}" + (f" on {peer.hostname})" if peer.hostname else ")")
    return line


def lines(findings: list[Finding]) -> list[str]:
    out = []
    for f in findings:
        out.append(f"{f.verdict.value:<5} {f.check:<{WIDTH}} {f.evidence}")
        out.extend(f"{'':<5} {'':<{WIDTH}} {line}" for line in f.detail)
        if f.fix:
            out.append(f"{'':<5} {'':<{WIDTH}} fix: {f.fix}")
    return out


def summary(findings: list[Finding]) -> str:
    counts = Counter(f.verdict for f in findings)
    parts = [
        f"{counts[v]} {word}"
        for v, word in (
            (Verdict.FAIL, "failed"),
            (Verdict.WARN, "warned"),
            (Verdict.PASS, "passed"),
            (Verdict.SKIP, "skipped"),
        )  # fmt: skip
        if counts[v]
    ]
    return f"status: {Verdict.worst(counts).value} ({', '.join(parts) or 'nothing checked'})"

"""rdma's `res show` command-line grammar: [OBJECT] [DEV[/PORT]] [KEY VALUE]..., each KEY a
filter on a field (numbers, ranges and lists as rdma reads them, words case-blind)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ibtool.errors import UsageError
from ibtool.model.deferred import dataclass
from ibtool.views.res import OBJECTS, PER_PORT, Row, attr, enum_word, port_space

USAGE = (
    "ibtool res [show] [DEV] | ibtool res [show] OBJECT [DEV[/PORT]] [KEY VALUE]... "
    "(OBJECT: qp, cm_id, cq, mr, pd, ctx, srq; KEY as rdma res show takes it, or comm)"
)


# -- filters: rdma's KEY VALUE words -------------------------------------------------------------


@dataclass(frozen=True)
class Filter:
    get: Callable[[Row], Any]
    number: bool


def _numbers(key: str, value: str) -> list[tuple[int, int]]:
    """ "5", "5,7", "5-9,12" (ranges inclusive, as rdma reads them); 0x for hex."""
    ranges = []
    for item in value.split(","):
        if not item:
            continue
        low, _, high = item.partition("-")
        try:
            ranges.append((int(low, 0), int(high or low, 0)))
        except ValueError:
            raise UsageError(
                f"{key} takes numbers, not {value!r}", "e.g. 5, 5,7 or 5-9 (ranges inclusive)"
            ) from None
    if not ranges:
        raise UsageError(f"{key} takes numbers, not {value!r}")
    return ranges


def _srq_has(row: Row) -> list[tuple[int, int]]:
    return list(row.record.lqpns)


_COMMON = {
    "pid": Filter(lambda row: row.record.owner.pid, True),
    "comm": Filter(lambda row: row.comm, False),
}
FILTERS: dict[str, dict[str, Filter]] = {
    "qp": {
        "lqpn": Filter(attr("lqpn"), True),
        "rqpn": Filter(attr("rqpn"), True),
        "sq-psn": Filter(attr("sq_psn"), True),
        "rq-psn": Filter(attr("rq_psn"), True),
        "pdn": Filter(attr("pdn"), True),
        "type": Filter(enum_word("type"), False),
        "state": Filter(enum_word("state"), False),
        "path-mig-state": Filter(enum_word("path_mig_state"), False),
    },
    "cm_id": {
        "cm-idn": Filter(attr("cm_idn"), True),
        "lqpn": Filter(attr("lqpn"), True),
        "qp-type": Filter(enum_word("qp_type"), False),
        "state": Filter(enum_word("state"), False),
        "ps": Filter(lambda row: port_space(row.record.ps), False),
        "src-addr": Filter(lambda row: _address(row.record.src_addr), False),
        "src-port": Filter(lambda row: _port(row.record.src_addr), True),
        "dst-addr": Filter(lambda row: _address(row.record.dst_addr), False),
        "dst-port": Filter(lambda row: _port(row.record.dst_addr), True),
    },
    "cq": {
        "cqn": Filter(attr("cqn"), True),
        "users": Filter(attr("users"), True),
        "ctxn": Filter(attr("ctxn"), True),
        "poll-ctx": Filter(enum_word("poll_ctx"), False),
    },
    "mr": {
        "mrn": Filter(attr("mrn"), True),
        "rkey": Filter(attr("rkey"), True),
        "lkey": Filter(attr("lkey"), True),
        "mrlen": Filter(attr("mrlen"), True),
        "pdn": Filter(attr("pdn"), True),
    },
    "pd": {
        "pdn": Filter(attr("pdn"), True),
        "users": Filter(attr("users"), True),
        "ctxn": Filter(attr("ctxn"), True),
    },
    "ctx": {"ctxn": Filter(attr("ctxn"), True)},
    "srq": {
        "srqn": Filter(attr("srqn"), True),
        "type": Filter(enum_word("type"), False),
        "pdn": Filter(attr("pdn"), True),
        "cqn": Filter(attr("cqn"), True),
        "lqpn": Filter(_srq_has, True),
    },
}
for _table in FILTERS.values():
    _table.update(_COMMON)


def _address(addr: str | None) -> str | None:
    return None if addr is None else addr.rpartition(":")[0]


def _port(addr: str | None) -> int | None:
    return None if addr is None else int(addr.rpartition(":")[2])


def _matcher(key: str, spec: Filter, value: str) -> Callable[[Row], bool]:
    """An object matches when it has the field and its value is one of those given; an object
    without the field never matches (rdma: a pid filter leaves kernel objects out)."""
    if spec.number:
        ranges = _numbers(key, value)

        def number(row: Row) -> bool:
            got = spec.get(row)
            if got is None:
                return False
            spans = got if isinstance(got, list) else [(got, got)]
            return any(lo <= b and a <= hi for a, b in spans for lo, hi in ranges)

        return number
    words = {w.lower() for w in value.split(",") if w}

    def word(row: Row) -> bool:
        got = spec.get(row)
        return got is not None and str(got).lower() in words

    return word


# -- the command line ----------------------------------------------------------------------------


@dataclass
class Request:
    kind: str | None = None
    device: str | None = None
    port: int | None = None
    filters: tuple[Callable[[Row], bool], ...] = ()


_SELECTOR = re.compile(r"([^/\s]+)(?:/(\d+))?")


def _selector(word: str, kind: str | None) -> tuple[str, int | None]:
    m = _SELECTOR.fullmatch(word)
    if not m:
        raise UsageError(f"not a DEV or DEV/PORT: {word!r}", USAGE)
    if m.group(2) is not None and kind not in PER_PORT:
        what = f"{kind} objects belong" if kind else "the summary is per device"
        raise UsageError(f"{word}: {what} to a device, not a port", "give DEV; ports: qp and cm_id")
    return m.group(1), int(m.group(2)) if m.group(2) is not None else None


def parse_words(words: list[str]) -> Request:
    words = list(words)
    if words and words[0] == "show":
        words.pop(0)
    request = Request()
    if words and words[0] in OBJECTS:
        request.kind = words.pop(0)
    if request.kind is None:
        if len(words) > 1:
            raise UsageError(f"unexpected arguments: {' '.join(words[1:])}", USAGE)
        if words:
            request.device, request.port = _selector(words[0], None)
        return request
    valid = FILTERS[request.kind]
    # KEY VALUE pairs, after an optional DEV[/PORT]: an odd count means the selector is there.
    if len(words) % 2:
        if words[-1] in valid or words[-1] in ("dev", "link"):
            raise UsageError(f"{words[-1]} needs a value", USAGE)
        request.device, request.port = _selector(words.pop(0), request.kind)
    matchers = []
    for key, value in zip(words[::2], words[1::2]):
        if key in ("dev", "link"):  # rdma's spelling of the selector
            if request.device is not None:
                raise UsageError(f"{key} {value}: the device is already {request.device}")
            request.device, request.port = _selector(value, request.kind)
            continue
        if key not in valid:
            raise UsageError(
                f"{request.kind} has no filter {key!r}",
                f"filters of {request.kind}: {', '.join(sorted(valid))}",
            )
        matchers.append(_matcher(key, valid[key], value))
    request.filters = tuple(matchers)
    return request

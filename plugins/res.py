"""`ibtool res`: the objects the kernel's RDMA resource tracking knows (QPs, CM IDs, CQs, MRs,
PDs, user contexts, SRQs) with the process or kernel module holding each, over netlink; with no
object, how many of each every device has. Fields, words and filters as `rdma res show`."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ibtool import hookimpl, render
from ibtool.commands import Invocation
from ibtool.errors import NotFoundError, UsageError
from ibtool.model import Owner

OBJECTS = ("qp", "cm_id", "cq", "mr", "pd", "ctx", "srq")
PER_PORT = ("qp", "cm_id")  # the others belong to a device, not a port
USAGE = (
    "ibtool res [show] [DEV] | ibtool res [show] OBJECT [DEV[/PORT]] [KEY VALUE]... "
    "(OBJECT: qp, cm_id, cq, mr, pd, ctx, srq; KEY as rdma res show takes it, or comm)"
)


# -- who holds an object ------------------------------------------------------------------------


class Owners:
    """comm of each owner, each pid's read once per command."""

    def __init__(self, reader: Callable[[int], str | None]) -> None:
        self._reader = reader
        self._names: dict[int, str | None] = {}

    def comm(self, owner: Owner) -> str | None:
        if owner.pid is None:
            return owner.kern_name
        if owner.pid not in self._names:
            self._names[owner.pid] = self._reader(owner.pid)
        return self._names[owner.pid]


@dataclass(frozen=True)
class Row:
    """One object and its holder's name, as the output shows it."""

    record: Any
    comm: str | None

    @property
    def kernel(self) -> bool:
        return self.record.owner.pid is None and self.record.owner.kern_name is not None


# -- fields: rdma's JSON keys, in its order ------------------------------------------------------


def _r(name: str) -> Callable[[Row], Any]:
    return lambda row: getattr(row.record, name)


def _word(value) -> str:
    """An enum as rdma prints it: its name, UNKNOWN for a number rdma has no name for."""
    return value.label if hasattr(value, "label") else "UNKNOWN"


def _enum(name: str) -> Callable[[Row], Any]:
    def get(row: Row):
        value = getattr(row.record, name)
        return None if value is None else _word(value)

    return get


def _key(name: str) -> Callable[[Row], Any]:
    # rdma prints keys as hex without 0x in JSON, and with it in text.
    def get(row: Row):
        value = getattr(row.record, name)
        return None if value is None else f"{value:x}"

    return get


def _hex_text(value: str) -> str:
    return f"0x{value}"


HEAD = [
    render.Field("ifindex", _r("device_index"), in_text=False),
    render.Field("ifname", _r("device"), header="DEV"),
]
LINK = [*HEAD, render.Field("port", _r("port"), header="PORT")]
TAIL = [
    render.Field("pid", lambda row: row.record.owner.pid, header="PID"),
    render.Field("comm", lambda row: row.comm, header="COMM"),
]

QP_FIELDS = [
    *LINK,
    render.Field("lqpn", _r("lqpn"), header="LQPN"),
    render.Field("rqpn", _r("rqpn"), header="RQPN"),
    render.Field("type", _enum("type"), header="TYPE"),
    render.Field("state", _enum("state"), header="STATE"),
    render.Field("rq-psn", _r("rq_psn"), header="RQ-PSN"),
    render.Field("sq-psn", _r("sq_psn"), header="SQ-PSN"),
    render.Field("path-mig-state", _enum("path_mig_state"), header="PATH-MIG"),
    render.Field("pdn", _r("pdn"), header="PDN"),
    *TAIL,
]
CM_ID_FIELDS = [
    *LINK,
    render.Field("cm-idn", _r("cm_idn"), header="CM-IDN"),
    render.Field("lqpn", _r("lqpn"), header="LQPN"),
    render.Field("qp-type", _enum("qp_type"), header="QP-TYPE"),
    render.Field("state", _enum("state"), header="STATE"),
    render.Field("ps", lambda row: _ps(row.record.ps), header="PS"),
    *TAIL,
    render.Field("src-addr", _r("src_addr"), header="SRC-ADDR"),
    render.Field("dst-addr", _r("dst_addr"), header="DST-ADDR"),
]
CQ_FIELDS = [
    *HEAD,
    render.Field("cqn", _r("cqn"), header="CQN"),
    render.Field("cqe", _r("cqe"), header="CQE"),
    render.Field("users", _r("users"), header="USERS"),
    render.Field("poll-ctx", _enum("poll_ctx"), header="POLL-CTX"),
    render.Field(
        "adaptive-moderation",
        _r("adaptive_moderation"),
        header="DIM",
        text=lambda v: "on" if v else "off",
    ),
    render.Field("ctxn", _r("ctxn"), header="CTXN"),
    *TAIL,
]
MR_FIELDS = [
    *HEAD,
    render.Field("mrn", _r("mrn"), header="MRN"),
    render.Field("rkey", _key("rkey"), header="RKEY", text=_hex_text),
    render.Field("lkey", _key("lkey"), header="LKEY", text=_hex_text),
    render.Field("iova", _key("iova"), header="IOVA", text=_hex_text),
    render.Field("mrlen", _r("mrlen"), header="MRLEN"),
    render.Field("pdn", _r("pdn"), header="PDN"),
    *TAIL,
]
PD_FIELDS = [
    *HEAD,
    render.Field("pdn", _r("pdn"), header="PDN"),
    render.Field("local_dma_lkey", _key("local_dma_lkey"), header="LOCAL_DMA_LKEY", text=_hex_text),
    render.Field("users", _r("users"), header="USERS"),
    render.Field(
        "unsafe_global_rkey",
        _key("unsafe_global_rkey"),
        header="UNSAFE_GLOBAL_RKEY",
        text=_hex_text,
    ),
    render.Field("ctxn", _r("ctxn"), header="CTXN"),
    *TAIL,
]
CTX_FIELDS = [*HEAD, render.Field("ctxn", _r("ctxn"), header="CTXN"), *TAIL]
SRQ_FIELDS = [
    *HEAD,
    render.Field("srqn", _r("srqn"), header="SRQN"),
    render.Field("type", _enum("type"), header="TYPE"),
    render.Field(
        "lqpn", lambda row: _qpn_words(row.record.lqpns) or None, header="LQPN", text=",".join
    ),
    render.Field("pdn", _r("pdn"), header="PDN"),
    render.Field("cqn", _r("cqn"), header="CQN"),
    *TAIL,
]
FIELDS_OF = {
    "qp": QP_FIELDS,
    "cm_id": CM_ID_FIELDS,
    "cq": CQ_FIELDS,
    "mr": MR_FIELDS,
    "pd": PD_FIELDS,
    "ctx": CTX_FIELDS,
    "srq": SRQ_FIELDS,
}


def _count(name: str) -> render.Field:
    # A count the kernel does not give is unknown, never 0.
    return render.Field(name, lambda s: s[2].get(name), header=name.upper(), always=True)


SUMMARY_FIELDS = [
    render.Field("ifindex", lambda s: s[1], in_text=False),
    render.Field("ifname", lambda s: s[0], header="DEV"),
    # then one key per resource type the kernel counts, in its order (nldev.c fill_res_info)
    *(_count(name) for name in ("pd", "cq", "qp", "cm_id", "mr", "ctx", "srq")),
]
# Types the summary gained after the others, and from which release (nldev.c fill_res_info
# names "srq" since the change that added RDMA_NLDEV_CMD_RES_SRQ_GET).
COUNTED_SINCE = {"srq": ("SRQs are counted", "5.13")}


def _ps(value) -> str:
    # rdma prints "---" for a port space it has no name for
    return value.label if hasattr(value, "label") else "---"


def _qpn_words(ranges) -> list[str]:
    return [str(a) if a == b else f"{a}-{b}" for a, b in ranges]


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
        "lqpn": Filter(_r("lqpn"), True),
        "rqpn": Filter(_r("rqpn"), True),
        "sq-psn": Filter(_r("sq_psn"), True),
        "rq-psn": Filter(_r("rq_psn"), True),
        "pdn": Filter(_r("pdn"), True),
        "type": Filter(_enum("type"), False),
        "state": Filter(_enum("state"), False),
        "path-mig-state": Filter(_enum("path_mig_state"), False),
    },
    "cm_id": {
        "cm-idn": Filter(_r("cm_idn"), True),
        "lqpn": Filter(_r("lqpn"), True),
        "qp-type": Filter(_enum("qp_type"), False),
        "state": Filter(_enum("state"), False),
        "ps": Filter(lambda row: _ps(row.record.ps), False),
        "src-addr": Filter(lambda row: _address(row.record.src_addr), False),
        "src-port": Filter(lambda row: _port(row.record.src_addr), True),
        "dst-addr": Filter(lambda row: _address(row.record.dst_addr), False),
        "dst-port": Filter(lambda row: _port(row.record.dst_addr), True),
    },
    "cq": {
        "cqn": Filter(_r("cqn"), True),
        "users": Filter(_r("users"), True),
        "ctxn": Filter(_r("ctxn"), True),
        "poll-ctx": Filter(_enum("poll_ctx"), False),
    },
    "mr": {
        "mrn": Filter(_r("mrn"), True),
        "rkey": Filter(_r("rkey"), True),
        "lkey": Filter(_r("lkey"), True),
        "mrlen": Filter(_r("mrlen"), True),
        "pdn": Filter(_r("pdn"), True),
    },
    "pd": {
        "pdn": Filter(_r("pdn"), True),
        "users": Filter(_r("users"), True),
        "ctxn": Filter(_r("ctxn"), True),
    },
    "ctx": {"ctxn": Filter(_r("ctxn"), True)},
    "srq": {
        "srqn": Filter(_r("srqn"), True),
        "type": Filter(_enum("type"), False),
        "pdn": Filter(_r("pdn"), True),
        "cqn": Filter(_r("cqn"), True),
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


def _configure(parser) -> None:
    parser.add_argument("words", nargs="*", metavar="[show] [OBJECT] [DEV[/PORT]] [KEY VALUE]...")


# -- output -------------------------------------------------------------------------------------


def _json(row: Row, fields: Iterable[render.Field], details: bool) -> dict[str, Any]:
    # As rdma: a field the kernel did not send is left out, not null.
    out = {
        f.key: v for f in render.selected(list(fields), details) if (v := f.get(row)) is not None
    }
    if details:
        out.update({f"drv_{k}": v for k, v in row.record.driver.items()})
    return out


def _text_rows(rows: list[Row], fields, details: bool) -> list[str]:
    shown = [
        Row(r.record, f"[{r.comm}]" if r.kernel and r.comm is not None else r.comm) for r in rows
    ]
    columns = [f for f in fields if f.in_text and any(f.get(r) is not None for r in shown)]
    if details and any(r.record.driver for r in shown):
        columns.append(
            render.Field(
                "driver",
                lambda r: " ".join(f"{k} {v}" for k, v in r.record.driver.items()) or None,
                header="DRIVER",
            )
        )
    return render.table(shown, columns or list(fields[:2]), details)


def run(inv: Invocation) -> None:
    request = parse_words(inv.args.words)
    netlink = inv.host.netlink("ibtool res asks the running kernel over netlink")
    devices = netlink.devices(request.device)
    if request.port is not None:
        name, _, ports = devices[0]
        if not 1 <= request.port <= ports:
            raise NotFoundError(f"{name} has no port {request.port}", f"ports: 1-{ports}")
    if request.kind is None:
        return _show_summaries(inv, netlink.summaries(devices))
    objects = netlink.resources(
        request.kind,
        devices,
        request.port,
        inv.details,
        kernel_before_5_8=inv.host.kernel_before(5, 8),
    )
    owners = Owners(inv.host.comm)
    rows = [Row(o, owners.comm(o.owner)) for o in objects]
    rows = [r for r in rows if all(match(r) for match in request.filters)]
    fields = FIELDS_OF[request.kind]
    if inv.json:
        inv.emit_json([_json(r, fields, inv.details) for r in rows])
    elif rows:
        for line in _text_rows(rows, fields, inv.details):
            inv.print(line)


def _show_summaries(inv: Invocation, summaries) -> None:
    counted = list(dict.fromkeys(n for s in summaries for n in s[2]))
    # The types `res OBJECT` lists that this kernel does not count: unknown (null), not absent,
    # and said once on stderr.
    known = [f.key for f in SUMMARY_FIELDS[2:]]
    uncounted = [n for n in known if n not in counted] if summaries else []
    if uncounted:
        inv.warn(_uncounted(uncounted))
    fields = SUMMARY_FIELDS[:2] + [
        next((f for f in SUMMARY_FIELDS if f.key == n), None) or _count(n)
        for n in counted + uncounted
    ]
    if inv.json:
        inv.emit_json([render.record_json(s, fields, inv.details) for s in summaries])
    elif summaries:
        for line in render.table(summaries, [f for f in fields if f.in_text], inv.details):
            inv.print(line)


def _uncounted(names: list[str]) -> str:
    since = COUNTED_SINCE.get(names[0]) if len(names) == 1 else None
    said = f" ({since[0]} from Linux {since[1]})" if since else ""
    return (
        f"this kernel's RDMA_NLDEV_CMD_RES_GET does not count {', '.join(names)}{said}: "
        "shown as unknown"
    )


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "res",
        run,
        help="RDMA objects (QPs, CQs, MRs, PDs, CM IDs, contexts, SRQs) and who holds them",
        configure=_configure,
        aliases=("resource",),
    )

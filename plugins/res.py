"""`ibtool res`: the objects the kernel's RDMA resource tracking knows (QPs, CM IDs, CQs, MRs,
PDs, user contexts, SRQs) with the process or kernel module holding each, over netlink; with no
object, how many of each every device has. Fields, words and filters as `rdma res show`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ibtool.api import Invocation, NotFoundError, hookimpl, render

if TYPE_CHECKING:  # imported where `ibtool res` runs: no other command pays for its tables
    from ibtool.api.res import Row


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
    from ibtool.api.res import Row

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
    from ibtool.api.res import FIELDS_OF, Owners, Row, parse_words

    request = parse_words(inv.args.words)
    netlink = inv.host.netlink("ibtool res asks the running kernel over netlink")
    devices = netlink.devices(request.device)
    if request.port is not None:
        name, _, ports = devices[0]
        if not 1 <= request.port <= ports:
            raise NotFoundError(f"{name} has no port {request.port}", f"ports: 1-{ports}")
    if request.kind is None:
        return _show_summaries(inv, netlink.summaries(devices))
    objects = netlink.resources(request.kind, devices, request.port, inv.details)
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
    from ibtool.api.res import SUMMARY_FIELDS, count_field

    counted = list(dict.fromkeys(n for s in summaries for n in s[2]))
    # The types `res OBJECT` lists that this kernel does not count: unknown (null), not absent,
    # and said once on stderr.
    known = [f.key for f in SUMMARY_FIELDS[2:]]
    uncounted = [n for n in known if n not in counted] if summaries else []
    if uncounted:
        inv.warn(_uncounted(uncounted))
    fields = SUMMARY_FIELDS[:2] + [
        next((f for f in SUMMARY_FIELDS if f.key == n), None) or count_field(n)
        for n in counted + uncounted
    ]
    if inv.json:
        inv.emit_json([render.record_json(s, fields, inv.details) for s in summaries])
    elif summaries:
        for line in render.table(summaries, [f for f in fields if f.in_text], inv.details):
            inv.print(line)


def _uncounted(names: list[str]) -> str:
    from ibtool.api.res import COUNTED_SINCE

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

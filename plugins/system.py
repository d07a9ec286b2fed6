"""`ibtool system`: the kernel's system-wide RDMA settings, over netlink (SYS_GET)."""

from __future__ import annotations

from ibtool import hookimpl, render
from ibtool.commands import Invocation
from ibtool.errors import UsageError
from ibtool.model import RdmaSystem


def _on_off(value: bool) -> str:
    return "on" if value else "off"


# Keys and words as `rdma -j system show` spells them. A setting the kernel does not report
# (older kernels lack it) is null in JSON and left out of the text.
FIELDS = [
    render.Field("netns", lambda s: s.netns_mode.key if s.netns_mode is not None else None),
    render.Field("privileged-qkey", lambda s: s.privileged_qkey, text=_on_off),
    render.Field("monitor", lambda s: s.monitor, text=_on_off),
    render.Field("copy-on-fork", lambda s: s.copy_on_fork, text=_on_off),
]


def _configure(parser) -> None:
    parser.add_argument("words", nargs="*", metavar="show")


def read_system() -> RdmaSystem:
    from ibtool.sources.netlink import NldevClient, records

    with NldevClient() as nl:
        return records.rdma_system(nl.system())


def run(inv: Invocation) -> None:
    words = list(inv.args.words)
    if words and words[0] == "show":
        words.pop(0)
    if words:
        raise UsageError(f"unexpected arguments: {' '.join(words)}", "ibtool system [show]")
    if inv.root != "/":
        raise UsageError(
            "ibtool system asks the running kernel over netlink; --root trees hold only sysfs"
        )
    system = read_system()
    if inv.json:
        inv.emit_json(render.record_json(system, FIELDS, inv.details))
    else:
        inv.print(render.record_line(system, FIELDS, inv.details))


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "system",
        run,
        help="show the kernel's RDMA settings: netns mode, copy-on-fork, privileged QKEY",
        configure=_configure,
    )

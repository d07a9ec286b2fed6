"""`ibtool system`: the kernel's system-wide RDMA settings over netlink: show (SYS_GET) and
set (SYS_SET, which needs CAP_NET_ADMIN)."""

from __future__ import annotations

from ibtool import hookimpl, render
from ibtool.commands import Invocation
from ibtool.errors import UnsupportedError, UsageError
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


# What `system set NAME VALUE` may change: the SYS_SET attribute and the u8 for each value.
SETTINGS = {
    "netns": ("RDMA_NLDEV_SYS_ATTR_NETNS_MODE", {"shared": 1, "exclusive": 0}),
    "privileged-qkey": ("RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE", {"on": 1, "off": 0}),
}
USAGE = (
    "ibtool system [show] | ibtool system set { netns shared|exclusive | privileged-qkey on|off }"
)


def _configure(parser) -> None:
    parser.add_argument("words", nargs="*", metavar="show | set NAME VALUE")


def read_system() -> RdmaSystem:
    from ibtool.sources.netlink import NldevClient, records

    with NldevClient() as nl:
        return records.rdma_system(nl.system())


def change_setting(name: str, value: str) -> None:
    if name not in SETTINGS:
        raise UsageError(f"no system setting {name!r}", USAGE)
    attribute, values = SETTINGS[name]
    if value not in values:
        raise UsageError(f"{name} is one of {', '.join(values)}, not {value!r}", USAGE)
    from ibtool.sources.netlink import NldevClient

    with NldevClient() as nl:
        try:
            nl.set_system(attribute, values[value])
        except UnsupportedError as e:
            raise UnsupportedError(f"cannot set {name}: {e.message}", e.hint, errno=e.errno) from e


def run(inv: Invocation) -> None:
    words = list(inv.args.words)
    action = words.pop(0) if words and words[0] in ("show", "set") else "show"
    if action == "show" and words:
        raise UsageError(f"unexpected arguments: {' '.join(words)}", USAGE)
    if action == "set" and len(words) != 2:
        raise UsageError("system set takes a setting and its value", USAGE)
    if inv.root != "/":
        raise UsageError(
            "ibtool system asks the running kernel over netlink; --root trees hold only sysfs"
        )
    if action == "set":
        change_setting(*words)
        return
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
        help="the kernel's RDMA settings: netns mode, copy-on-fork, privileged QKEY",
        configure=_configure,
    )

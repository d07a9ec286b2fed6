"""`ibtool system`: the kernel's system-wide RDMA settings over netlink: show (SYS_GET) and
set (SYS_SET, which needs CAP_NET_ADMIN); with -d, also the RDMA netlink features the kernel
has, asked of it command by command."""

from __future__ import annotations

from ibtool.api import (
    Invocation,
    NoDevicesError,
    UsageError,
    hookimpl,
    render,
)


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


# What each setting is for, when the kernel lacks it.
SERVES = {"privileged-qkey": "the privileged QKEY mode is settable"}


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


# -d: one row per feature; in JSON, "features" maps each feature's key to these.
FEATURE_FIELDS = [
    render.Field("netlink", lambda f: f.netlink, header="FEATURE"),
    render.Field("supported", lambda f: f.supported, header="SUPPORTED", text=_yes_no, always=True),
    render.Field("since", lambda f: f.since, header="SINCE"),
    render.Field("note", lambda f: f.note, header="NOTE"),
]


def change_setting(netlink, name: str, value: str) -> None:
    if name not in SETTINGS:
        raise UsageError(f"no system setting {name!r}", USAGE)
    attribute, values = SETTINGS[name]
    if value not in values:
        raise UsageError(f"{name} is one of {', '.join(values)}, not {value!r}", USAGE)
    netlink.set_system(attribute, values[value], SERVES.get(name), name)


def run(inv: Invocation) -> None:
    words = list(inv.args.words)
    action = words.pop(0) if words and words[0] in ("show", "set") else "show"
    if action == "show" and words:
        raise UsageError(f"unexpected arguments: {' '.join(words)}", USAGE)
    if action == "set" and len(words) != 2:
        raise UsageError("system set takes a setting and its value", USAGE)
    what = "ibtool system asks the running kernel over netlink"
    if action == "set":
        inv.host.require_live(what)
        change_setting(inv.host.netlink(what), *words)
        return
    netlink = inv.host.netlink(what)
    system, features = netlink.system_features() if inv.details else (netlink.system(), None)
    if inv.json:
        out = render.record_json(system, FIELDS, inv.details)
        if features is not None:
            out["features"] = {f.key: render.record_json(f, FEATURE_FIELDS, True) for f in features}
        inv.emit_json(out)
        return
    inv.print(render.record_line(system, FIELDS, inv.details))
    if features is not None:
        inv.print()
        for line in render.table(features, FEATURE_FIELDS, True):
            inv.print(line)


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "system",
        run,
        help="the kernel's RDMA settings: netns mode, copy-on-fork, privileged QKEY; -d: the "
        "RDMA netlink features it has",
        configure=_configure,
    )


# -- health --------------------------------------------------------------------------------------

# The kinds of the findings that are not OK, for a program:
# no_devices           no RDMA device (the message says why: no class directory, empty, ...)
# not_captured         a capture without module state: loaded or not cannot be told
# module_not_loaded    a configured kernel module not loaded (nor built in)
# no_uverbs_device     an RDMA device without its uverbs device: user space cannot open it
# uverbs_node_missing  the uverbs device without its /dev/infiniband node (udev)


def check_system(ctx):
    """The RDMA stack is loaded (the configured modules, the uverbs ABI user space needs:
    NHC's "OFED" check), every RDMA device has its uverbs device. (The configured devices that are
    missing are the port check's: one result each, on captures too.)"""
    from ibtool.api import HealthResult, Status

    host, config = ctx.host, ctx.config
    try:
        names = host.device_names()
    except NoDevicesError as e:
        names = []
        yield HealthResult(Status.CRITICAL, "", e.message, kind="no_devices")
    if not host.stack_captured():
        # a --root tree or a snapshot that holds no module state: not the same as unloaded
        said = "modules and uverbs: not in this capture"
        yield HealthResult(Status.UNKNOWN, "", said, kind="not_captured")
        return
    loaded = True
    for module in config.modules:
        present, sign = host.module_loaded(module)
        if not present:
            loaded = False
            said = f"module not loaded (no /{sign}): modprobe {module}"
            yield HealthResult(Status.CRITICAL, module, said, kind="module_not_loaded")
    abi = host.uverbs_abi()
    uverbs = host.uverbs_devices()
    for name in names:
        if name not in uverbs:
            if abi is not None:
                said = "no uverbs device: user space cannot open it"
                yield HealthResult(Status.CRITICAL, name, said, kind="no_uverbs_device")
            continue
        if host.device_node_missing(uverbs[name]):
            said = f"/dev/infiniband/{uverbs[name]} missing (udev rules of rdma-core?)"
            yield HealthResult(Status.CRITICAL, name, said, kind="uverbs_node_missing")
    if names:
        parts = [f"{len(names)} RDMA device" + ("s" if len(names) != 1 else "")]
        if abi is not None:
            parts.append(f"uverbs ABI {abi}")
        if loaded and config.modules:
            parts.append("modules " + ",".join(config.modules))
        yield HealthResult(Status.OK, "", "; ".join(p for p in parts if p))


@hookimpl
def ibtool_health_checks(register):
    register("system", check_system)

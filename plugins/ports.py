"""`ibtool port` (alias `link`): state, rate, LIDs and netdev of every RDMA port; and, as
`rdma link add/delete` does, software RDMA devices (rxe, siw) created on a netdev and deleted
(NEWLINK, DELLINK over netlink)."""

from __future__ import annotations

import dataclasses

from ibtool import hookimpl
from ibtool.api import CheckContext, HealthResult, MetricFamily, Perfdata, Status
from ibtool.errors import CommandFailed, NoDevicesError, UsageError
from ibtool.host import PORT_SHOWN, Host
from ibtool.model.records import VL_CAP, Bond, LinkLayer, PhysState, PKey, Port, PortState
from ibtool.plugin.commands import Invocation, add_selector, selector
from ibtool.sources import links
from ibtool.views import render

# IB PortInfo CapabilityMask bit positions (sysfs cap_mask holds the low 32 bits).
PORT_CAP_FLAGS = {
    1: "SM",
    2: "NOTICE",
    3: "TRAP",
    4: "OPT_IPD",
    5: "AUTO_MIGR",
    6: "SL_MAP",
    7: "MKEY_NVRAM",
    8: "PKEY_NVRAM",
    9: "LED_INFO",
    10: "SM_DISABLED",
    11: "SYS_IMAGE_GUID",
    12: "PKEY_SW_EXT_PORT_TRAP",
    13: "CABLE_INFO",
    14: "EXTENDED_SPEEDS",
    15: "CAP_MASK2",
    16: "CM",
    17: "SNMP_TUNNEL",
    18: "REINIT",
    19: "DEVICE_MGMT",
    20: "VENDOR_CLASS",
    21: "DR_NOTICE",
    22: "CAP_MASK_NOTICE",
    23: "BOOT_MGMT",
    24: "LINK_LATENCY",
    25: "CLIENT_REG",
    26: "IP_BASED_GIDS",
    27: "LINK_SPEED_WIDTH",
    28: "VENDOR_SPECIFIC_MADS",
    29: "MULT_PKER_TRAP",
    30: "MULT_FDB",
    31: "HIERARCHY_INFO",
}


def _pkey_json(k: PKey) -> dict:
    return {
        "index": k.index,
        "pkey": f"0x{k.value:04x}" if k.value is not None else None,
        "membership": k.membership,
        "default": k.default,
    }


def _pkey_line(k: PKey) -> str:
    if k.value is None:
        return f"pkey index {k.index}: {render.UNKNOWN}"
    default = ", default partition" if k.default else ""
    return f"pkey index {k.index}: 0x{k.value:04x} {k.membership} member{default}"


def _sl2vl_text(table) -> str:
    return " ".join(f"{sl}:{render.UNKNOWN if vl is None else vl}" for sl, vl in enumerate(table))


def detail_lines(p: Port) -> list[str]:
    """What -d shows of a port under its line: the P_Key table (the populated slots; the empty
    ones counted), the VLs and the SL-to-VL mapping, automatic path migration."""
    lines = []
    if p.pkey_tbl_len is not None and p.pkeys is not None:
        slots = p.pkey_tbl_len
        empty = slots - len(p.pkeys)
        lines.append(f"pkeys {slots} slot{'s' * (slots != 1)}, {empty} empty")
        lines.extend(_pkey_line(k) for k in p.pkeys)
    if p.max_vl_num is not None:
        lines.append(f"max_vl_num {p.max_vl_num} ({VL_CAP.get(p.max_vl_num, 'reserved')})")
    if p.sl2vl is not None:
        lines.append(f"sl2vl {_sl2vl_text(p.sl2vl)}")
    if p.auto_path_mig is not None:
        lines.append(f"auto_path_mig {'yes' if p.auto_path_mig else 'no'}")
    return lines


def _sm_known(p: Port) -> bool:
    """An InfiniBand port with a link: its SM LID 0 is a fact (no subnet manager has swept
    it, so it stays INIT); down, or on Ethernet, there is no SM to name."""
    up = (PortState.INIT, PortState.ARMED, PortState.ACTIVE, PortState.ACTIVE_DEFER)
    return p.link_layer is LinkLayer.INFINIBAND and p.state in up


def _lids(p: Port) -> str | None:
    r = p.lid_range
    if r is None or r[0] == r[1]:
        return None
    return f"{r[0]}-{r[1]}"


def _bond_json(bond: Bond) -> dict:
    return {
        "mode": bond.mode,
        "active_slave": bond.active_slave,
        "slaves": [dataclasses.asdict(s) for s in bond.slaves],
    }


def _slave_text(s: dict, active: str | None) -> str:
    """A slave's name, with what an operator looks for: the one in use (modes with one active
    slave), one whose link is not up."""
    notes = ["active"] if s["name"] == active else []
    if s["mii_status"] is None:
        notes.append("unknown")
    elif s["mii_status"] != "up":
        notes.append(s["mii_status"])
    return s["name"] + (f"({','.join(notes)})" if notes else "")


def _bond_text(bond: dict) -> str:
    slaves = ",".join(_slave_text(s, bond["active_slave"]) for s in bond["slaves"]) or "none"
    return f"{bond['mode'] or render.UNKNOWN} slaves {slaves}"


FIELDS = [
    render.Field("ifname", lambda p: p.device, in_text=False),
    render.Field("port", lambda p: p.port, in_text=False),
    render.Field("state", lambda p: p.state.name if p.state is not None else None, always=True),
    render.Field(
        "physical_state",
        lambda p: p.physical_state.name if p.physical_state is not None else None,
        always=True,
    ),
    render.Field(
        "link_layer",
        lambda p: p.link_layer.label if p.link_layer is not None else None,
        always=True,
    ),
    render.Field("rate", lambda p: p.rate.text if p.rate else None, always=True),
    # Width and speed are inside the kernel's rate text already; JSON gives them as values.
    render.Field("rate_gbps", lambda p: p.rate.gbps if p.rate else None, in_text=False),
    render.Field("width", lambda p: p.rate.width if p.rate else None, in_text=False),
    render.Field("speed", lambda p: p.rate.speed if p.rate else None, in_text=False),
    render.Field("lid", lambda p: p.lid if p.lid else None),
    render.Field("lmc", lambda p: p.lmc if p.lid else None),
    render.Field(
        "lid_range",
        lambda p: list(p.lid_range) if _lids(p) else None,
        label="lids",
        text=lambda v: f"{v[0]}-{v[1]}",
    ),
    render.Field("sm_lid", lambda p: p.sm_lid if p.sm_lid or _sm_known(p) else None),
    render.Field("sm_sl", lambda p: p.sm_sl if p.sm_lid else None),
    render.Field("netdev", lambda p: p.netdev),
    render.Field("bond", lambda p: _bond_json(p.bond) if p.bond else None, text=_bond_text),
    render.Field("active_mtu", lambda p: p.active_mtu, details=True),
    render.Field("max_mtu", lambda p: p.max_mtu, details=True),
    render.Field("gid_tbl_len", lambda p: p.gid_tbl_len, details=True),
    render.Field("cap_mask", lambda p: p.cap_mask, details=True, text=lambda v: f"0x{v:08x}"),
    render.Field(
        "caps",
        lambda p: render.decode_flags(p.cap_mask, PORT_CAP_FLAGS) if p.cap_mask else None,
        details=True,
        text=",".join,
    ),
    # Shown in text by detail_lines, under the port's line.
    render.Field("pkey_tbl_len", lambda p: p.pkey_tbl_len, details=True, in_text=False),
    render.Field(
        "pkeys",
        lambda p: [_pkey_json(k) for k in p.pkeys] if p.pkeys is not None else None,
        details=True,
        in_text=False,
    ),
    render.Field("max_vl_num", lambda p: p.max_vl_num, details=True, in_text=False),
    render.Field(
        "vl_cap",
        lambda p: VL_CAP.get(p.max_vl_num) if p.max_vl_num is not None else None,
        details=True,
        in_text=False,
    ),
    render.Field(
        "sl2vl",
        lambda p: list(p.sl2vl) if p.sl2vl is not None else None,
        details=True,
        in_text=False,
    ),
    render.Field("auto_path_mig", lambda p: p.auto_path_mig, details=True, in_text=False),
]


LINK_USAGE = (
    "ibtool link [show] [DEV[/PORT]] | ibtool link add NAME type { rxe | siw } netdev NETDEV "
    "| ibtool link delete NAME"
)
IB_DEVICE_NAME_MAX = 64  # include/rdma/ib_verbs.h, with the terminating NUL


def _link_add(host: Host, words: list[str]) -> None:
    if not words:
        raise UsageError("link add takes NAME type TYPE netdev NETDEV", LINK_USAGE)
    name, rest = words[0], words[1:]
    options: dict[str, str] = {}
    while rest:
        key = rest.pop(0)
        if key not in ("type", "netdev") or not rest or key in options:
            raise UsageError(f"link add: unexpected {key!r}", LINK_USAGE)
        options[key] = rest.pop(0)
    if set(options) != {"type", "netdev"}:
        missing = " and ".join(k for k in ("type", "netdev") if k not in options)
        raise UsageError(f"link add {name}: {missing} missing", LINK_USAGE)
    # The kernel refuses '%' (a name pattern) and empty names; '/' cannot be a sysfs name.
    if not name or "%" in name or "/" in name or len(name.encode()) >= IB_DEVICE_NAME_MAX:
        raise UsageError(
            f"bad device name {name!r}",
            f"at most {IB_DEVICE_NAME_MAX - 1} bytes, without '%' or '/', e.g. rxe1",
        )
    links.add(host, name, options["type"], options["netdev"])


def _link_delete(host: Host, words: list[str]) -> None:
    if len(words) != 1:
        raise UsageError("link delete takes one device name", LINK_USAGE)
    links.delete(host, words[0])


def run(inv: Invocation) -> None:
    words = list(inv.args.words)
    if words and words[0] in ("add", "delete"):
        (_link_add if words[0] == "add" else _link_delete)(inv.host, words[1:])
        return
    ports = inv.host.ports(selector(inv.args))
    if inv.json:
        rows = [render.record_json(p, FIELDS, inv.details) for p in ports]
        if inv.details:  # where each field came from: netlink, sysfs or verbs
            for row, p in zip(rows, ports):
                row["sources"] = p.sources
        inv.emit_json(rows)
        return
    for p in ports:
        inv.print(f"{p.device}/{p.port}: {render.record_line(p, FIELDS, inv.details)}")
        if inv.details:
            for line in detail_lines(p):
                inv.print(f"    {line}")


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "port",
        run,
        help="show RDMA ports: state, rate, LIDs, netdev; add or delete rxe/siw links",
        configure=add_selector,
        aliases=("link",),
    )


# -- health and metrics --------------------------------------------------------------------------


def _rate(gbps: float, width: str | None = None) -> str:
    return f"{gbps:g} Gb/s" + (f" {width}" if width else "")


def _port_state(p: Port) -> tuple[Status, str] | None:
    """CRITICAL unless ACTIVE with the physical link up; None when it is."""
    if p.state is None or p.physical_state is None:
        return Status.UNKNOWN, "state unreadable"
    phys = p.physical_state.name
    if p.state != PortState.ACTIVE:
        why = f"state {p.state.name} (physical_state {phys})"
        if p.state == PortState.INIT and p.link_layer == LinkLayer.INFINIBAND:
            why += ": no subnet manager has brought it up"
        elif p.physical_state == PhysState.DISABLED and p.link_layer == LinkLayer.INFINIBAND:
            # PortPhysicalState 3, Disabled, is set by management (IBTA vol. 1, PortInfo;
            # `ibportstate LID PORT disable`, or the subnet manager): the port does not even
            # try to train, so no cable is to blame. On a RoCE port the drivers report it for
            # a netdev that is down (rxe_query_port, mlx5_query_port_roce): said below.
            why += ": disabled by management (the subnet manager or ibportstate), not a cable fault"
        elif p.physical_state in (PhysState.DISABLED, PhysState.POLLING):
            why += ": no link (cable, peer port or netdev down)"
        return Status.CRITICAL, why
    if p.physical_state != PhysState.LINK_UP:
        return Status.CRITICAL, f"physical_state {phys} while ACTIVE"
    return None


def _trained_down(p: Port, expect, best: float | None) -> str | None:
    """Why the rate is below what it should be: the configured rate and width, else the best
    this port has had."""
    if p.rate is None:
        return None
    now = _rate(p.rate.gbps, p.rate.width)
    if expect.rate is not None and p.rate.gbps < expect.rate:
        return f"rate {now} below the configured {_rate(expect.rate)}"
    if expect.width is not None and p.rate.width and p.rate.width != expect.width:
        return f"width {p.rate.width}, configured {expect.width}: trained down ({now})"
    if expect.rate is None and expect.width is None and best and p.rate.gbps < best:
        return f"trained down: {now}, it had {_rate(best)}"
    return None


def _seen(p: Port) -> dict:
    return {
        "state": p.state.name if p.state is not None else None,
        "physical_state": p.physical_state.name if p.physical_state is not None else None,
        "lid": p.lid,
        "sm_lid": p.sm_lid,
        "netdev": p.netdev,
    }


def _was(before: dict, p: Port) -> Port | None:
    """The port as the last run saw it, for the change engine."""
    try:
        return dataclasses.replace(
            p,
            state=PortState[before["state"]] if before.get("state") else None,
            physical_state=(
                PhysState[before["physical_state"]] if before.get("physical_state") else None
            ),
            lid=before.get("lid"),
            sm_lid=before.get("sm_lid"),
            lmc=p.lmc,
            netdev=before.get("netdev"),
        )
    except (KeyError, TypeError):
        return None


class _PortCheck:
    """One run of the port check: the ports, their GIDs (read once per device), and what the
    last run kept of each port."""

    def __init__(self, ctx: CheckContext):
        self.ctx, self.host = ctx, ctx.host
        previous = ctx.previous if isinstance(ctx.previous, dict) else {}
        before = previous.get("ports")
        self.before = before if isinstance(before, dict) else {}
        self.ports = self.host.ports(fields=PORT_SHOWN)
        self.by_key = {(p.device, p.port): p for p in self.ports}
        self._gids: dict[str, list] | None = None
        self.kept: dict[str, dict] = {}

    def gids_of(self, device: str | None = None) -> list:
        """The GIDs of `device` (default: every device's), every table read once, in one pass
        over the devices (a listing per device costs O(devices^2) on a host of 500 VFs)."""
        if self._gids is None:
            self._gids = {}
            for g in self.host.gids():
                self._gids.setdefault(g.device, []).append(g)
        if device is None:
            return [g for gids in self._gids.values() for g in gids]
        return self._gids.get(device, [])

    def roce_gid(self, target: str, device: str | None = None):
        """The RoCE v2 GID of a netdev or address, on `device` or any (CommandFailed saying
        why there is none)."""
        from ibtool.model.gidrule import best_gid

        return best_gid(self.gids_of(device), self.by_key, self.host.vlans(), target)

    def live(self, p: Port, expect, best: float | None) -> list[tuple[Status, str]]:
        """What is wrong with an ACTIVE port: its rate, its LIDs, its RoCE GID."""
        findings = []
        slow = _trained_down(p, expect, best)
        if slow:
            findings.append((Status.WARNING, slow))
        if p.link_layer == LinkLayer.INFINIBAND:
            if not p.lid:
                findings.append((Status.CRITICAL, "no LID assigned: is a subnet manager up?"))
            if not p.sm_lid:
                findings.append((Status.CRITICAL, "no subnet manager LID"))
        if p.link_layer == LinkLayer.ETHERNET and p.netdev and not self.host.is_iwarp(p.device):
            try:
                self.roce_gid(p.netdev, p.device)
            except CommandFailed as e:
                findings.append((Status.WARNING, f"{e.message} ({e.hint})"))
        return findings

    def carrier_flap(self, p: Port, was: dict, entry: dict) -> str | None:
        """A RoCE netdev whose carrier moved between two runs that both saw the port ACTIVE:
        it went down and came back (a run that saw the port down already said so)."""
        changes = self.host.carrier_changes(p.netdev)
        entry["carrier_changes"] = changes
        old = was.get("carrier_changes")
        if (
            self.ctx.same_boot
            and changes is not None
            and isinstance(old, int)
            and was.get("netdev") == p.netdev
            and was.get("state") == "ACTIVE"
            and p.state == PortState.ACTIVE
            and changes > old
        ):
            return (
                f"link flapped: {p.netdev} carrier changed {changes - old} times since the last run"
            )
        return None

    def since_last_run(self, p: Port, was: dict) -> tuple[list[tuple[Status, str]], list[str]]:
        """The change engine's events between the port at the last run and now: a LID the
        subnet manager moved (WARNING), a port up again (a note)."""
        from ibtool.model.events import Seen, diff

        then = _was(was, p) if was and self.ctx.same_boot else None
        if then is None:
            return [], []
        key = (p.device, p.port)
        findings, notes = [], []
        for event in diff(Seen({}, {key: then}), Seen({}, {key: p}), "health", devices=False):
            # a LID the subnet manager moved, not one a port that came up was given
            moved = [(k, old, new) for k, old, new in event.changes if old and new]
            if event.event == "lid" and p.state == PortState.ACTIVE and moved:
                text = ", ".join(f"{k} {new} (was {old})" for k, old, new in moved)
                findings.append((Status.WARNING, f"{text} since the last run"))
            elif event.event == "port_state" and p.state == PortState.ACTIVE:
                notes.append(f"up again (was {event.before('state')} at the last run)")
        return findings, notes

    def port(self, p: Port):
        subject = f"{p.device}/{p.port}"
        expect = self.ctx.config.expect(p.device, p.port)
        if expect.ignore:
            return
        was = self.before.get(subject) if isinstance(self.before.get(subject), dict) else {}
        best = was.get("best_gbps") if isinstance(was.get("best_gbps"), (int, float)) else None
        if p.state == PortState.ACTIVE and p.rate is not None:
            best = max(best or 0, p.rate.gbps)
        entry = self.kept[subject] = {**_seen(p), "best_gbps": best}
        bad_state = _port_state(p)
        findings = [bad_state] if bad_state else self.live(p, expect, best)
        if p.link_layer == LinkLayer.ETHERNET and p.netdev:
            flap = self.carrier_flap(p, was, entry)
            if flap:
                findings.append((Status.WARNING, flap))
        moved, notes = self.since_last_run(p, was)
        findings += moved
        perfdata = (Perfdata(f"{subject} rate Gb/s", p.rate.gbps, min=0),) if p.rate else ()
        for status, text in findings:
            yield HealthResult(status, subject, text, perfdata)
            perfdata = ()
        if not findings:
            summary = f"ACTIVE {_rate(p.rate.gbps, p.rate.width) if p.rate else 'rate unknown'}"
            if p.link_layer == LinkLayer.INFINIBAND:
                summary += f" lid {p.lid} sm_lid {p.sm_lid}"
            elif p.netdev:
                summary += f" netdev {p.netdev}"
            yield HealthResult(Status.OK, subject, "; ".join([summary, *notes]), perfdata)

    def configured(self):
        """The devices, ports and RoCE netdevs or addresses the configuration names."""
        if self.ctx.config.devices:
            try:
                present = set(self.host.device_names())
            except NoDevicesError:
                present = set()
            for device in self.ctx.config.devices:
                if device not in present:
                    yield HealthResult(Status.CRITICAL, device, f"expected device {device} missing")
        for key, expect in self.ctx.config.ports.items():
            if "/" in key and not expect.ignore:
                device, _, number = key.partition("/")
                if (device, int(number)) not in self.by_key:
                    yield HealthResult(Status.CRITICAL, key, "configured port not present")
        for target in self.ctx.config.netdevs:
            try:
                g = self.roce_gid(target)
            except CommandFailed as e:
                yield HealthResult(Status.CRITICAL, target, f"{e.message} ({e.hint})")
                continue
            where = f"{g.device}/{g.port} ({g.netdev})"
            yield HealthResult(Status.OK, target, f"RoCE v2 GID index {g.index} on {where}")


def check_ports(ctx: CheckContext):
    """Every port ACTIVE with its link up at the rate it should have; an IB port with a LID
    and a subnet manager; a RoCE port with a RoCE v2 GID on its netdev; no carrier flap of
    its netdev since the last run; the configured devices, ports and RoCE netdevs present."""
    check = _PortCheck(ctx)
    for p in check.ports:
        yield from check.port(p)
    yield from check.configured()
    ctx.keep({"ports": check.kept})


def port_metrics(host: Host):
    labels_of = lambda p: {"device": p.device, "port": str(p.port)}  # noqa: E731
    state = MetricFamily("ibtool_port_state_id", "Port state (IBTA: 1 DOWN .. 4 ACTIVE)", "gauge")
    phys = MetricFamily(
        "ibtool_port_physical_state_id", "Physical port state (IBTA: 5 LinkUp)", "gauge"
    )
    rate = MetricFamily("ibtool_port_rate", "Port signalling rate", "gauge", "bytes_per_second")
    lid = MetricFamily("ibtool_port_lid", "LID of an InfiniBand port (0: none)", "gauge")
    info = MetricFamily("ibtool_port_info", "Port link layer and netdev (value 1)", "gauge")
    for p in host.ports(fields=PORT_SHOWN):
        labels = labels_of(p)
        if p.state is not None:
            state.add(labels, int(p.state))
        if p.physical_state is not None:
            phys.add(labels, int(p.physical_state))
        if p.rate is not None:
            rate.add(labels, p.rate.gbps * 1e9 / 8)
        if p.link_layer == LinkLayer.INFINIBAND and p.lid is not None:
            lid.add(labels, p.lid)
        link_layer = p.link_layer.label if p.link_layer is not None else ""
        info.add({**labels, "link_layer": link_layer, "netdev": p.netdev or ""}, 1)
    return [state, phys, rate, lid, info]


@hookimpl
def ibtool_health_checks(register):
    register("port", check_ports)


@hookimpl
def ibtool_metrics(register):
    register("port", port_metrics)

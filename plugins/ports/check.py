"""The port health check: every port ACTIVE with its link up at the rate it should have, with
its LIDs (InfiniBand) or its RoCE v2 GID (RoCE); no carrier flap or LID move since the last
run; the configured devices, ports and RoCE netdevs present."""

from __future__ import annotations

import dataclasses

from ibtool.api import (
    PORT_SHOWN,
    CheckContext,
    CommandFailed,
    HealthResult,
    LinkLayer,
    NoDevicesError,
    Perfdata,
    PhysState,
    Port,
    PortState,
    Status,
)

# The kinds of the findings that are not OK, for a program (the dashboard acts on the first two):
# link_degraded          ACTIVE at a rate below the best this port has had
# link_below_configured  ACTIVE at a rate or width other than the configured one
# state_unknown          state or physical state unreadable
# port_down              not ACTIVE: no link (cable, peer port or netdev down), or not brought up
# port_no_sm             InfiniBand, INIT: trained, but no subnet manager has brought it up
# port_disabled          InfiniBand, physical state Disabled: by management, not a cable fault
# physical_link_down     ACTIVE, but the physical state is not LinkUp
# no_lid, no_sm_lid      an ACTIVE InfiniBand port without a LID, without a subnet manager LID
# no_roce_gid            a RoCE netdev or address (a port's or a configured one) without a
#                        usable RoCE v2 GID
# link_flapped           the link went down and up since the last run (its netdev's carrier moved)
# lid_moved              the subnet manager gave the port another LID (or SM LID) since the last run
# device_missing, port_missing  a configured device or port not present


def _rate(gbps: float, width: str | None = None) -> str:
    return f"{gbps:g} Gb/s" + (f" {width}" if width else "")


def _port_state(p: Port) -> tuple[Status, str, str] | None:
    """(status, summary, kind): CRITICAL unless ACTIVE with the physical link up; None when it
    is."""
    if p.state is None or p.physical_state is None:
        return Status.UNKNOWN, "state unreadable", "state_unknown"
    phys = p.physical_state.name
    if p.state != PortState.ACTIVE:
        why, kind = f"state {p.state.name} (physical_state {phys})", "port_down"
        if p.state == PortState.INIT and p.link_layer == LinkLayer.INFINIBAND:
            why, kind = why + ": no subnet manager has brought it up", "port_no_sm"
        elif p.physical_state == PhysState.DISABLED and p.link_layer == LinkLayer.INFINIBAND:
            # PortPhysicalState 3, Disabled, is set by management (IBTA vol. 1, PortInfo;
            # `ibportstate LID PORT disable`, or the subnet manager): the port does not even
            # try to train, so no cable is to blame. On a RoCE port the drivers report it for
            # a netdev that is down (rxe_query_port, mlx5_query_port_roce): said below.
            why += ": disabled by management (the subnet manager or ibportstate), not a cable fault"
            kind = "port_disabled"
        elif p.physical_state in (PhysState.DISABLED, PhysState.POLLING):
            why += ": no link (cable, peer port or netdev down)"
        return Status.CRITICAL, why, kind
    if p.physical_state != PhysState.LINK_UP:
        return Status.CRITICAL, f"physical_state {phys} while ACTIVE", "physical_link_down"
    return None


def _trained_down(p: Port, expect, best: float | None) -> tuple[str, str] | None:
    """(summary, kind): why the rate is below what it should be: the configured rate and width,
    else the best this port has had."""
    if p.rate is None:
        return None
    now = _rate(p.rate.gbps, p.rate.width)
    if expect.rate is not None and p.rate.gbps < expect.rate:
        return f"rate {now} below the configured {_rate(expect.rate)}", "link_below_configured"
    if expect.width is not None and p.rate.width and p.rate.width != expect.width:
        said = f"width {p.rate.width}, configured {expect.width}: trained down ({now})"
        return said, "link_below_configured"
    if expect.rate is None and expect.width is None and best and p.rate.gbps < best:
        return f"trained down: {now}, it had {_rate(best)}", "link_degraded"
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


class PortCheck:
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
        from ibtool.api import best_gid

        return best_gid(self.gids_of(device), self.by_key, self.host.vlans(), target)

    def live(self, p: Port, expect, best: float | None) -> list[tuple[Status, str, str]]:
        """(status, summary, kind) of what is wrong with an ACTIVE port: its rate, its LIDs, its
        RoCE GID."""
        findings = []
        slow = _trained_down(p, expect, best)
        if slow:
            findings.append((Status.WARNING, *slow))
        if p.link_layer == LinkLayer.INFINIBAND:
            if not p.lid:
                said = "no LID assigned: is a subnet manager up?"
                findings.append((Status.CRITICAL, said, "no_lid"))
            if not p.sm_lid:
                findings.append((Status.CRITICAL, "no subnet manager LID", "no_sm_lid"))
        if p.link_layer == LinkLayer.ETHERNET and p.netdev and not self.host.is_iwarp(p.device):
            try:
                self.roce_gid(p.netdev, p.device)
            except CommandFailed as e:
                findings.append((Status.WARNING, f"{e.message} ({e.hint})", "no_roce_gid"))
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

    def since_last_run(self, p: Port, was: dict) -> tuple[list[tuple[Status, str, str]], list[str]]:
        """The change engine's events between the port at the last run and now: a LID the
        subnet manager moved (WARNING), a port up again (a note)."""
        from ibtool.api.events import Seen, diff

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
                findings.append((Status.WARNING, f"{text} since the last run", "lid_moved"))
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
                findings.append((Status.WARNING, flap, "link_flapped"))
        moved, notes = self.since_last_run(p, was)
        findings += moved
        perfdata = (Perfdata(f"{subject} rate Gb/s", p.rate.gbps, min=0),) if p.rate else ()
        for status, text, kind in findings:
            yield HealthResult(status, subject, text, perfdata, kind=kind)
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
                    said = f"expected device {device} missing"
                    yield HealthResult(Status.CRITICAL, device, said, kind="device_missing")
        for key, expect in self.ctx.config.ports.items():
            if "/" in key and not expect.ignore:
                device, _, number = key.partition("/")
                if (device, int(number)) not in self.by_key:
                    said = "configured port not present"
                    yield HealthResult(Status.CRITICAL, key, said, kind="port_missing")
        for target in self.ctx.config.netdevs:
            try:
                g = self.roce_gid(target)
            except CommandFailed as e:
                said = f"{e.message} ({e.hint})"
                yield HealthResult(Status.CRITICAL, target, said, kind="no_roce_gid")
                continue
            where = f"{g.device}/{g.port} ({g.netdev})"
            yield HealthResult(Status.OK, target, f"RoCE v2 GID index {g.index} on {where}")


def run(ctx: CheckContext):
    """The findings of one run of the check, and what it keeps for the next."""
    check = PortCheck(ctx)
    for p in check.ports:
        yield from check.port(p)
    yield from check.configured()
    ctx.keep({"ports": check.kept})

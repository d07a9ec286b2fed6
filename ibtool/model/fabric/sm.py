"""The subnet managers as their SMInfo answers, and what is wrong with them: `ibtool fabric
sm`."""

from __future__ import annotations

import enum

from ibtool.model.deferred import dataclass
from ibtool.model.fabric.records import FabricNode
from ibtool.model.health import Status


class SmState(enum.IntEnum):
    """SMInfo.SMState (IBTA 14.2.5.13)."""

    NOT_ACTIVE = 0
    DISCOVERING = 1
    STANDBY = 2
    MASTER = 3


@dataclass(frozen=True)
class SubnetManager:
    """One SM as its SMInfo answers, and the node and port it runs behind."""

    node: FabricNode
    port: int
    lid: int
    guid: int  # SMInfo.GUID: the SM's port GUID
    priority: int
    state: SmState | None
    activity: int  # SMInfo.ActCount at the first read


@dataclass(frozen=True)
class SmScan:
    """The SMs of a subnet as their SMInfo answered: those that did (`sms`), those whose port
    says one runs and did not (`silent`: node, port, LID), this port's SM LID, and how much
    the master's activity count moved over `waited` seconds (None: not read again)."""

    sms: list[SubnetManager]
    silent: list[tuple[FabricNode, int, int]]
    local_sm_lid: int
    moved: int | None
    waited: float


@dataclass(frozen=True)
class SmFinding:
    status: Status
    kind: str  # no_master, two_masters, master_idle, sm_lid_wrong, standby_outranks, sm_silent
    what: str
    fix: str


def judge_sms(
    sms: list[SubnetManager],
    silent: list[tuple[FabricNode, int, int]],
    local_sm_lid: int,
    moved: int | None,
    waited: float,
) -> list[SmFinding]:
    """The SMs as an operator needs them: one master (none, or two, is CRITICAL); the master's
    activity count moving (`moved`: how much it grew over `waited` seconds; None: not read
    again); this port's SM LID naming the master; a standby that outranks the master (it
    should have taken over); an SM that did not answer its SMInfo."""
    found = []
    masters = [s for s in sms if s.state == SmState.MASTER]
    if not masters:
        found.append(SmFinding(
            Status.CRITICAL, "no_master",
            f"no master subnet manager ({len(sms) + len(silent)} SM "
            f"port{'s' if len(sms) + len(silent) != 1 else ''} seen, {len(sms)} answering)",
            "start one (systemctl start opensm, or the switch's or UFM's SM); without it no "
            "port leaves INIT and no route changes after a fault",
        ))  # fmt: skip
    elif len(masters) > 1:
        names = ", ".join(f"{s.node.description}/{s.port} (LID {s.lid})" for s in masters)
        found.append(SmFinding(
            Status.CRITICAL, "two_masters", f"{len(masters)} masters: {names}",
            "two SMs that do not see each other (a split subnet, or different SM keys): keep "
            "one, or give them one SM_Key so that they negotiate",
        ))  # fmt: skip
    if len(masters) == 1:
        master = masters[0]
        where = f"{master.node.description}/{master.port} (LID {master.lid})"
        if moved == 0:
            found.append(SmFinding(
                Status.CRITICAL, "master_idle",
                f"the master {where} kept its activity count at {master.activity} for "
                f"{waited:g} s",
                "its SM is hung or stopped sweeping: restart it (a standby takes over only "
                "when the master stops answering)",
            ))  # fmt: skip
        if local_sm_lid and local_sm_lid != master.lid:
            found.append(SmFinding(
                Status.CRITICAL, "sm_lid_wrong",
                f"this port's SM LID is {local_sm_lid}, not the master's {master.lid}",
                "the port has not heard from the master since it took over: its traps go "
                "nowhere; the master's next sweep sets it (or bounce the port)",
            ))  # fmt: skip
        for s in sms:
            if s.state == SmState.STANDBY and s.priority > master.priority:
                found.append(SmFinding(
                    Status.WARNING, "standby_outranks",
                    f"standby {s.node.description}/{s.port} (LID {s.lid}) has priority "
                    f"{s.priority}, above the master's {master.priority}",
                    "it should have taken over: check both SMs' sm_priority and that the "
                    "master honours handover",
                ))  # fmt: skip
    for node, port, lid in silent:
        found.append(SmFinding(
            Status.WARNING, "sm_silent",
            f"{node.description}/{port} (LID {lid}) says an SM runs behind it, and its "
            "SMInfo did not answer",
            "an SM starting or stopping, or hung: look at it there",
        ))  # fmt: skip
    return found

"""`ibtool dev`: one line per RDMA device, from sysfs; -d merges netlink in (with the source of
each field under -j) and adds capabilities through verbs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibtool.api import Invocation, add_selector, hookimpl, render, selector

if TYPE_CHECKING:
    from ibtool.api import Device


def _protocol(v: str) -> str:
    from ibtool.api import Protocol  # where `dev` runs: the records are no other command's cost

    return Protocol(v).label


FIELDS = [
    render.Field("ifname", lambda d: d.name, label="", text=lambda v: f"{v}:"),
    render.Field("node_type", lambda d: d.node_type.key if d.node_type else None, always=True),
    render.Field(
        "protocol",
        lambda d: d.protocol.value if d.protocol else None,
        text=_protocol,
        always=True,
    ),
    render.Field("fw", lambda d: d.fw_ver),
    render.Field("node_guid", lambda d: d.node_guid, always=True),
    render.Field("sys_image_guid", lambda d: d.sys_image_guid),
    render.Field("hca_type", lambda d: d.hca_type),
    render.Field("board_id", lambda d: d.board_id),
    render.Field("ports", lambda d: d.port_count),
    render.Field("netdevs", lambda d: list(d.netdevs), label="netdev", text=",".join),
    render.Field("node_desc", lambda d: d.node_desc, details=True, text=repr),
    render.Field("hw_rev", lambda d: d.hw_rev, details=True),
    render.Field("driver", lambda d: d.driver, details=True),
    render.Field("parent", lambda d: d.parent, details=True),
]


# Model field -> JSON key, where they differ.
JSON_KEYS = {"fw_ver": "fw", "port_count": "ports"}


def _sources(d: Device) -> dict[str, str] | None:
    """Where each field came from (-d -j): netlink where it answers, else sysfs; caps: verbs."""
    if d.sources is None:
        return None
    return {JSON_KEYS.get(k, k): v for k, v in d.sources.items()}


def _caps_lines(caps: dict) -> list[str]:
    flags = caps.get("device_cap_flags") or []
    scalars = " ".join(f"{k} {v}" for k, v in caps.items() if k != "device_cap_flags")
    return [f"    {scalars}", f"    caps {','.join(flags) or 'none'}"]


def run(inv: Invocation) -> None:
    devices: list[Device] = inv.host.devices(selector(inv.args))
    caps = {d.name: inv.host.device_caps(d.name) for d in devices} if inv.details else {}
    if inv.json:
        rows = []
        for d in devices:
            row = render.record_json(d, FIELDS, inv.details)
            if inv.details:
                row["caps"] = caps.get(d.name)
                row["sources"] = _sources(d)
            rows.append(row)
        inv.emit_json(rows)
        return
    for d in devices:
        inv.print(render.record_line(d, FIELDS, inv.details))
        if caps.get(d.name):
            for line in _caps_lines(caps[d.name]):
                inv.print(line)


@hookimpl
def ibtool_register_commands(cli):
    cli.add("dev", run, help="show RDMA devices", configure=add_selector, aliases=("device",))

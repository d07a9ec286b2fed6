"""The model: what ibtool knows, as plain frozen records and pure functions over them.

    records   devices, ports, GIDs, P_Keys, counters, resources, the enums of the uapi
    counters  what each counter means: its width, unit, kind, the IBTA/driver description
    rates     rates from two samples: widths, wraps and resets handled once
    gidrule   which GID index to use for an address, VLAN and RoCE version
    events    changes between two moments (Seen) as Events
    health    a check's findings: Status, Perfdata, HealthResult (with a machine kind)
    names     how device and netdev names sort; a peer's text made printable
    doctor    one end's facts (validated when a peer sends them) and the checklist verdicts
    fabric    the InfiniBand subnet: nodes, links, counters, SMs, routes, and their verdicts

May import ibtool.errors and ibtool.argtypes only: everything else stands on it.
"""

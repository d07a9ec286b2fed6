"""RDMA netlink (NETLINK_RDMA, the NLDEV client): what the kernel itself says about devices,
ports, resources, counters and system settings.

    with NldevClient() as nl:                  # blocking
        system = records.rdma_system(nl.system())
    async with AsyncNldevClient() as nl:       # inside a running asyncio loop
        devices = [records.device(r) for r in await nl.devices()]

Replies are {uapi attribute name: Python value} dicts (nests are dicts, tables lists);
`records` turns them into model records. No pyroute2 object leaves this package, and pyroute2
is imported only when a client or the message codec is first used: `attrs`, `errors` and
`records` are cheap.

    attrs     the commands and the one attribute table (ids, uapi names, kinds)
    messages  pyroute2 message classes and Marshal built from it; encode, strict decode
    client    the request/reply exchange, the socket, NldevClient and AsyncNldevClient
    errors    socket and kernel errors as ibtool errors
    records   replies as Device, Port, RdmaSystem, CounterSample and the resource records
    monitor   the kernel's monitor events as ibtool.model Events
    session   one run's netlink client, opened on first use, with the kernel's features
    merging   netlink's answers merged with sysfs', each field with its source

May import ibtool.sources.sysfs, ibtool.model, ibtool.errors; never the Host or above.
"""

from __future__ import annotations

_CLIENT = ("NldevClient", "AsyncNldevClient", "open_socket")


def __getattr__(name: str):
    if name in _CLIENT:
        from ibtool.sources.netlink import client

        return getattr(client, name)
    raise AttributeError(name)

"""Live: the one engine that polls a host (records, counter samples, checks and their state)
and the loops of the faces it feeds: the dashboard's feed, the exporter, monitor's watch.

    engine    the Engine, one Reading per poll; Hosts: where each poll's host comes from
    feed      the dashboard's face: frames for the panels
    exporter  the exporter's face: metric families, and the HTTP endpoint serving them
    watch     monitor's face: device and port changes, polled and from the kernel's events

May import ibtool.health, ibtool.plugin, ibtool.snapshot, ibtool.host, ibtool.web, ibtool.views,
ibtool.model, ibtool.errors and ibtool.argtypes; never ibtool.tui or ibtool.api (the dashboard
imports this, not the reverse), nor ibtool.sources (the Host reads them).
"""

"""Live: the one engine that polls a host (records, counter samples, checks and their state)
and the loops of the faces it feeds: the dashboard's feed, the exporter, monitor's watch.

May import ibtool.health, ibtool.plugin, ibtool.web and below; never ibtool.tui or
ibtool.api (the dashboard imports this, not the reverse).
"""

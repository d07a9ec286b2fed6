"""The dashboard's screens beside the overview: a port's detail, the loopback test, help.

May import ibtool.tui's widgets, format and messages, and ibtool.live and below; never
ibtool.api or a plugin.
"""

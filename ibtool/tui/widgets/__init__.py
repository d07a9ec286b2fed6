"""The dashboard's widgets, one per module.

May import ibtool.tui.format and ibtool.live and below; never a screen, ibtool.api or a
plugin.
"""

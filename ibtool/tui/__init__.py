"""`ibtool tui`: the live dashboard (Textual). Imported by that command only: no headless
command pays for textual and rich.

May import ibtool.live and below (the engine's frames are what it shows); never ibtool.api, a
plugin or the data path (the tui plugin hands it the function that runs a loopback).
"""

"""`ibtool tui`: the live dashboard (Textual). Imported by that command only: no headless
command pays for textual and rich.

May import ibtool.live (the engine's frames are what it shows), ibtool.mesh (the last mesh, as
saved), ibtool.views, ibtool.model, ibtool.errors and ibtool.argtypes; never ibtool.api, a
plugin, ibtool.host or ibtool.sources, or the data path, ibtool.rdma (the tui plugin hands it
the function that runs a loopback).
"""

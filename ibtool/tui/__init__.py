"""`ibtool tui`: the live dashboard (Textual). Imported by that command only: no headless
command pays for textual and rich."""

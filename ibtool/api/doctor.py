"""`ibtool doctor`: diagnose the path to a peer (Options, diagnose), this host's facts as a peer
is sent them (collect), and the report's text, JSON and textfile (view)."""

from __future__ import annotations

from ibtool.doctor.facts import collect
from ibtool.doctor.run import Options, diagnose
from ibtool.views import doctor as view

__all__ = ["Options", "collect", "diagnose", "view"]

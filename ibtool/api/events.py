"""Port events: the record (Event), what was seen of the ports (Seen) and the events between two
sights (diff), each event's line of text and JSON object."""

from __future__ import annotations

from ibtool.model.events import Event, Seen, diff
from ibtool.views.events import event_json, event_line

__all__ = ["Event", "Seen", "diff", "event_json", "event_line"]

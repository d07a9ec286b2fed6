"""Messages between the poller, the screens, the widgets and plugin panels."""

from __future__ import annotations

from textual.message import Message

from ibtool.live.feed import Frame
from ibtool.model.deferred import dataclass


@dataclass
class Polled(Message, bubble=False):
    """A poll finished: the frame every panel shows. It does not bubble: posted to a panel, it
    stays there and never comes back up to the app. A plugin panel receives one after each
    poll (`on_polled`); a later frame makes an undelivered one moot."""

    frame: Frame

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, Polled)

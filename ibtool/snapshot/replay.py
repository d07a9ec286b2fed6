"""A source (an RDMA netlink client, the verbs source) whose answers are written down as it
gives them, and one that answers from what was written: a method's name and arguments map to
its value or to the ibtool error it raised. Values are kept as JSON (bytes and tuples tagged),
their key order too."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ibtool import errors
from ibtool.errors import DataError, IbtoolError

OPEN = "__open__"  # the key of an error the source's opening raised


class SnapshotError(DataError):
    """A snapshot that cannot be read, or that lacks an answer a command needs."""


# -- values as JSON ------------------------------------------------------------------------------


def _enc(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, tuple):
        return {"$tuple": [_enc(v) for v in value]}
    if isinstance(value, list):
        return [_enc(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _enc(v) for k, v in value.items()}
    return value


def _dec(value: Any) -> Any:
    if isinstance(value, list):
        return [_dec(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and "$bytes" in value:
            return bytes.fromhex(value["$bytes"])
        if len(value) == 1 and "$tuple" in value:
            return tuple(_dec(v) for v in value["$tuple"])
        return {k: _dec(v) for k, v in value.items()}
    return value


def _key(name: str, args: tuple, kwargs: dict) -> str:
    return json.dumps([name, _enc(list(args)), _enc(kwargs)], sort_keys=True)


def _error_record(e: IbtoolError) -> dict[str, Any]:
    return {"class": type(e).__name__, "message": e.message, "hint": e.hint, "errno": e.errno}


def _error(record: dict[str, Any]) -> IbtoolError:
    cls = getattr(errors, record.get("class", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, IbtoolError)):
        cls = IbtoolError
    return cls(record["message"], record.get("hint"), errno=record.get("errno"))


class Recorder:
    """A source (netlink client, verbs) whose every answer is written down as it is given."""

    def __init__(self, target: Any, calls: dict[str, Any]):
        self._target = target
        self._calls = calls

    def __getattr__(self, name: str):
        attr = getattr(self._target, name)
        if not callable(attr) or name == "close":
            return attr

        def call(*args, **kwargs):
            key = _key(name, args, kwargs)
            try:
                value = attr(*args, **kwargs)
            except IbtoolError as e:
                self._calls[key] = {"error": _error_record(e)}
                raise
            self._calls[key] = {"value": _enc(value)}
            return value

        return call


def recording(open_source: Callable[[], Any], calls: dict[str, Any]) -> Callable[[], Any]:
    """`open_source`, with the source's answers (or the error opening it) recorded."""

    def open_recorded():
        try:
            return Recorder(open_source(), calls)
        except IbtoolError as e:
            calls[OPEN] = {"error": _error_record(e)}
            raise

    return open_recorded


class Replay:
    """A source answering from recorded calls; a call nothing recorded is a SnapshotError."""

    recorded_features = None  # the netlink features the saving host had, as records

    def __init__(self, calls: dict[str, Any], what: str, path: str):
        self._calls = calls
        self._what = what
        self._path = path

    def close(self) -> None:
        pass

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args, **kwargs):
            found = self._calls.get(_key(name, args, kwargs))
            if found is None and name == "resource_dump" and len(args) > 2 and args[2]:
                return self._on_port(*args, **kwargs)
            if found is None:
                said = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
                raise SnapshotError(
                    f"snapshot {self._path} holds no {self._what} answer to {name}({said})",
                    "it was saved by another ibtool version, or the host changed while it was "
                    "saved: save it again",
                )
            if "error" in found:
                raise _error(found["error"])
            return _dec(found["value"])

        return call

    def _on_port(self, kind: str, index: int, port: int, **kwargs):
        """A dump asked for on one port: the kernel leaves out the objects of other ports and
        those bound to none (nldev.c res_get_common_dumpit); so does the recorded device dump,
        in each reply's nested table of objects, or of the replies themselves."""
        replies = self.resource_dump(kind, index, None, **kwargs)
        if not isinstance(replies, list):
            return replies  # not a dump: the caller says what it cannot use
        return [r for r in map(lambda r: _of_port(r, port), replies) if r is not None]


def _of_port(reply: Any, port: int) -> Any:
    if not isinstance(reply, dict):
        return reply
    tables = [k for k, v in reply.items() if isinstance(v, list)]
    if not tables:
        return reply if reply.get(_PORT) == port else None
    filtered = dict(reply)
    for key in tables:
        filtered[key] = [o for o in reply[key] if isinstance(o, dict) and o.get(_PORT) == port]
    return filtered


_PORT = "RDMA_NLDEV_ATTR_PORT_INDEX"


def replaying(calls: dict[str, Any], what: str, path: str, extra: dict[str, Any] | None = None):
    def open_replay():
        if OPEN in calls:
            raise _error(calls[OPEN]["error"])
        replay = Replay(calls, what, path)
        for name, value in (extra or {}).items():
            setattr(replay, name, value)
        return replay

    return open_replay

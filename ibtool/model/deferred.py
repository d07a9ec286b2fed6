"""Dataclasses made when first used, not when defined: a record costs nothing to define.

`dataclasses.dataclass` writes and compiles each class's methods (__init__, __repr__, __eq__,
__hash__, and __setattr__/__delattr__ when frozen) as it decorates it: about 0.8 ms a class on
these machines, ~0.1 s for ibtool's records, most of which a command never builds. `dataclass`
here takes the same arguments and gives the same class, but defers that work to the first time
the class is used: the first instance made (its `__init__`), or the first look at its fields
(`dataclasses.fields`, `is_dataclass`, `asdict`, `replace` all read `__dataclass_fields__`).
Then the standard decorator runs on the class, in place, once (under a lock: threads may make
the first instance together), and removes what stood in for it: from then on the class is
exactly what `dataclasses.dataclass` makes.

Before that first use, a class attribute given as `field(...)` reads as the Field itself, not
its default (the standard decorator replaces it); no ibtool code reads one.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

_FIELDS = "__dataclass_fields__"
_LOCK = threading.RLock()
_pending: dict[type, dict[str, Any]] = {}


class _Fields:
    """Stands for `__dataclass_fields__` until the class is made."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        make(self.cls)
        return self.cls.__dict__[_FIELDS]


def _first_init(cls: type):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        make(cls)
        cls.__init__(self, *args, **kwargs)  # the decorator's, in its place now

    return __init__


def _init_made(cls: type, options: dict[str, Any]):
    """The __init__ the decorator writes for `cls`, written for a copy of it. Put in place of
    the stand-in in one assignment, a thread making an instance meanwhile finds one or the
    other, never none (deleting the stand-in for the decorator to write its own would leave a
    moment with none); the decorator then keeps it, as it keeps any __init__ a class has. It
    refers to nothing of the copy: its defaults and factories are the class's own objects."""
    space = {
        k: v
        for k, v in cls.__dict__.items()
        if k not in ("__dict__", "__weakref__", "__init__", _FIELDS)
    }
    copy = type(cls)(cls.__name__, cls.__bases__, space)
    init_only = {k: v for k, v in options.items() if k in ("init", "frozen")}
    dataclasses.dataclass(copy, repr=False, eq=False, **init_only)
    return copy.__dict__["__init__"]


def make(cls: type) -> None:
    """Run the standard decorator on `cls` if it has not run yet."""
    if cls in _pending:
        with _LOCK:
            options = _pending.get(cls)
            if options is not None:
                if options.get("init", True):
                    cls.__init__ = _init_made(cls, options)
                else:
                    del cls.__init__
                dataclasses.dataclass(cls, **options)
                del _pending[cls]


def dataclass(cls: type | None = None, **options: Any):
    """`dataclasses.dataclass(cls, **options)`, made on first use."""

    def defer(cls: type) -> type:
        if "__init__" in cls.__dict__ or _FIELDS in cls.__dict__:
            return dataclasses.dataclass(cls, **options)  # nothing to stand in: made now
        _pending[cls] = options
        cls.__init__ = _first_init(cls)
        setattr(cls, _FIELDS, _Fields(cls))
        return cls

    return defer if cls is None else defer(cls)

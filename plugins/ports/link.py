"""`ibtool link add NAME type TYPE netdev NETDEV` and `ibtool link delete NAME`: the words read
and checked as the kernel would (a device name it takes); the link made or deleted by
ibtool.sources.links, which says what the kernel's refusals mean."""

from __future__ import annotations

from ibtool.api import Host, UsageError

LINK_USAGE = (
    "ibtool link [show] [DEV[/PORT]] | ibtool link add NAME type { rxe | siw } netdev NETDEV "
    "| ibtool link delete NAME"
)
IB_DEVICE_NAME_MAX = 64  # include/rdma/ib_verbs.h, with the terminating NUL


def add(host: Host, words: list[str]) -> None:
    """`link add NAME type TYPE netdev NETDEV`: the words after `add`."""
    if not words:
        raise UsageError("link add takes NAME type TYPE netdev NETDEV", LINK_USAGE)
    name, rest = words[0], words[1:]
    options: dict[str, str] = {}
    while rest:
        key = rest.pop(0)
        if key not in ("type", "netdev") or not rest or key in options:
            raise UsageError(f"link add: unexpected {key!r}", LINK_USAGE)
        options[key] = rest.pop(0)
    if set(options) != {"type", "netdev"}:
        missing = " and ".join(k for k in ("type", "netdev") if k not in options)
        raise UsageError(f"link add {name}: {missing} missing", LINK_USAGE)
    # The kernel refuses '%' (a name pattern) and empty names; '/' cannot be a sysfs name.
    if not name or "%" in name or "/" in name or len(name.encode()) >= IB_DEVICE_NAME_MAX:
        raise UsageError(
            f"bad device name {name!r}",
            f"at most {IB_DEVICE_NAME_MAX - 1} bytes, without '%' or '/', e.g. rxe1",
        )
    host.add_link(name, options["type"], options["netdev"])


def delete(host: Host, words: list[str]) -> None:
    """`link delete NAME`: the words after `delete`."""
    if len(words) != 1:
        raise UsageError("link delete takes one device name", LINK_USAGE)
    host.delete_link(words[0])

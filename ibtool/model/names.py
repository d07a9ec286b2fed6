"""How names of devices and netdevs sort (as a person counts, not as strings compare), what the
kernel takes as a netdev's name, how DEV[/PORT] is read, and how a peer's text is made safe to
show (printable)."""

from __future__ import annotations

import re
import unicodedata


def natural_key(name: str) -> list:
    """mlx5_2 sorts before mlx5_10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def parse_selector(selector: str) -> tuple[str, int | None]:
    """'mlx5_0' -> ('mlx5_0', None); 'mlx5_0/1' -> ('mlx5_0', 1)."""
    from ibtool.errors import UsageError

    name, sep, port = selector.partition("/")
    if not name or (sep and not port.isdigit()):
        raise UsageError(f"bad device selector {selector!r}", "use DEV or DEV/PORT, e.g. mlx5_0/1")
    return name, int(port) if sep else None


IFNAMSIZ = 16  # include/uapi/linux/if.h, with the terminating NUL


def valid_netdev_name(name: str) -> bool:
    """What the kernel accepts as a netdev name (net/core/dev.c dev_valid_name)."""
    return (
        0 < len(name.encode("utf-8", "surrogateescape")) < IFNAMSIZ
        and name not in (".", "..")
        and name.isprintable()
        and "/" not in name
        and ":" not in name
        and not any(map(str.isspace, name))
    )


MAX_TEXT = 200  # characters of a peer's text shown, after escaping
# Control (C0, DEL, C1: ESC and CSI start terminal escape sequences), format (bidi overrides,
# zero-width), surrogate, and line and paragraph separator characters.
_UNPRINTABLE = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


def printable(text: str, limit: int = MAX_TEXT) -> str:
    """A peer's text made safe to print: each control, format or separator character written
    as its Python escape (\\x1b, \\n, \\u202e), so the text can neither drive the terminal nor
    start a line of its own; cut to `limit` characters, the cut marked with "..."."""
    if len(text) <= limit and text.isprintable():
        return text
    pieces, size = [], 0
    for ch in text:
        if unicodedata.category(ch) in _UNPRINTABLE:
            ch = ch.encode("unicode_escape").decode("ascii")
        if size + len(ch) > limit:
            return "".join(pieces) + "..."
        pieces.append(ch)
        size += len(ch)
    return "".join(pieces)


def escaped(text: str) -> str:
    """`text` with every control, format or separator character written as its escape, not cut:
    what a name read from sysfs, netlink or a capture becomes in a line of text. The kernel
    refuses only '/' in an RDMA device name (kobject names, lib/kobject.c) and only '/', ':'
    and white space in a netdev name (net/core/dev.c dev_valid_name), so ESC, BEL or U+202E can
    be a real name as well as a forged one."""
    if text.isprintable():
        return text
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in _UNPRINTABLE
        else ch
        for ch in text
    )

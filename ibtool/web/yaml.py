"""The strict reading of a web configuration file: every file read as hostile, its YAML walked
node by node, and what a message may quote of it.

A file is read only if it is a regular file (or /dev/null) of at most 1 MiB, opened without
blocking (read_file), since a reload runs on the server's event loop and its errors go to the
journal. The YAML is composed, not constructed, and walked by Reader, so that a message names
the key path and its line, an unknown or repeated key is an error (exporter-toolkit's
yaml.UnmarshalStrict) and a string keeps the text written. A message quotes at most a short,
escaped prefix of a value or key (cut, go-yaml's), and a PEM key or certificate given as the
configuration is named as such (refuse_pem).

May import ibtool.errors and ibtool.model.names, and PyYAML when a file is loaded; never
another ibtool.web module.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Any

from ibtool.errors import DataError, UnsupportedError
from ibtool.model.names import escaped


class WebConfigError(DataError):
    """A web configuration file that cannot be used: `web config FILE: what`, and a hint."""

    def __init__(self, path: str, what: str, hint: str | None = None):
        super().__init__(f"web config {escaped(path)}: {what}", hint)
        self.path = path
        self.what = what


# What a message quotes of a file: a value or key name of more than 10 characters is shown as
# its first 7 and "...", as go-yaml (yaml.v2 decode.go terror), which exporter-toolkit uses,
# shows a bad value. A private key or /etc/shadow given by mistake, or through a link, must not
# land in the journal, which more people may read than the file. Known key names are shown whole.
_SHOWN_WHOLE = 10
_SHOWN_CUT = 7
_YAML_SAID = 200  # characters of a PyYAML message at most, once its quoted parts are cut
# Bytes read of a file at most: the web configuration, and each certificate, key and CA file
# it names. A configuration with inline PEM and a few users is a few KB, a CA bundle some
# 200 KB (Debian's whole ca-certificates.crt: 215 KB); 1 MiB is far above both, and small
# enough to read on the server's event loop, where a reload happens (Watcher.current() from
# the accept of a connection), without holding it.
_MAX_FILE = 1 << 20


def import_yaml():
    try:
        import yaml
    except ImportError:
        raise UnsupportedError(
            "--web.config.file needs PyYAML", "pip install PyYAML (Debian: python3-yaml)"
        ) from None
    return yaml


class Reader:
    """Walks the composed YAML nodes, so that a message names the key path and its line, and
    a string keeps the text written (Go's yaml.v2 takes `1` or `yes` for a string as written)."""

    def __init__(self, path: str, yaml: Any, known: frozenset[str]):
        self.path = path
        self.yaml = yaml
        self.known = known  # the format's key names, shown whole in a message

    def key_shown(self, name: str) -> str:
        """A key name in a message's key path: whole when it is one of the format's, else cut."""
        return name if name in self.known else cut(name)

    def fail(self, key: str, what: str, node: Any = None, hint: str | None = None):
        where = key
        if node is not None and getattr(node, "start_mark", None) is not None:
            where += f" (line {node.start_mark.line + 1})"
        raise WebConfigError(self.path, f"{where}: {what}" if where else what, hint)

    def null(self, node: Any) -> bool:
        return node is None or (
            isinstance(node, self.yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"
        )

    def mapping(self, node: Any, key: str, known: tuple[str, ...] | None) -> dict[str, Any] | None:
        """A mapping's keys and value nodes; None when null. An unknown or repeated key fails."""
        if self.null(node):
            return None
        if not isinstance(node, self.yaml.MappingNode):
            self.fail(key, f"must be a mapping, not {self.kind(node)}", node)
        out: dict[str, Any] = {}
        for k, v in node.value:
            if not isinstance(k, self.yaml.ScalarNode):
                self.fail(key, f"a key must be a string, not {self.kind(k)}", k)
            name = k.value
            path = f"{key}.{self.key_shown(name)}" if key else self.key_shown(name)
            if known is not None and name not in known:
                self.fail(path, "unknown key", k, "known keys: " + ", ".join(known))
            if name in out:
                self.fail(path, "set twice", k)
            out[name] = v
        return out

    def string(self, node: Any, key: str) -> str | None:
        if self.null(node):
            return None
        if not isinstance(node, self.yaml.ScalarNode):
            self.fail(key, f"must be a string, not {self.kind(node)}", node)
        return node.value

    def boolean(self, node: Any, key: str, default: bool) -> bool:
        if self.null(node):
            return default
        if isinstance(node, self.yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:bool":
            return self.yaml.constructor.SafeConstructor.bool_values[node.value.lower()]
        self.fail(key, f"must be true or false, not {self.show(node)}", node)
        raise AssertionError  # not reached

    def strings(self, node: Any, key: str) -> list[tuple[str, Any]] | None:
        """A list of strings, each with its node; None when null."""
        if self.null(node):
            return None
        if not isinstance(node, self.yaml.SequenceNode):
            self.fail(key, f"must be a list, not {self.kind(node)}", node)
        return [(self.string(item, f"{key}[{i}]") or "", item) for i, item in enumerate(node.value)]

    def kind(self, node: Any) -> str:
        if isinstance(node, self.yaml.MappingNode):
            return "a mapping"
        if isinstance(node, self.yaml.SequenceNode):
            return "a list"
        return self.show(node)

    @staticmethod
    def show(node: Any) -> str:
        value = getattr(node, "value", "")
        return shown(value) if isinstance(value, str) else "a " + type(node).__name__


def cut(text: str) -> str:
    """A value or name of a file as a message may show it: escaped, and when longer than 10
    characters only its first 7 and "..." (go-yaml's cut, see _SHOWN_WHOLE)."""
    if len(text) <= _SHOWN_WHOLE:
        return escaped(text)
    return escaped(text[:_SHOWN_CUT]) + "..."


def shown(text: str) -> str:
    """A value of the file quoted in a message: 'value', or 'first 7...'."""
    return f"'{cut(text)}'"


_YAML_TOKEN = re.compile(r"<[a-z ]+>")
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def yaml_said(text: str) -> str:
    """A PyYAML message with what it quotes of the file (an anchor, alias or tag name, as
    Python's repr) cut as cut() does, on one line, escaped and bounded. Its own token names
    ('<block mapping start>') are kept whole: no name in the file can hold a '<'."""

    def cut(m: re.Match) -> str:
        inner = m.group(0)[1:-1]
        if len(inner) > _SHOWN_WHOLE and not _YAML_TOKEN.fullmatch(inner):
            inner = inner[:_SHOWN_CUT] + "..."
        return m.group(0)[0] + inner + m.group(0)[-1]

    said = escaped(" ".join(_QUOTED.sub(cut, text).split()))
    return said if len(said) <= _YAML_SAID else said[: _YAML_SAID - 3] + "..."


class NotAFile(Exception):
    """A path that is not a regular file (`kind`: "a FIFO", "a character device", ...), or
    one larger than _MAX_FILE (`kind` None)."""

    def __init__(self, kind: str | None):
        super().__init__(kind)
        self.kind = kind
        if kind is None:
            self.what = f"larger than {_MAX_FILE >> 20} MiB"
        else:
            self.what = f"not a regular file ({kind})"

    def hint(self, holding: str) -> str:
        """The hint for a file `holding` what it should ("a web configuration")."""
        if self.kind is None:
            return f"{holding} is a few KB (a whole CA bundle some 200 KB): is it the file meant?"
        return (
            f"{holding} is read again whenever it changes: give a regular file, not a pipe,"
            " a device or a socket; a shell's <(...) is a pipe"
        )


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
# /dev/null, major 1 minor 3 (the kernel's Documentation/admin-guide/devices.txt): read as the
# empty file it is, since `/dev/null` is how one says "nothing" in a configuration
_DEV_NULL = os.makedev(1, 3)


def _check_kind(st: os.stat_result) -> None:
    """Nothing, for a regular file (or /dev/null); else IsADirectoryError or NotAFile."""
    if stat.S_ISREG(st.st_mode) or (stat.S_ISCHR(st.st_mode) and st.st_rdev == _DEV_NULL):
        return
    if stat.S_ISDIR(st.st_mode):  # as read(2) would say (EISDIR)
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    raise NotAFile(next((kind for test, kind in _KINDS if test(st.st_mode)), "not a file"))


def read_file(path: str) -> bytes:
    """The bytes of the regular file at `path`, at most _MAX_FILE of them; OSError, or
    NotAFile for a FIFO, a device, a socket or a larger file. It never blocks on what is not a
    file, since it runs on the server's event loop (Watcher.current(), from an accept): open(2)
    of a FIFO for reading waits for a writer, unless O_NONBLOCK; read(2) of /dev/zero never
    ends; opening a device may act on it (a tape rewinds) or make a terminal the controlling
    one (O_NOCTTY). So the path is stat()ed before it is opened, and what was opened fstat()ed,
    in case the path was replaced in between."""
    _check_kind(os.stat(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        _check_kind(st)
        if st.st_size > _MAX_FILE:
            raise NotAFile(None)
        chunks, size = [], 0
        while size <= _MAX_FILE:  # the file may grow while it is read
            chunk = os.read(fd, _MAX_FILE + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > _MAX_FILE:
            raise NotAFile(None)
        return b"".join(chunks)
    finally:
        os.close(fd)


_PEM_LABEL = re.compile(rb"^-----BEGIN ([A-Z0-9 ]{1,40})-----\r?$", re.MULTILINE)


def refuse_pem(path: str, raw: bytes) -> None:
    """A WebConfigError naming what a file that is not a web configuration holds, when it is
    PEM (a key or certificate given instead of the configuration that names it), without a
    word of it."""
    labels = [m.group(1).decode("ascii") for m in _PEM_LABEL.finditer(raw)]
    if not labels:
        return
    if any("PRIVATE KEY" in label for label in labels):
        what = "a PEM private key"
    elif any(label.endswith("CERTIFICATE") for label in labels):
        what = "a PEM certificate"
    else:
        what = f"PEM ({labels[0]})"
    raise WebConfigError(
        path,
        f"holds {what}, not a web configuration",
        "--web.config.file takes the YAML file that names the certificate and the key,"
        " as tls_server_config's cert_file and key_file",
    )

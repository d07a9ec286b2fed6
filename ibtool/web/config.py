"""`ibtool exporter --web.config.file FILE`: the web configuration file of Prometheus'
exporter-toolkit (github.com/prometheus/exporter-toolkit, docs/web-configuration.md), the one
node_exporter takes, so that one file serves both on a node: the whole of it, and its reload.

load() parses and checks a file as strictly as exporter-toolkit does (web/tls_config.go
getConfig: yaml.UnmarshalStrict, so an unknown key is an error): the reading and the YAML walk
are web.yaml's, tls_server_config web.tls's, basic_auth_users web.auth's; http_server_config
and rate_limit (refused unless off: the exporter does not rate-limit) are checked here.
Watcher re-reads the file and the files it names when one of them changes, as exporter-toolkit
reads them again for every connection (web/tls_config.go Serve: GetConfigForClient), so a
rotated certificate is served without a restart; here at most once a second, by their os.stat.

PyYAML is imported when a file is loaded, bcrypt when it has basic_auth_users: the exporter
without --web.config.file needs neither.

How a server uses it (what web/handler.go ServeHTTP does for each request):

    watcher = Watcher(path, warn)              # a bad file raises WebConfigError here
    tls = watcher.tls                          # per accepted connection: SSLContext, or None
    config = watcher.current()                 # per request
    config.allowed_peer(request.peer_cert)     # False: 403 (Go closes the connection instead)
    config.cached(request.headers.get("authorization"))
                                               # False: 401 with `WWW-Authenticate: Basic`;
                                               # None: not known yet, then off the event loop
    config.authorized(request.headers.get("authorization"))
                                               # bcrypt, one check at a time; False: 401
    config.headers                             # added to every response, 401 and 403 too

Whether TLS is on is decided at start, as in exporter-toolkit: a reload that adds or removes
tls_server_config is refused (warned about, the loaded configuration kept).

May import ibtool.web.yaml, ibtool.web.tls, ibtool.web.auth, ibtool.errors and
ibtool.model.names; never ibtool.web.server.
"""

from __future__ import annotations

import os
import re
import ssl
import threading
import time
from typing import Any, Callable

from ibtool.errors import UnsupportedError
from ibtool.model.names import escaped
from ibtool.web.auth import BCRYPT, DUMMY_HASH_BODY, AuthCache, BasicAuth, import_bcrypt
from ibtool.web.tls import TLS_KEYS, go_ip, load_tls
from ibtool.web.yaml import (
    NotAFile,
    Reader,
    WebConfigError,
    import_yaml,
    read_file,
    refuse_pem,
    shown,
    yaml_said,
)

__all__ = ["WebConfig", "WebConfigError", "Watcher", "load"]

# web/tls_config.go: the keys of Config, TLSConfig, HTTPConfig and RateLimiterConfig
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_HTTP_KEYS = ("http2", "headers")
_RATE_KEYS = ("interval", "burst")

# web/handler.go extraHTTPHeaders: the only headers that may be set, and the values allowed
# for those with a fixed set (None: any). Names are matched exactly, as there.
_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}

# Go duration units (time.ParseDuration), for rate_limit.interval
_DURATION = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+|[-+]?0")
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")

_STAT_INTERVAL = 1.0  # seconds between two looks at the files by Watcher.current()
_RETRY_BAD = 10.0  # seconds between two loads of files in the same broken state
_KNOWN_NAMES = frozenset((*_TOP_KEYS, *TLS_KEYS, *_HTTP_KEYS, *_RATE_KEYS, *_HEADERS))
# An HTTP field name as they are written (RFC 9110 allows more, no header needs it), as long as
# the longest exporter-toolkit knows (Strict-Transport-Security, 25) and a little more
_HEADER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")


class WebConfig(BasicAuth):
    """One loaded and checked web configuration file."""

    def __init__(self, path: str):
        self.path = path
        self.tls = False
        self.users: dict[str, str] = {}
        self.headers: list[tuple[str, str]] = []
        self.http2 = True  # accepted; ibtool's server speaks HTTP/1.1 only, so it has no effect
        self.client_allowed_sans: list[str] | None = None
        self._files: list[str] = []
        self._context: ssl.SSLContext | None = None
        self._cache = AuthCache()
        self._dummy_hash = ""
        self._bcrypt_lock = threading.Lock()  # web/handler.go bcryptMtx: one bcrypt at a time

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's context (built at load), None without tls_server_config."""
        return self._context

    def files(self) -> list[str]:
        """The configuration file and the files it names."""
        return [self.path, *self._files]

    def allowed_peer(self, peer_cert: dict | None) -> bool:
        """Whether the client's verified certificate (SSLSocket.getpeercert()) carries one of
        client_allowed_sans as a DNS, IP, e-mail or URI subjectAltName (web/tls_config.go
        VerifyPeerCertificate: an exact match with Go's spelling of each); True when none are
        configured."""
        if self.client_allowed_sans is None:
            return True
        if not peer_cert:
            return False
        allowed = set(self.client_allowed_sans)
        for kind, value in peer_cert.get("subjectAltName", ()):
            if kind == "IP Address":
                value = go_ip(value)
            elif kind not in ("DNS", "email", "URI"):
                continue
            if value in allowed:
                return True
        return False


def load(path: str, *, _cache: AuthCache | None = None) -> WebConfig:
    """Read, check and prove the web configuration file at `path` (its TLS context built once).
    A file that cannot be used raises WebConfigError; PyYAML or bcrypt missing, UnsupportedError."""
    yaml = import_yaml()
    try:
        raw = read_file(path)
    except OSError as e:
        raise WebConfigError(path, f"cannot read it: {e.strerror or e}") from None
    except NotAFile as e:
        raise WebConfigError(path, e.what, e.hint("a web configuration")) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        refuse_pem(path, raw)
        raise WebConfigError(
            path, f"not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"
        ) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        refuse_pem(path, raw)
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        # never str(e): it shows the line around the mark (PyYAML's Mark.get_snippet)
        what = yaml_said(e.problem or e.context or "cannot be parsed")
        raise WebConfigError(path, f"YAML syntax error{where}: {what}") from None
    except yaml.YAMLError as e:
        refuse_pem(path, raw)
        said = yaml_said(str(e).replace(' in "<unicode string>",', " at"))  # ReaderError
        raise WebConfigError(path, f"YAML syntax error: {said}") from None
    except RecursionError:
        raise WebConfigError(path, "YAML nested too deeply") from None

    r = Reader(path, yaml, _KNOWN_NAMES)
    config = WebConfig(path)
    if _cache is not None:
        config._cache = _cache
    if root is None:  # an empty file: nothing set, as in exporter-toolkit
        return config
    if not isinstance(root, yaml.MappingNode):
        refuse_pem(path, raw)
        found = f"{r.kind(root)} at line {root.start_mark.line + 1}"
        raise WebConfigError(path, f"not a mapping of {', '.join(_TOP_KEYS)} (found {found})")
    top = r.mapping(root, "", _TOP_KEYS) or {}
    base = os.path.dirname(os.path.abspath(path))

    http = r.mapping(top.get("http_server_config"), "http_server_config", _HTTP_KEYS) or {}
    # accepted for compatibility: ibtool's server speaks HTTP/1.1 only, so it has no effect
    config.http2 = r.boolean(http.get("http2"), "http_server_config.http2", True)
    headers = r.mapping(http.get("headers"), "http_server_config.headers", None) or {}
    for name, node in headers.items():
        # a header name, even one that cannot be set (Content-Type), is shown whole, as
        # exporter-toolkit does ("HTTP header %q can not be configured"); any other key, cut
        label = name if _HEADER_NAME.fullmatch(name) else r.key_shown(name)
        key = f"http_server_config.headers.{label}"
        if name not in _HEADERS:
            r.fail(
                key,
                "this header cannot be set",
                node,
                "exporter-toolkit allows " + ", ".join(_HEADERS),
            )
        value = r.string(node, key) or ""
        allowed = _HEADERS[name]
        if allowed is not None and value not in allowed:
            r.fail(key, f"{shown(value)} is not allowed", node, "one of " + ", ".join(allowed))
        if not re.fullmatch(r"[\t\x20-\x7e]*", value):
            # http.server writes headers in Latin-1, and a line break would end the header
            r.fail(key, "a header value must be printable ASCII on one line", node)
        if value:  # blank: unset, as docs/web-configuration.md says
            config.headers.append((name, value))

    rate = r.mapping(top.get("rate_limit"), "rate_limit", _RATE_KEYS) or {}
    interval = r.string(rate.get("interval"), "rate_limit.interval")
    if rate.get("burst") is not None and not r.null(rate["burst"]):
        burst = r.string(rate["burst"], "rate_limit.burst")
        if not re.fullmatch(r"[-+]?\d+", burst or ""):
            r.fail(
                "rate_limit.burst", f"must be an integer, not {shown(burst or '')}", rate["burst"]
            )
    if interval is not None and _duration(r, interval, rate["interval"]) != 0:
        r.fail(
            "rate_limit.interval",
            "ibtool's exporter does not rate-limit",
            rate["interval"],
            "remove rate_limit or set its interval to 0",
        )

    users = r.mapping(top.get("basic_auth_users"), "basic_auth_users", None) or {}
    costs = []
    for name, node in users.items():
        hashed = r.string(node, f"basic_auth_users.{r.key_shown(name)}") or ""
        m = BCRYPT.fullmatch(hashed)
        if m is None or not 4 <= int(m.group(1)) <= 31:
            # never the value itself: it is a secret, or a password put there by mistake
            r.fail(
                f"basic_auth_users.{r.key_shown(name)}",
                "not a bcrypt hash",
                node,
                "make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'",
            )
        costs.append(int(m.group(1)))
        # $2y$ is $2b$ (crypt_blowfish's name for the same algorithm); some bcrypt releases
        # take only $2a$ and $2b$
        config.users[name] = "$2b$" + hashed[4:] if hashed.startswith("$2y$") else hashed
    if config.users:
        import_bcrypt()
        config._dummy_hash = f"$2b${max(costs):02d}${DUMMY_HASH_BODY}"

    tls = top.get("tls_server_config")
    if tls is not None and not r.null(tls):
        load_tls(r, config, tls, base)
    return config


def _duration(r: Reader, text: str, node: Any) -> float:
    """Seconds of a Go duration (time.ParseDuration: "1s", "1m30s", "0")."""
    text = text.strip()
    if not _DURATION.fullmatch(text):
        r.fail(
            "rate_limit.interval",
            f"{shown(text)} is not a duration",
            node,
            'e.g. "1s", "500ms" or 0',
        )
    scale = {
        "ns": 1e-9,
        "us": 1e-6,
        "µs": 1e-6,
        "μs": 1e-6,
        "ms": 1e-3,
        "s": 1.0,
        "m": 60.0,
        "h": 3600.0,
    }
    return sum(float(n) * scale[u] for n, u in _DURATION_PART.findall(text))


def _stamp(path: str) -> tuple[int, int, int] | str:
    try:
        st = os.stat(path)
    except OSError as e:
        return f"error {e.errno}"
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Watcher:
    """The web configuration of a running server: load()ed at once (its errors raise), then
    loaded again when the file or one it names changes, so that a rotated certificate or a new
    user is taken without a restart. A reload that fails keeps the last good configuration and
    calls `warn` once for that state of the files."""

    def __init__(
        self, path: str, warn: Callable[[str], None], clock: Callable[[], float] = time.monotonic
    ):
        self.path = path
        self._warn = warn
        self._clock = clock
        self._lock = threading.Lock()
        self._cache = AuthCache()  # kept across reloads, as web/handler.go keeps its cache
        self._config = load(path, _cache=self._cache)
        self._stamps = self._stat(self._config.files())
        self._checked = clock()
        # after a failed load: the stamps then, its message, and when it was tried
        self._bad: tuple[dict[str, Any], str] | None = None
        self._bad_at = 0.0

    @staticmethod
    def _stat(paths: list[str]) -> dict[str, Any]:
        return {p: _stamp(p) for p in paths}

    def current(self) -> WebConfig:
        """The configuration in force, the files looked at at most once per second."""
        with self._lock:
            now = self._clock()
            if now - self._checked < _STAT_INTERVAL:
                return self._config
            self._checked = now
            stamps = self._stat(self._config.files())
            if stamps == self._stamps:
                return self._config
            # The files of a broken state are not read again every second; they are every
            # _RETRY_BAD seconds, since a broken file may name one the good one does not
            # (a new certificate yet to be written), whose stamps are not watched.
            if self._bad is not None and stamps == self._bad[0] and now - self._bad_at < _RETRY_BAD:
                return self._config
            try:
                config = load(self.path, _cache=self._cache)
            except (WebConfigError, UnsupportedError) as e:
                hint = f" (hint: {e.hint})" if e.hint else ""
                return self._keep(stamps, now, f"{e.message}{hint}")
            except Exception as e:
                # a bug or MemoryError must not close every connection from now on, the server
                # calling this for each (ibtool-exporter(8): the last good one stays served);
                # the type only, its text may quote the file
                return self._keep(
                    stamps,
                    now,
                    f"web config {escaped(self.path)}: cannot be loaded ({type(e).__name__})",
                )
            if config.tls != self._config.tls:
                return self._keep(
                    stamps,
                    now,
                    f"web config {escaped(self.path)}: tls_server_config was "
                    + ("added" if config.tls else "removed")
                    + ": switching TLS on or off takes a restart of the exporter",
                )
            self._config = config
            self._bad = None
            # the stamps seen before this load: a change made during it is seen next time
            self._stamps = stamps if config.files() == list(stamps) else self._stat(config.files())
            return config

    def _keep(self, stamps: dict[str, Any], now: float, why: str) -> WebConfig:
        """The configuration loaded before, after a reload that cannot be used: one warning
        for this state of the files."""
        message = f"{why}; keeping the configuration loaded before"
        if self._bad != (stamps, message):
            self._warn(message)
        self._bad, self._bad_at = (stamps, message), now
        return self._config

    def tls(self) -> ssl.SSLContext | None:
        """The SSL context of a connection being accepted: current().ssl_context()."""
        return self.current().ssl_context()

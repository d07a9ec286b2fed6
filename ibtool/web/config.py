"""`ibtool exporter --web.config.file FILE`: the web configuration file of Prometheus'
exporter-toolkit (github.com/prometheus/exporter-toolkit, docs/web-configuration.md), the one
node_exporter takes, so that one file serves both on a node.

load() parses and checks a file as strictly as exporter-toolkit does (web/tls_config.go
getConfig: yaml.UnmarshalStrict, so an unknown key is an error) and builds its ssl.SSLContext
once to prove that the certificate, key and CA load. Watcher re-reads the file and the files
it names when one of them changes, as exporter-toolkit reads them again for every connection
(web/tls_config.go Serve: GetConfigForClient), so a rotated certificate is served without a
restart; here at most once a second, by their os.stat.

What Python's ssl module cannot do is refused with a WebConfigError that says so, never
ignored: client_auth_type RequestClientCert and RequireAnyClientCert (a certificate asked for
and not verified), more than one curve_preferences entry, X25519 in it, and rate_limit (the
exporter does not rate-limit).

Every file is read as hostile, since a reload runs on the server's event loop and its errors
go to the journal: only a regular file (or /dev/null) of at most 1 MiB, opened without blocking
(_read_file); ssl is handed what was read, never a path to open again (_pem_files); a message
quotes at most a short, escaped prefix of a value or key (_cut, go-yaml's), and a PEM key or
certificate given as the configuration is named as such (_refuse_pem).

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
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import ipaddress
import os
import random
import re
import ssl
import stat
import tempfile
import threading
import time
import warnings
from typing import Any, Callable

from ibtool.errors import DataError, UnsupportedError
from ibtool.model.names import escaped

__all__ = ["WebConfig", "WebConfigError", "Watcher", "load"]


class WebConfigError(DataError):
    """A web configuration file that cannot be used: `web config FILE: what`, and a hint."""

    def __init__(self, path: str, what: str, hint: str | None = None):
        super().__init__(f"web config {escaped(path)}: {what}", hint)
        self.path = path
        self.what = what


# web/tls_config.go: the keys of Config, TLSConfig, HTTPConfig and RateLimiterConfig
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS = (
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
_HTTP_KEYS = ("http2", "headers")
_RATE_KEYS = ("interval", "burst")

# web/tls_config.go tlsVersions
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# web/tls_config.go ConfigToTLSConfig: the client_auth_type names, as Go's tls.ClientAuthType.
# RequestClientCert and RequireAnyClientCert (RequireClientCert its old name) take a client
# certificate without verifying it: OpenSSL's verify callback could, Python's ssl has no way to
# set one, and a certificate nobody checked proves nothing anyway.
_CLIENT_AUTH = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

# Go's tls.CipherSuites() names (what web/tls_config.go Cipher.UnmarshalYAML accepts) with the
# OpenSSL name of each TLS 1.2 suite. The TLS 1.3 ones are accepted and have no effect, as in
# Go, where they are not configurable: OpenSSL and Go both offer all three.
_CIPHERS_TLS12 = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}
_CIPHERS_TLS13 = (
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
)

# web/tls_config.go curves, as OpenSSL names them. SSLContext.set_ecdh_curve() sets one curve,
# and only a NIST one (X25519 is "unknown group" there); OpenSSL offers X25519 by default.
_CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": None,
}

# web/handler.go extraHTTPHeaders: the only headers that may be set, and the values allowed
# for those with a fixed set (None: any). Names are matched exactly, as there.
_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}

# A bcrypt hash as Go's golang.org/x/crypto/bcrypt takes it: $2a$, $2b$ or $2y$ (the same
# algorithm), a two-digit cost, then 22 characters of salt and 31 of hash.
_BCRYPT = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
# What an unknown user's password is checked against (web/handler.go does the same with a fixed
# cost-10 hash), at the cost of the configured hashes so that the time of a refusal does not
# tell whether the user exists. It matches no password: only the work counts.
_DUMMY_HASH_BODY = "abcdefghijklmnopqrstuu" + "0123456789ABCDEFGHIJKLMNOPQRSTU"

# Go duration units (time.ParseDuration), for rate_limit.interval
_DURATION = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+|[-+]?0")
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")

_STAT_INTERVAL = 1.0  # seconds between two looks at the files by Watcher.current()
_RETRY_BAD = 10.0  # seconds between two loads of files in the same broken state
_CACHE_SIZE = 100  # web/cache.go cacheSize

# What a message quotes of a file: a value or key name of more than 10 characters is shown as
# its first 7 and "...", as go-yaml (yaml.v2 decode.go terror), which exporter-toolkit uses,
# shows a bad value. A private key or /etc/shadow given by mistake, or through a link, must not
# land in the journal, which more people may read than the file. Known key names are shown whole.
_SHOWN_WHOLE = 10
_SHOWN_CUT = 7
_KNOWN_NAMES = frozenset((*_TOP_KEYS, *_TLS_KEYS, *_HTTP_KEYS, *_RATE_KEYS, *_HEADERS))
# An HTTP field name as they are written (RFC 9110 allows more, no header needs it), as long as
# the longest exporter-toolkit knows (Strict-Transport-Security, 25) and a little more
_HEADER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")
_YAML_SAID = 200  # characters of a PyYAML message at most, once its quoted parts are cut
# Bytes read of a file at most: the web configuration, and each certificate, key and CA file
# it names. A configuration with inline PEM and a few users is a few KB, a CA bundle some
# 200 KB (Debian's whole ca-certificates.crt: 215 KB); 1 MiB is far above both, and small
# enough to read on the server's event loop, where a reload happens (Watcher.current() from
# the accept of a connection), without holding it.
_MAX_FILE = 1 << 20


def _import_yaml():
    try:
        import yaml
    except ImportError:
        raise UnsupportedError(
            "--web.config.file needs PyYAML", "pip install PyYAML (Debian: python3-yaml)"
        ) from None
    return yaml


def _import_bcrypt():
    try:
        import bcrypt
    except ImportError:
        raise UnsupportedError(
            "--web.config.file needs bcrypt for basic_auth_users",
            "pip install bcrypt (Debian: python3-bcrypt)",
        ) from None
    return bcrypt


class _AuthCache:
    """web/cache.go: the outcome of a bcrypt check by (user, hash, password), failed ones too,
    bounded; when full, about a tenth of it is dropped at random. The key is a SHA-256 of the
    three, so a long password does not make a large entry and a changed hash is a miss.

    Unlike web/cache.go, successes and failures are kept apart, each bounded by `size`: in one
    cache, a flood of wrong passwords (each a new entry) drops a tenth of it at random every
    `size / 10` guesses, the scraper's entry with it within seconds, and its next scrape would
    then queue for bcrypt behind the flood. A success is only made by someone who knows a
    password, so failures can never push one out."""

    def __init__(self, size: int = _CACHE_SIZE):
        self.size = size
        self._good: dict[bytes, bool] = {}
        self._bad: dict[bytes, bool] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(user: bytes, hashed: str, password: bytes) -> bytes:
        # hex keeps the three apart, as in web/handler.go
        return hashlib.sha256(
            b":".join(
                (user.hex().encode(), hashed.encode().hex().encode(), password.hex().encode())
            )
        ).digest()

    def get(self, key: bytes) -> bool | None:
        with self._lock:
            if key in self._good:
                return True
            return self._bad.get(key)

    def set(self, key: bytes, ok: bool) -> None:
        with self._lock:
            entries = self._good if ok else self._bad
            if key not in entries and len(entries) >= self.size:
                for old in random.sample(list(entries), max(len(entries) // 10, 1)):
                    del entries[old]
            entries[key] = ok

    def __len__(self) -> int:
        with self._lock:
            return len(self._good) + len(self._bad)


class WebConfig:
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
        self._cache = _AuthCache()
        self._dummy_hash = ""
        self._bcrypt_lock = threading.Lock()  # web/handler.go bcryptMtx: one bcrypt at a time

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's context (built at load), None without tls_server_config."""
        return self._context

    def files(self) -> list[str]:
        """The configuration file and the files it names."""
        return [self.path, *self._files]

    def authorized(self, authorization: str | None) -> bool:
        """Whether a request's Authorization header names a user of basic_auth_users with its
        password; True when there are none (web/handler.go ServeHTTP). May run bcrypt, one
        check at a time: a server calls cached() first, and this only off its event loop."""
        ok = self.cached(authorization)
        if ok is not None:
            return ok
        user_bytes, password, hashed, is_user = self._lookup(authorization)  # cached() did
        key = _AuthCache.key(user_bytes, hashed, password)
        with self._bcrypt_lock:
            ok = self._cache.get(key)  # another thread may have just checked the same
            if ok is None:
                # an unknown user costs one bcrypt, at the dummy hash's cost
                ok = _checkpw(password, hashed) and is_user
                self._cache.set(key, ok)
        return ok and is_user

    def cached(self, authorization: str | None) -> bool | None:
        """What authorized() answers when that needs no bcrypt (no users, a malformed header,
        a check made before), without waiting for any lock but the cache's own; None when it
        needs a bcrypt check. What lets a known scraper through while a flood of wrong
        passwords waits for bcrypt (web/handler.go looks at its cache before bcryptMtx too)."""
        if not self.users:
            return True
        found = self._lookup(authorization)
        if found is None:
            return False
        user_bytes, password, hashed, is_user = found
        ok = self._cache.get(_AuthCache.key(user_bytes, hashed, password))
        return None if ok is None else ok and is_user

    def _lookup(self, authorization: str | None) -> tuple[bytes, bytes, str, bool] | None:
        """(user, password, the hash to check it against, whether the user exists), or None
        for a header that is not Basic credentials. An unknown user gets the dummy hash."""
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return None
        user_bytes, password = credentials
        try:
            user = user_bytes.decode("utf-8")
        except UnicodeDecodeError:
            user = None
        hashed = self.users.get(user) if user is not None else None
        if hashed is None:
            return user_bytes, password, self._dummy_hash, False
        return user_bytes, password, hashed, True

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
                value = _go_ip(value)
            elif kind not in ("DNS", "email", "URI"):
                continue
            if value in allowed:
                return True
        return False


def _go_ip(text: str) -> str:
    """An IP address as Go's net.IP.String() writes it (OpenSSL writes IPv6 in full)."""
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        return text
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _basic_credentials(authorization: str | None) -> tuple[bytes, bytes] | None:
    """(user, password) of `Basic base64(user:password)`, as Go's Request.BasicAuth() takes it;
    None when the header is absent or malformed."""
    if not authorization or authorization[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(authorization[6:].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    return user, password


def _checkpw(password: bytes, hashed: str) -> bool:
    bcrypt = _import_bcrypt()
    try:
        return bcrypt.checkpw(password, hashed.encode("ascii"))
    except ValueError:  # bcrypt 5 refuses a password of more than 72 bytes
        return False


class _Reader:
    """Walks the composed YAML nodes, so that a message names the key path and its line, and
    a string keeps the text written (Go's yaml.v2 takes `1` or `yes` for a string as written)."""

    def __init__(self, path: str, yaml: Any):
        self.path = path
        self.yaml = yaml

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
            path = f"{key}.{_key_shown(name)}" if key else _key_shown(name)
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
        return _shown(value) if isinstance(value, str) else "a " + type(node).__name__


def _cut(text: str) -> str:
    """A value or name of a file as a message may show it: escaped, and when longer than 10
    characters only its first 7 and "..." (go-yaml's cut, see _SHOWN_WHOLE)."""
    if len(text) <= _SHOWN_WHOLE:
        return escaped(text)
    return escaped(text[:_SHOWN_CUT]) + "..."


def _shown(text: str) -> str:
    """A value of the file quoted in a message: 'value', or 'first 7...'."""
    return f"'{_cut(text)}'"


def _key_shown(name: str) -> str:
    """A key name in a message's key path: whole when it is one of the format's, else cut."""
    return name if name in _KNOWN_NAMES else _cut(name)


_YAML_TOKEN = re.compile(r"<[a-z ]+>")
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def _yaml_said(text: str) -> str:
    """A PyYAML message with what it quotes of the file (an anchor, alias or tag name, as
    Python's repr) cut as _cut() does, on one line, escaped and bounded. Its own token names
    ('<block mapping start>') are kept whole: no name in the file can hold a '<'."""

    def cut(m: re.Match) -> str:
        inner = m.group(0)[1:-1]
        if len(inner) > _SHOWN_WHOLE and not _YAML_TOKEN.fullmatch(inner):
            inner = inner[:_SHOWN_CUT] + "..."
        return m.group(0)[0] + inner + m.group(0)[-1]

    said = escaped(" ".join(_QUOTED.sub(cut, text).split()))
    return said if len(said) <= _YAML_SAID else said[: _YAML_SAID - 3] + "..."


def load(path: str, *, _cache: _AuthCache | None = None) -> WebConfig:
    """Read, check and prove the web configuration file at `path` (its TLS context built once).
    A file that cannot be used raises WebConfigError; PyYAML or bcrypt missing, UnsupportedError."""
    yaml = _import_yaml()
    try:
        raw = _read_file(path)
    except OSError as e:
        raise WebConfigError(path, f"cannot read it: {e.strerror or e}") from None
    except _NotAFile as e:
        raise WebConfigError(path, e.what, e.hint("a web configuration")) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        _refuse_pem(path, raw)
        raise WebConfigError(
            path, f"not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"
        ) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        _refuse_pem(path, raw)
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        # never str(e): it shows the line around the mark (PyYAML's Mark.get_snippet)
        what = _yaml_said(e.problem or e.context or "cannot be parsed")
        raise WebConfigError(path, f"YAML syntax error{where}: {what}") from None
    except yaml.YAMLError as e:
        _refuse_pem(path, raw)
        said = _yaml_said(str(e).replace(' in "<unicode string>",', " at"))  # ReaderError
        raise WebConfigError(path, f"YAML syntax error: {said}") from None
    except RecursionError:
        raise WebConfigError(path, "YAML nested too deeply") from None

    r = _Reader(path, yaml)
    config = WebConfig(path)
    if _cache is not None:
        config._cache = _cache
    if root is None:  # an empty file: nothing set, as in exporter-toolkit
        return config
    if not isinstance(root, yaml.MappingNode):
        _refuse_pem(path, raw)
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
        shown = name if _HEADER_NAME.fullmatch(name) else _key_shown(name)
        key = f"http_server_config.headers.{shown}"
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
            r.fail(key, f"{_shown(value)} is not allowed", node, "one of " + ", ".join(allowed))
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
                "rate_limit.burst", f"must be an integer, not {_shown(burst or '')}", rate["burst"]
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
        hashed = r.string(node, f"basic_auth_users.{_key_shown(name)}") or ""
        m = _BCRYPT.fullmatch(hashed)
        if m is None or not 4 <= int(m.group(1)) <= 31:
            # never the value itself: it is a secret, or a password put there by mistake
            r.fail(
                f"basic_auth_users.{_key_shown(name)}",
                "not a bcrypt hash",
                node,
                "make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'",
            )
        costs.append(int(m.group(1)))
        # $2y$ is $2b$ (crypt_blowfish's name for the same algorithm); some bcrypt releases
        # take only $2a$ and $2b$
        config.users[name] = "$2b$" + hashed[4:] if hashed.startswith("$2y$") else hashed
    if config.users:
        _import_bcrypt()
        config._dummy_hash = f"$2b${max(costs):02d}${_DUMMY_HASH_BODY}"

    tls = top.get("tls_server_config")
    if tls is not None and not r.null(tls):
        _load_tls(r, config, tls, base)
    return config


def _duration(r: _Reader, text: str, node: Any) -> float:
    """Seconds of a Go duration (time.ParseDuration: "1s", "1m30s", "0")."""
    text = text.strip()
    if not _DURATION.fullmatch(text):
        r.fail(
            "rate_limit.interval",
            f"{_shown(text)} is not a duration",
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


def _load_tls(r: _Reader, config: WebConfig, node: Any, base: str) -> None:
    """tls_server_config: every key checked, then the SSLContext built from them."""
    t = r.mapping(node, "tls_server_config", _TLS_KEYS) or {}
    config.tls = True

    def s(name: str) -> str:
        return r.string(t.get(name), f"tls_server_config.{name}") or ""

    def file(name: str) -> str:
        value = s(name)
        # config_util.JoinDir in web/tls_config.go SetDirectory: relative to the file's directory
        return os.path.join(base, value) if value else ""

    cert_file, key_file, ca_file = file("cert_file"), file("key_file"), file("client_ca_file")
    cert, key, ca = s("cert"), s("key"), s("client_ca")
    _check_sources(r, t, node, s)
    verify_mode = _client_auth(r, t, s("client_auth_type"), bool(ca_file or ca))
    sans = r.strings(t.get("client_allowed_sans"), "tls_server_config.client_allowed_sans")
    if sans is not None:
        if verify_mode != ssl.CERT_REQUIRED:
            r.fail(
                "tls_server_config.client_allowed_sans",
                "needs client_auth_type RequireAndVerifyClientCert",
                t["client_allowed_sans"],
                "only a verified client certificate's names mean anything",
            )
        config.client_allowed_sans = [v for v, _ in sans]
    versions = _versions(r, t, s)
    ciphers = _ciphers(r, t, versions[0])
    curves = _curves(r, t)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.options |= ssl.OP_NO_COMPRESSION
    # web/tls_config.go getConfig: prefer_server_cipher_suites defaults to true
    if r.boolean(
        t.get("prefer_server_cipher_suites"), "tls_server_config.prefer_server_cipher_suites", True
    ):
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    with warnings.catch_warnings():  # TLSv1 and TLSv1_1 are deprecated names from Python 3.10
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version, ctx.maximum_version = versions
    if ciphers:
        try:
            ctx.set_ciphers(":".join(ciphers))
        except ssl.SSLError as e:
            r.fail(
                "tls_server_config.cipher_suites",
                f"OpenSSL takes none of them ({_reason(e)})",
                t["cipher_suites"],
            )
    if curves:
        try:
            ctx.set_ecdh_curve(_CURVES[curves[0]])
        except (ssl.SSLError, ValueError) as e:
            r.fail(
                "tls_server_config.curve_preferences",
                f"OpenSSL refuses {curves[0]} ({_reason(e)})",
                t["curve_preferences"],
            )
    _load_chain(r, ctx, t, cert_file, key_file, cert, key)
    ctx.verify_mode = verify_mode
    if ca_file or ca:
        _load_client_ca(r, ctx, t, ca_file, ca)
    config._files = [f for f in (cert_file, key_file, ca_file) if f]
    config._context = ctx


def _check_sources(r: _Reader, t: dict[str, Any], node: Any, s: Callable[[str], str]) -> None:
    """A certificate and a key, each inline or from a file, never both ways."""
    for inline, named in (
        ("cert", "cert_file"),
        ("key", "key_file"),
        ("client_ca", "client_ca_file"),
    ):
        if s(inline) and s(named):
            r.fail(
                "tls_server_config",
                f"both {inline} and {named} are set",
                t[inline],
                f"give the PEM text inline ({inline}) or a file ({named}), not both",
            )
    if not s("cert_file") and not s("cert"):
        r.fail("tls_server_config", "cert_file is missing", node, "the server's certificate, PEM")
    if not s("key_file") and not s("key"):
        r.fail(
            "tls_server_config", "key_file is missing", node, "the private key of cert_file, PEM"
        )


def _client_auth(r: _Reader, t: dict[str, Any], auth_name: str, has_ca: bool) -> ssl.VerifyMode:
    """client_auth_type as ssl's verify mode, consistent with the client CA."""
    if auth_name in _UNVERIFIED_CLIENT_AUTH:
        r.fail(
            "tls_server_config.client_auth_type",
            f"{auth_name} takes a client certificate without verifying it,"
            " which Python's ssl module cannot do",
            t["client_auth_type"],
            "use RequireAndVerifyClientCert or VerifyClientCertIfGiven, with client_ca_file",
        )
    if auth_name not in _CLIENT_AUTH:
        r.fail(
            "tls_server_config.client_auth_type",
            f"unknown value {_shown(auth_name)}",
            t["client_auth_type"],
            "one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert",
        )
    verify_mode = _CLIENT_AUTH[auth_name]
    if verify_mode == ssl.CERT_NONE and has_ca:
        # web/tls_config.go: "client CA's have been configured without a Client Auth Policy"
        r.fail(
            "tls_server_config.client_ca_file",
            "a client CA without a client_auth_type that verifies client certificates",
            t.get("client_ca_file") or t.get("client_ca"),
            "set client_auth_type: RequireAndVerifyClientCert (or VerifyClientCertIfGiven)",
        )
    if verify_mode != ssl.CERT_NONE and not has_ca:
        # Go would verify against the system's roots: any publicly issued certificate would do
        r.fail(
            "tls_server_config.client_ca_file",
            f"client_auth_type {auth_name} needs client_ca_file,"
            " the CA that issues client certificates",
            t["client_auth_type"],
        )
    return verify_mode


def _versions(
    r: _Reader, t: dict[str, Any], s: Callable[[str], str]
) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    """min_version and max_version (default TLS12 to TLS13, as web/tls_config.go)."""
    versions = {}
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = s(name) or default
        if value not in _VERSIONS:
            r.fail(
                f"tls_server_config.{name}",
                f"unknown TLS version {_shown(value)}",
                t[name],
                "one of " + ", ".join(_VERSIONS),
            )
        versions[name] = value
    if _VERSIONS[versions["min_version"]] > _VERSIONS[versions["max_version"]]:
        r.fail(
            "tls_server_config.min_version",
            f"{versions['min_version']} is above max_version {versions['max_version']}",
            t.get("min_version") or t.get("max_version"),
        )
    return _VERSIONS[versions["min_version"]], _VERSIONS[versions["max_version"]]


def _ciphers(r: _Reader, t: dict[str, Any], minimum: ssl.TLSVersion) -> list[str]:
    """cipher_suites in Go's names as OpenSSL's (TLS 1.2; TLS 1.3's are fixed, as in Go)."""
    ciphers: list[str] = []
    suites = r.strings(t.get("cipher_suites"), "tls_server_config.cipher_suites") or []
    for i, (name, item) in enumerate(suites):
        if name in _CIPHERS_TLS12:
            ciphers.append(_CIPHERS_TLS12[name])
        elif name not in _CIPHERS_TLS13:
            r.fail(
                f"tls_server_config.cipher_suites[{i}]",
                f"unknown cipher suite {_shown(name)}",
                item,
                "Go's names of the ECDHE suites, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            )
    if suites and not ciphers and minimum < ssl.TLSVersion.TLSv1_3:
        r.fail(
            "tls_server_config.cipher_suites",
            "names TLS 1.3 suites only, which are not configurable: TLS 1.2 would have none",
            t["cipher_suites"],
            "add TLS 1.2 suites, or set min_version: TLS13",
        )
    return ciphers


def _curves(r: _Reader, t: dict[str, Any]) -> list[str]:
    """curve_preferences: one NIST curve at most, the one ssl's set_ecdh_curve takes."""
    curves = r.strings(t.get("curve_preferences"), "tls_server_config.curve_preferences") or []
    for i, (name, item) in enumerate(curves):
        if name not in _CURVES:
            r.fail(
                f"tls_server_config.curve_preferences[{i}]",
                f"unknown curve {_shown(name)}",
                item,
                "one of " + ", ".join(_CURVES),
            )
        if _CURVES[name] is None:
            r.fail(
                f"tls_server_config.curve_preferences[{i}]",
                f"{name} cannot be set through Python's ssl module (OpenSSL offers it by default)",
                item,
                "remove curve_preferences, or name one of CurveP256, CurveP384, CurveP521",
            )
    if len(curves) > 1:
        r.fail(
            "tls_server_config.curve_preferences",
            "Python's ssl module sets one curve, not a list",
            t["curve_preferences"],
            "name one curve, or remove curve_preferences to let OpenSSL offer its defaults",
        )
    return [name for name, _ in curves]


def _load_client_ca(r: _Reader, ctx: ssl.SSLContext, t: dict[str, Any], ca_file: str, ca: str):
    """The CA client certificates are verified against, from its file or inline."""
    ca_name = "client_ca_file" if ca_file else "client_ca"
    ca_desc = f"{escaped(ca_file)}: " if ca_file else ""
    try:
        if ca_file:
            # what was read, handed over as a file: load_verify_locations(cafile=) reads it as
            # before (certificates and CRLs alike), and never opens the configured path itself
            text = _read_named(r, ca_file, "client_ca_file", t).decode("ascii", "replace")
            with _pem_files(text) as (path,):
                ctx.load_verify_locations(cafile=path)
        else:
            ctx.load_verify_locations(cadata=ca)
    except ssl.SSLError as e:
        r.fail(
            f"tls_server_config.{ca_name}",
            f"{ca_desc}no PEM certificate in it ({_reason(e)})",
            t.get(ca_name),
        )
    except OSError as e:  # no memfd or temporary file for it (EMFILE)
        r.fail(f"tls_server_config.{ca_name}", f"{ca_desc}{e.strerror or e}", t.get(ca_name))
    if not ctx.cert_store_stats()["x509"]:  # get_ca_certs() would skip a non-CA one
        r.fail(f"tls_server_config.{ca_name}", f"{ca_desc}no PEM certificate in it", t.get(ca_name))


class _NotAFile(Exception):
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
    """Nothing, for a regular file (or /dev/null); else IsADirectoryError or _NotAFile."""
    if stat.S_ISREG(st.st_mode) or (stat.S_ISCHR(st.st_mode) and st.st_rdev == _DEV_NULL):
        return
    if stat.S_ISDIR(st.st_mode):  # as read(2) would say (EISDIR)
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    raise _NotAFile(next((kind for test, kind in _KINDS if test(st.st_mode)), "not a file"))


def _read_file(path: str) -> bytes:
    """The bytes of the regular file at `path`, at most _MAX_FILE of them; OSError, or
    _NotAFile for a FIFO, a device, a socket or a larger file. It never blocks on what is not a
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
            raise _NotAFile(None)
        chunks, size = [], 0
        while size <= _MAX_FILE:  # the file may grow while it is read
            chunk = os.read(fd, _MAX_FILE + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > _MAX_FILE:
            raise _NotAFile(None)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_named(r: _Reader, path: str, name: str, t: dict[str, Any]) -> bytes:
    """The bytes of a file the configuration names (`name`: cert_file, key_file,
    client_ca_file); else a WebConfigError naming the key and the file."""
    try:
        return _read_file(path)
    except OSError as e:
        r.fail(f"tls_server_config.{name}", f"{escaped(path)}: {e.strerror or e}", t.get(name))
    except _NotAFile as e:
        r.fail(
            f"tls_server_config.{name}",
            f"{escaped(path)}: {e.what}",
            t.get(name),
            e.hint("a certificate, key or CA file"),
        )
    raise AssertionError  # not reached


_PEM_LABEL = re.compile(rb"^-----BEGIN ([A-Z0-9 ]{1,40})-----\r?$", re.MULTILINE)


def _refuse_pem(path: str, raw: bytes) -> None:
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


def _reason(e: Exception) -> str:
    """An ssl error's reason without its `(_ssl.c:1234)`."""
    reason = getattr(e, "reason", None)
    text = re.sub(
        r"\s*\(_ssl\.c:\d+\)$",
        "",
        str(e.args[1] if len(e.args) > 1 and isinstance(e.args[1], str) else e),
    )
    return text or str(reason or e)


def _load_chain(
    r: _Reader,
    ctx: ssl.SSLContext,
    t: dict[str, Any],
    cert_file: str,
    key_file: str,
    cert: str,
    key: str,
) -> None:
    """ctx.load_cert_chain() of the certificate and key, from their files or their inline
    PEM text; a WebConfigError naming which one is wrong."""
    cert_name, key_name = (
        ("cert_file" if cert_file else "cert"),
        ("key_file" if key_file else "key"),
    )
    cert_at, key_at = t.get(cert_name), t.get(key_name)
    cert_desc = f"{escaped(cert_file)}: " if cert_file else ""
    key_desc = f"{escaped(key_file)}: " if key_file else ""
    cert_text = _pem(r, cert_file, "cert_file", t) if cert_file else cert
    key_text = _pem(r, key_file, "key_file", t) if key_file else key

    # the certificate alone first, so that a bad one is not blamed on the key
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        probe.load_verify_locations(cadata=cert_text)
    except (ssl.SSLError, ValueError) as e:
        r.fail(
            f"tls_server_config.{cert_name}",
            f"{cert_desc}not a PEM certificate ({_reason(e)})",
            cert_at,
        )

    def no_password():  # else OpenSSL would ask for a passphrase on the terminal
        r.fail(
            f"tls_server_config.{key_name}",
            f"{key_desc}the key is encrypted",
            key_at,
            "give an unencrypted key, readable by the exporter only",
        )

    try:
        # What was read, never the configured paths: load_cert_chain() opens a path with a
        # blocking open(2) and reads it whole, and the file there now may not be the one
        # checked (a FIFO swapped in would hold the event loop).
        with _pem_files(cert_text, key_text) as (c, k):
            ctx.load_cert_chain(c, k, password=no_password)
    except ssl.SSLError as e:
        if getattr(e, "reason", None) == "KEY_VALUES_MISMATCH" or "mismatch" in str(e):
            r.fail(
                f"tls_server_config.{key_name}",
                f"{key_desc}not the key of {cert_name}"
                + (f" {escaped(cert_file)}" if cert_file else ""),
                key_at,
            )
        r.fail(
            f"tls_server_config.{key_name}",
            f"{key_desc}not a PEM private key ({_reason(e)})",
            key_at,
        )
    except OSError as e:  # no memfd or temporary file for them (EMFILE)
        r.fail(f"tls_server_config.{cert_name}", f"{cert_desc}{key_desc}{e.strerror or e}", cert_at)


def _pem(r: _Reader, path: str, name: str, t: dict[str, Any]) -> str:
    data = _read_named(r, path, name, t)
    if b"-----BEGIN " not in data:
        r.fail(
            f"tls_server_config.{name}",
            f"{escaped(path)}: not PEM (no -----BEGIN line)",
            t.get(name),
            "a DER file? openssl x509 -inform der -in FILE -out FILE.pem",
        )
    # PEM is ASCII; text around its blocks (openssl's "Bag Attributes") may not be
    return data.decode("ascii", "replace").replace("\ufffd", "?")


class _pem_files:
    """Readable paths holding PEM texts (the cert and key, read or inline; the client CA read)
    for load_cert_chain() and load_verify_locations(cafile=), which take paths only: memfds
    (Linux: nothing on any file system) or, elsewhere, a private temporary directory; all gone
    when the block ends."""

    def __init__(self, *texts: str):
        self.texts = texts
        self.fds: list[int] = []
        self.tmp: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> list[str]:
        try:
            return self._write()
        except BaseException:
            self.__exit__()
            raise

    def _write(self) -> list[str]:
        paths = []
        memfd = getattr(os, "memfd_create", None)
        if memfd is not None and os.path.isdir("/proc/self/fd"):
            for i, text in enumerate(self.texts):
                fd = memfd(f"ibtool-web-{i}", getattr(os, "MFD_CLOEXEC", 0))
                self.fds.append(fd)
                data = memoryview(text.encode())
                while data:
                    data = data[os.write(fd, data) :]
                paths.append(f"/proc/self/fd/{fd}")
        else:
            self.tmp = tempfile.TemporaryDirectory(prefix="ibtool-web-")  # mode 0700
            for i, text in enumerate(self.texts):
                p = os.path.join(self.tmp.name, f"{i}.pem")
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                paths.append(p)
        return paths

    def __exit__(self, *exc: object) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None


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
        self._cache = _AuthCache()  # kept across reloads, as web/handler.go keeps its cache
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

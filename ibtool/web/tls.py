"""tls_server_config of a web configuration file: each key checked as exporter-toolkit checks
it (web/tls_config.go), then the ssl.SSLContext built from them, once, to prove that the
certificate, key and client CA load.

What Python's ssl module cannot do is refused with a WebConfigError that says so, never
ignored: client_auth_type RequestClientCert and RequireAnyClientCert (a certificate asked for
and not verified), more than one curve_preferences entry, and X25519 in it. ssl is handed what
was read, never a path to open again (pem_files).

May import ibtool.web.yaml and ibtool.model.names; never ibtool.web.config or ibtool.web.auth.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
import tempfile
import warnings
from typing import Any, Callable

from ibtool.model.names import escaped
from ibtool.web.yaml import NotAFile, Reader, read_file, shown

# web/tls_config.go: the keys of TLSConfig
TLS_KEYS = (
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


def go_ip(text: str) -> str:
    """An IP address as Go's net.IP.String() writes it (OpenSSL writes IPv6 in full)."""
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        return text
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def load_tls(r: Reader, config: Any, node: Any, base: str) -> None:
    """tls_server_config: every key checked, then the SSLContext built from them, set on
    `config` (a WebConfig: its tls, client_allowed_sans, _files and _context)."""
    t = r.mapping(node, "tls_server_config", TLS_KEYS) or {}
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


def _check_sources(r: Reader, t: dict[str, Any], node: Any, s: Callable[[str], str]) -> None:
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


def _client_auth(r: Reader, t: dict[str, Any], auth_name: str, has_ca: bool) -> ssl.VerifyMode:
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
            f"unknown value {shown(auth_name)}",
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
    r: Reader, t: dict[str, Any], s: Callable[[str], str]
) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    """min_version and max_version (default TLS12 to TLS13, as web/tls_config.go)."""
    versions = {}
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = s(name) or default
        if value not in _VERSIONS:
            r.fail(
                f"tls_server_config.{name}",
                f"unknown TLS version {shown(value)}",
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


def _ciphers(r: Reader, t: dict[str, Any], minimum: ssl.TLSVersion) -> list[str]:
    """cipher_suites in Go's names as OpenSSL's (TLS 1.2; TLS 1.3's are fixed, as in Go)."""
    ciphers: list[str] = []
    suites = r.strings(t.get("cipher_suites"), "tls_server_config.cipher_suites") or []
    for i, (name, item) in enumerate(suites):
        if name in _CIPHERS_TLS12:
            ciphers.append(_CIPHERS_TLS12[name])
        elif name not in _CIPHERS_TLS13:
            r.fail(
                f"tls_server_config.cipher_suites[{i}]",
                f"unknown cipher suite {shown(name)}",
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


def _curves(r: Reader, t: dict[str, Any]) -> list[str]:
    """curve_preferences: one NIST curve at most, the one ssl's set_ecdh_curve takes."""
    curves = r.strings(t.get("curve_preferences"), "tls_server_config.curve_preferences") or []
    for i, (name, item) in enumerate(curves):
        if name not in _CURVES:
            r.fail(
                f"tls_server_config.curve_preferences[{i}]",
                f"unknown curve {shown(name)}",
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


def _load_client_ca(r: Reader, ctx: ssl.SSLContext, t: dict[str, Any], ca_file: str, ca: str):
    """The CA client certificates are verified against, from its file or inline."""
    ca_name = "client_ca_file" if ca_file else "client_ca"
    ca_desc = f"{escaped(ca_file)}: " if ca_file else ""
    try:
        if ca_file:
            # what was read, handed over as a file: load_verify_locations(cafile=) reads it as
            # before (certificates and CRLs alike), and never opens the configured path itself
            text = _read_named(r, ca_file, "client_ca_file", t).decode("ascii", "replace")
            with pem_files(text) as (path,):
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


def _read_named(r: Reader, path: str, name: str, t: dict[str, Any]) -> bytes:
    """The bytes of a file the configuration names (`name`: cert_file, key_file,
    client_ca_file); else a WebConfigError naming the key and the file."""
    try:
        return read_file(path)
    except OSError as e:
        r.fail(f"tls_server_config.{name}", f"{escaped(path)}: {e.strerror or e}", t.get(name))
    except NotAFile as e:
        r.fail(
            f"tls_server_config.{name}",
            f"{escaped(path)}: {e.what}",
            t.get(name),
            e.hint("a certificate, key or CA file"),
        )
    raise AssertionError  # not reached


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
    r: Reader,
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
        with pem_files(cert_text, key_text) as (c, k):
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


def _pem(r: Reader, path: str, name: str, t: dict[str, Any]) -> str:
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


class pem_files:
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

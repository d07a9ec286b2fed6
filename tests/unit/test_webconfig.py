"""ibtool.web.config: exporter-toolkit's web configuration file, checked strictly; its TLS context
tried in real handshakes over socketpairs; bcrypt basic auth and its cache; the Watcher."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import ssl
import sys
import threading
from pathlib import Path

import pytest

from ibtool.errors import DataError, ExitCode, UnsupportedError
from ibtool.web import config as webconfig
from ibtool.web.auth import AuthCache
from ibtool.web.config import Watcher, WebConfigError, load

bcrypt = pytest.importorskip("bcrypt")
pytest.importorskip("yaml")

TLS = Path(__file__).resolve().parents[1] / "fixtures" / "tls"


def pem(name: str) -> str:
    return (TLS / name).read_text()


def hashed(password: bytes) -> str:
    return bcrypt.hashpw(password, bcrypt.gensalt(rounds=4)).decode()


def write(path: Path, text: str | bytes) -> str:
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    return str(path)


SERVER = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n"


def handshake(
    server: ssl.SSLContext,
    *,
    cert: str | None = None,
    maximum: ssl.TLSVersion | None = None,
    cafile: str = "ca.pem",
) -> tuple[bool, dict | None, bytes | None]:
    """A client (trusting `cafile`, presenting `cert` if given) against `server` over a
    socketpair; whether a byte went there and back, the client certificate the server got,
    and the server certificate (DER) the client got."""
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    got: dict = {}

    def serve():
        try:
            with server.wrap_socket(a, server_side=True) as s:
                got["peer"] = s.getpeercert()
                s.recv(1)
                s.sendall(b"ok")
        except (ssl.SSLError, OSError):
            a.close()

    th = threading.Thread(target=serve)
    th.start()
    client = ssl.create_default_context(cafile=str(TLS / cafile))
    if cert:
        client.load_cert_chain(str(TLS / f"{cert}.pem"), str(TLS / f"{cert}.key"))
    if maximum:
        client.maximum_version = maximum
    served = None
    try:
        with client.wrap_socket(b, server_hostname="localhost") as c:
            served = c.getpeercert(binary_form=True)
            c.sendall(b"x")
            ok = c.recv(2) == b"ok"
    except (ssl.SSLError, OSError):
        ok = False
    finally:
        b.close()
    th.join(10)
    return ok, got.get("peer"), served


# -- what loads ------------------------------------------------------------------------------


def test_an_empty_file_sets_nothing(tmp_path):
    c = load(write(tmp_path / "web.yml", ""))
    assert (c.tls, c.users, c.headers, c.ssl_context()) == (False, {}, [], None)
    assert c.files() == [str(tmp_path / "web.yml")]
    assert c.authorized(None) and c.allowed_peer(None)


def test_null_sections_set_nothing(tmp_path):
    c = load(
        write(tmp_path / "web.yml", "tls_server_config:\nhttp_server_config:\nbasic_auth_users:\n")
    )
    assert (c.tls, c.users, c.headers, c.ssl_context()) == (False, {}, [], None)


def test_relative_paths_are_relative_to_the_file(certs, monkeypatch):
    monkeypatch.chdir("/")
    path = write(
        certs / "web.yml",
        SERVER + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n",
    )
    c = load(path)
    assert c.tls
    assert c.files() == [
        path,
        str(certs / "server.pem"),
        str(certs / "server.key"),
        str(certs / "ca.pem"),
    ]
    assert c.ssl_context().verify_mode == ssl.CERT_REQUIRED


def test_a_full_config(certs):
    h = hashed(b"secret")
    c = load(
        write(
            certs / "web.yml",
            SERVER + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.pem\n"
            "  min_version: TLS12\n  max_version: TLS12\n"
            "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]\n"
            "  prefer_server_cipher_suites: false\n  curve_preferences: [CurveP256]\n"
            "http_server_config:\n  http2: false\n  headers:\n"
            "    X-Frame-Options: deny\n    X-XSS-Protection: 1\n    Content-Security-Policy: ''\n"
            "    Strict-Transport-Security: max-age=31536000; includeSubDomains\n"
            f"basic_auth_users:\n  alice: '{h}'\n"
            "rate_limit:\n  interval: 0s\n  burst: 20\n",
        )
    )
    ctx = c.ssl_context()
    assert ctx.verify_mode == ssl.CERT_OPTIONAL
    assert ctx.minimum_version == ctx.maximum_version == ssl.TLSVersion.TLSv1_2
    assert not ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    assert ctx.options & ssl.OP_NO_COMPRESSION
    assert [x["name"] for x in ctx.get_ciphers() if x["protocol"] != "TLSv1.3"] == [
        "ECDHE-ECDSA-AES128-GCM-SHA256"
    ]
    # a blank header is unset; `1` is taken as written, as Go's yaml does for a string
    assert c.headers == [
        ("X-Frame-Options", "deny"),
        ("X-XSS-Protection", "1"),
        ("Strict-Transport-Security", "max-age=31536000; includeSubDomains"),
    ]
    assert c.users == {"alice": h} and c.http2 is False
    assert handshake(ctx, maximum=ssl.TLSVersion.TLSv1_2)[0]


def test_the_defaults_are_exporter_toolkits(certs):
    ctx = load(write(certs / "web.yml", SERVER)).ssl_context()
    assert ctx.verify_mode == ssl.CERT_NONE
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE


def test_inline_cert_and_key_leave_nothing_behind(tmp_path):
    def indent(text):
        return "".join("    " + line + "\n" for line in text.splitlines())

    path = write(
        tmp_path / "web.yml",
        "tls_server_config:\n  cert: |\n"
        + indent(pem("server.pem"))
        + "  key: |\n"
        + indent(pem("server.key"))
        # client_ca inline too
        + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca: |\n"
        + indent(pem("ca.pem")),
    )
    fds = set(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else set()
    c = load(path)
    if fds:
        assert set(os.listdir("/proc/self/fd")) <= fds
    assert sorted(os.listdir(tmp_path)) == ["web.yml"]
    assert c.files() == [path]
    assert handshake(c.ssl_context(), cert="client")[0]
    assert not handshake(c.ssl_context())[0]


# -- what does not ---------------------------------------------------------------------------

BAD = {
    "unknown key": ("foo: 1\n", ["foo (line 1): unknown key"]),
    "unknown nested key": (
        "tls_server_config:\n  cert_filse: server.pem\n",
        ["tls_server_config.cert_filse (line 2): unknown key"],
    ),
    "set twice": (
        "basic_auth_users:\nbasic_auth_users:\n",
        ["basic_auth_users (line 2): set twice"],
    ),
    "empty tls section": ("tls_server_config: {}\n", ["cert_file is missing"]),
    "missing key_file": (
        "tls_server_config:\n  cert_file: server.pem\n",
        ["tls_server_config", "key_file is missing"],
    ),
    "empty cert_file": (
        "tls_server_config:\n  cert_file: ''\n  key_file: server.key\n",
        ["cert_file is missing"],
    ),
    "cert and cert_file": (
        SERVER + "  cert: x\n",
        ["both cert and cert_file are set"],
    ),
    "section not a mapping": (
        "tls_server_config: [a]\n",
        ["tls_server_config (line 1): must be a mapping"],
    ),
    "bad client_auth_type": (
        SERVER + "  client_auth_type: Maybe\n",
        ["tls_server_config.client_auth_type (line 4): unknown value 'Maybe'"],
    ),
    "CA missing, RequireAndVerifyClientCert": (
        SERVER + "  client_auth_type: RequireAndVerifyClientCert\n",
        ["tls_server_config.client_ca_file", "needs client_ca_file"],
    ),
    "CA missing, VerifyClientCertIfGiven": (
        SERVER + "  client_auth_type: VerifyClientCertIfGiven\n",
        ["tls_server_config.client_ca_file", "needs client_ca_file"],
    ),
    "CA without a client auth type": (
        SERVER + "  client_ca_file: ca.pem\n",
        ["tls_server_config.client_ca_file", "without a client_auth_type"],
    ),
    "CA that is not a certificate": (
        SERVER + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.key\n",
        ["tls_server_config.client_ca_file (line 5): ", "ca.key: no PEM certificate"],
    ),
    "CA file empty": (
        SERVER + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: /dev/null\n",
        ["tls_server_config.client_ca_file (line 5): /dev/null: no PEM certificate"],
    ),
    "sans without verification": (
        SERVER + "  client_allowed_sans: [prometheus]\n",
        [
            "tls_server_config.client_allowed_sans",
            "needs client_auth_type RequireAndVerifyClientCert",
        ],
    ),
    "bad version": (
        SERVER + "  min_version: TLS14\n",
        ["tls_server_config.min_version (line 4): unknown TLS version 'TLS14'"],
    ),
    "min above max": (
        SERVER + "  min_version: TLS13\n  max_version: TLS12\n",
        ["TLS13 is above max_version TLS12"],
    ),
    "unknown cipher": (
        SERVER + "  cipher_suites:\n  - TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA2048\n",
        ["tls_server_config.cipher_suites[0] (line 5): unknown cipher suite"],
    ),
    "TLS 1.3 suites only": (
        SERVER + "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
        ["names TLS 1.3 suites only"],
    ),
    "unknown curve": (
        SERVER + "  curve_preferences: [CurveP257]\n",
        ["tls_server_config.curve_preferences[0]", "unknown curve 'CurveP257'"],
    ),
    "X25519": (
        SERVER + "  curve_preferences: [X25519]\n",
        ["X25519 cannot be set through Python's ssl"],
    ),
    "two curves": (
        SERVER + "  curve_preferences: [CurveP256, CurveP384]\n",
        ["tls_server_config.curve_preferences", "sets one curve, not a list"],
    ),
    "not a bool": (
        "http_server_config:\n  http2: maybe\n",
        ["http_server_config.http2 (line 2): must be true or false"],
    ),
    "header not allowed": (
        "http_server_config:\n  headers:\n    Content-Type: foo\n",
        ["http_server_config.headers.Content-Type (line 3): this header cannot be set"],
    ),
    "header value not allowed": (
        "http_server_config:\n  headers:\n    X-Frame-Options: foo\n",
        ["http_server_config.headers.X-Frame-Options", "'foo' is not allowed"],
    ),
    "header on two lines": (
        'http_server_config:\n  headers:\n    Content-Security-Policy: "a\\nb"\n',
        [
            "http_server_config.headers.Content-Security-Policy (line 3): ",
            "printable ASCII on one line",
        ],
    ),
    "rate limited": (
        "rate_limit:\n  interval: 1s\n  burst: 20\n",
        ["rate_limit.interval", "does not rate-limit"],
    ),
    "bad duration": ("rate_limit:\n  interval: soon\n", ["rate_limit.interval", "not a duration"]),
    "non-bcrypt hash": (
        "basic_auth_users:\n  john: doe-the-password\n",
        ["basic_auth_users.john (line 2): not a bcrypt hash"],
    ),
    "missing cert file": (
        "tls_server_config:\n  cert_file: nowhere.pem\n  key_file: server.key\n",
        ["tls_server_config.cert_file (line 2)", "nowhere.pem: No such file or directory"],
    ),
    "unreadable cert file": (
        "tls_server_config:\n  cert_file: .\n  key_file: server.key\n",
        ["tls_server_config.cert_file", "Is a directory"],
    ),
    "cert that is a key": (
        "tls_server_config:\n  cert_file: server.key\n  key_file: server.key\n",
        ["tls_server_config.cert_file (line 2)", "not a PEM certificate"],
    ),
    "key that does not match": (
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server2.key\n",
        [
            "tls_server_config.key_file (line 3)",
            "server2.key: not the key of cert_file",
            "server.pem",
        ],
    ),
    "key that is a cert": (
        "tls_server_config:\n  cert_file: server.pem\n  key_file: ca.pem\n",
        ["tls_server_config.key_file", "not a PEM private key"],
    ),
    "encrypted key": (
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server-encrypted.key\n",
        ["tls_server_config.key_file", "the key is encrypted"],
    ),
    "YAML syntax error": (
        "tls_server_config:\n  cert_file: [server.pem\n",
        ["YAML syntax error at line 3"],
    ),
    "two documents": ("a: 1\n---\nb: 2\n", ["YAML syntax error at line 2"]),
    "nested too deeply": ("a: " + "[" * 100000 + "\n", ["YAML nested too deeply"]),
    "not a mapping": ("- a\n- b\n", ["not a mapping", "found a list"]),
    "a scalar": ("hello\n", ["not a mapping", "'hello'"]),
    "not UTF-8": (
        b"basic_auth_users:\n  j\xe9r\xf4me: x\n",
        ["not UTF-8 (byte 0xe9 at offset 21)"],
    ),
}


@pytest.mark.parametrize("text,expected", list(BAD.values()), ids=list(BAD))
def test_a_config_that_cannot_be_used(certs, text, expected):
    path = write(certs / "web.yml", text)
    with pytest.raises(WebConfigError) as e:
        load(path)
    message = e.value.message
    assert message.startswith(f"web config {path}: ")
    assert "\n" not in message and "\n" not in (e.value.hint or "")
    assert "Traceback" not in message and "_ssl.c" not in message
    for part in expected:
        assert part in message


def test_an_error_is_a_data_error_with_a_hint(certs):
    path = write(certs / "web.yml", SERVER + "  client_auth_type: Maybe\n")
    with pytest.raises(DataError) as e:
        load(path)
    assert e.value.exit_code == ExitCode.DATA_ERROR == 7
    assert "RequireAndVerifyClientCert" in e.value.hint


@pytest.mark.parametrize("kind", ["RequestClientCert", "RequireAnyClientCert", "RequireClientCert"])
def test_unverified_client_certificates_are_refused(certs, kind):
    with pytest.raises(WebConfigError) as e:
        load(write(certs / "web.yml", SERVER + f"  client_auth_type: {kind}\n"))
    where = "tls_server_config.client_auth_type (line 4): "
    assert f"{where}{kind} takes a client certificate without verifying it" in str(e.value)
    assert "Python's ssl module cannot do" in str(e.value)
    assert (
        "RequireAndVerifyClientCert" in e.value.hint and "VerifyClientCertIfGiven" in e.value.hint
    )


def test_a_bad_hash_is_not_shown(tmp_path):
    with pytest.raises(WebConfigError) as e:
        load(write(tmp_path / "web.yml", "basic_auth_users:\n  john: hunter2\n"))
    assert "john" in e.value.message and "hunter2" not in e.value.message + (e.value.hint or "")


def test_an_unreadable_file(tmp_path):
    path = str(tmp_path / "nowhere.yml")
    with pytest.raises(WebConfigError) as e:
        load(path)
    assert e.value.message == f"web config {path}: cannot read it: No such file or directory"


def test_without_yaml(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(UnsupportedError) as e:
        load(write(tmp_path / "web.yml", ""))
    assert e.value.message == "--web.config.file needs PyYAML"
    assert "python3-yaml" in e.value.hint


def test_without_bcrypt(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "bcrypt", None)
    assert load(write(tmp_path / "none.yml", "basic_auth_users:\n")).users == {}
    with pytest.raises(UnsupportedError) as e:
        load(write(tmp_path / "web.yml", f"basic_auth_users:\n  alice: '{'$2b$04$' + 'a' * 53}'\n"))
    assert "bcrypt" in e.value.message and "python3-bcrypt" in e.value.hint


# -- handshakes ------------------------------------------------------------------------------


def tls_config(certs: Path, extra: str = "") -> webconfig.WebConfig:
    return load(write(certs / "web.yml", SERVER + extra))


REQUIRE = "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n"
IF_GIVEN = "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.pem\n"


def test_server_only_tls(certs):
    ok, peer, served = handshake(tls_config(certs).ssl_context())
    assert ok and not peer
    assert served == ssl.PEM_cert_to_DER_cert(pem("server.pem"))


def test_a_client_certificate_required(certs):
    ctx = tls_config(certs, REQUIRE).ssl_context()
    assert not handshake(ctx)[0]
    assert not handshake(ctx, cert="other-client")[0]
    ok, peer, _ = handshake(ctx, cert="client")
    assert ok and ("DNS", "prometheus") in peer["subjectAltName"]


def test_a_client_certificate_if_given(certs):
    ctx = tls_config(certs, IF_GIVEN).ssl_context()
    assert handshake(ctx)[0]
    ok, peer, _ = handshake(ctx, cert="client")
    assert ok and peer["subjectAltName"] == (("DNS", "prometheus"),)
    assert not handshake(ctx, cert="other-client")[0]


def test_min_version_tls13_refuses_a_tls12_client(certs):
    ctx = tls_config(certs, "  min_version: TLS13\n").ssl_context()
    assert handshake(ctx)[0]
    assert not handshake(ctx, maximum=ssl.TLSVersion.TLSv1_2)[0]


def test_an_expired_certificate_loads_as_in_exporter_toolkit(certs):
    # Go's tls.X509KeyPair does not look at the dates either: the clients refuse it
    c = load(
        write(
            certs / "web.yml",
            "tls_server_config:\n  cert_file: expired.pem\n  key_file: expired.key\n",
        )
    )
    assert not handshake(c.ssl_context())[0]


def test_client_allowed_sans(certs):
    good = tls_config(certs, REQUIRE + "  client_allowed_sans: [one, prometheus]\n")
    ok, peer, _ = handshake(good.ssl_context(), cert="client")
    assert ok and good.allowed_peer(peer)
    bad = tls_config(certs, REQUIRE + "  client_allowed_sans: [bad]\n")
    assert not bad.allowed_peer(peer)
    assert not bad.allowed_peer(None) and not bad.allowed_peer({})
    assert tls_config(certs, REQUIRE).allowed_peer(None)  # none configured


def test_client_allowed_sans_ip_uri_email(certs):
    c = tls_config(
        certs, REQUIRE + "  client_allowed_sans: ['::1', 10.0.0.1, 'spiffe://x/y', a@b.c]\n"
    )
    # OpenSSL writes an IPv6 address in full; Go's net.IP.String() as ::1
    assert c.allowed_peer({"subjectAltName": (("IP Address", "0:0:0:0:0:0:0:1"),)})
    assert c.allowed_peer({"subjectAltName": (("IP Address", "10.0.0.1\n"),)})
    assert c.allowed_peer({"subjectAltName": (("URI", "spiffe://x/y"),)})
    assert c.allowed_peer({"subjectAltName": (("email", "a@b.c"),)})
    assert not c.allowed_peer({"subjectAltName": (("DirName", "::1"), ("DNS", "a@b.c.d"))})
    assert not c.allowed_peer({"subject": ((("commonName", "::1"),),)})  # the CN is no SAN


# -- basic auth ------------------------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def checks(monkeypatch) -> list:
    """The bcrypt.checkpw calls made."""
    calls = []
    real = bcrypt.checkpw

    def counting(password, hashed):
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    return calls


@pytest.fixture
def users(tmp_path) -> webconfig.WebConfig:
    # $2y$ is what htpasswd writes
    alice = hashed(b"wonderland").replace("$2b$", "$2y$", 1)
    return load(
        write(
            tmp_path / "web.yml",
            f"basic_auth_users:\n  alice: '{alice}'\n  bob: '{hashed(b'builder')}'\n",
        )
    )


def test_basic_auth(users, checks):
    assert users.authorized(basic("alice", "wonderland"))
    assert users.authorized(basic("bob", "builder"))
    assert users.authorized("basic " + basic("bob", "builder")[6:])  # the scheme in any case
    assert not users.authorized(basic("alice", "builder"))
    assert not users.authorized(basic("carol", "wonderland"))
    assert len(checks) == 4  # the lower-case scheme is the same key: cached


def test_an_unknown_user_costs_one_bcrypt_at_the_users_cost(users, checks):
    assert not users.authorized(basic("mallory", "x"))
    assert len(checks) == 1
    assert users._dummy_hash.startswith("$2b$04$")
    assert bcrypt.checkpw(b"x", users._dummy_hash.encode()) is False  # a hash bcrypt takes


def test_checks_are_cached_failed_ones_too(users, checks):
    for _ in range(20):
        assert users.authorized(basic("alice", "wonderland"))
        assert not users.authorized(basic("alice", "guess"))
        assert not users.authorized(basic("mallory", "guess"))
    assert len(checks) == 3


def test_the_cache_key_has_the_hash(tmp_path, checks):
    cache = AuthCache()
    one = load(
        write(tmp_path / "1.yml", f"basic_auth_users:\n  alice: '{hashed(b'one')}'\n"), _cache=cache
    )
    two = load(
        write(tmp_path / "2.yml", f"basic_auth_users:\n  alice: '{hashed(b'two')}'\n"), _cache=cache
    )
    assert one.authorized(basic("alice", "one")) and not two.authorized(basic("alice", "one"))
    assert two.authorized(basic("alice", "two"))
    assert len(checks) == 3


def test_the_cache_is_bounded(users, checks):
    for i in range(250):
        assert not users.authorized(basic("alice", f"guess{i}"))
    assert len(checks) == 250
    assert len(users._cache) <= 100


def test_threads_check_a_password_once(users, checks):
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(users.authorized(basic("bob", "x"))))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [False] * 8 and len(checks) == 1


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Basic",
        "Basic ",
        "Bearer abc",
        "Basic !!!!",
        "Basic YWxpY2U",  # no padding
        "Basic " + base64.b64encode(b"alice-wonderland").decode(),  # no colon
        "Basic " + base64.b64encode(b"alice:wonderland").decode() + "é",
    ],
)
def test_a_malformed_authorization_is_refused_without_bcrypt(users, checks, header):
    assert not users.authorized(header)
    assert checks == []


def test_a_long_or_odd_password_is_refused(users):
    assert not users.authorized(basic("alice", "w" * 100))
    assert not users.authorized("Basic " + base64.b64encode(b"\xff\xfe:\xff").decode())


def test_no_users_no_auth(tmp_path):
    assert load(write(tmp_path / "web.yml", "basic_auth_users: {}\n")).authorized(None)


# -- Watcher ---------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replace(src: Path, dst: Path) -> None:
    """Write a new file, then rename it over `dst`, as a certificate rotation does."""
    tmp = dst.with_name(dst.name + ".new")
    shutil.copy(src, tmp)
    os.replace(tmp, dst)


@pytest.fixture
def rotated(tmp_path) -> tuple[Path, Watcher, list, Clock]:
    for name in ("server.pem", "server.key"):
        shutil.copy(TLS / name, tmp_path / ("cert.pem" if name.endswith(".pem") else "cert.key"))
    path = write(
        tmp_path / "web.yml", "tls_server_config:\n  cert_file: cert.pem\n  key_file: cert.key\n"
    )
    warnings: list[str] = []
    clock = Clock()
    return tmp_path, Watcher(path, warnings.append, clock=clock), warnings, clock


def test_a_rotated_certificate_is_served(rotated):
    d, w, warnings, clock = rotated
    first = w.tls()
    assert handshake(first)[2] == ssl.PEM_cert_to_DER_cert(pem("server.pem"))
    replace(TLS / "server2.key", d / "cert.key")
    replace(TLS / "server2.pem", d / "cert.pem")
    clock.now += 0.5
    assert w.tls() is first  # not looked at yet
    clock.now += 0.6
    second = w.tls()
    assert second is not first and w.current().ssl_context() is second
    assert handshake(second)[2] == ssl.PEM_cert_to_DER_cert(pem("server2.pem"))
    clock.now += 5
    assert w.tls() is second  # nothing changed: not loaded again
    assert warnings == []


def test_a_broken_rewrite_keeps_the_last_good_config_and_warns_once(rotated, monkeypatch):
    d, w, warnings, clock = rotated
    good = w.current()
    replace(TLS / "server2.key", d / "cert.key")  # the key first: it does not match cert.pem
    loads = []
    real = webconfig.load
    monkeypatch.setattr(webconfig, "load", lambda *a, **k: loads.append(1) or real(*a, **k))
    for _ in range(5):
        clock.now += 1.5
        assert w.current() is good
    assert len(warnings) == 1 and len(loads) == 1  # the same broken state is not read every second
    assert "cert.key: not the key of cert_file" in warnings[0]
    assert warnings[0].endswith("keeping the configuration loaded before")
    clock.now += 11
    assert w.current() is good and len(loads) == 2 and len(warnings) == 1  # tried again, quietly
    write(d / "web.yml", "tls_server_config: [\n")  # another broken state: warned about
    clock.now += 1.5
    assert w.current() is good and len(warnings) == 2 and "YAML syntax error" in warnings[1]
    write(d / "web.yml", "tls_server_config:\n  cert_file: cert.pem\n  key_file: cert.key\n")
    replace(TLS / "server2.pem", d / "cert.pem")
    clock.now += 1.5
    fixed = w.current()
    assert fixed is not good and len(warnings) == 2
    assert handshake(fixed.ssl_context())[2] == ssl.PEM_cert_to_DER_cert(pem("server2.pem"))


def test_a_new_file_named_by_the_config_is_watched(rotated):
    d, w, warnings, clock = rotated
    write(d / "web.yml", "tls_server_config:\n  cert_file: new.pem\n  key_file: new.key\n")
    clock.now += 1.5
    w.current()
    assert len(warnings) == 1 and "new.pem: No such file or directory" in warnings[0]
    shutil.copy(TLS / "server2.pem", d / "new.pem")
    shutil.copy(TLS / "server2.key", d / "new.key")
    clock.now += 11  # the old files did not change: found at the next retry
    assert w.current().files()[1] == str(d / "new.pem")
    assert len(warnings) == 1


def test_users_follow_the_file_and_keep_the_cache(tmp_path, checks):
    path = write(tmp_path / "web.yml", f"basic_auth_users:\n  alice: '{hashed(b'one')}'\n")
    clock = Clock()
    w = Watcher(path, pytest.fail, clock=clock)
    assert w.current().authorized(basic("alice", "one"))
    write(
        tmp_path / "web.yml",
        f"basic_auth_users:\n  alice: '{hashed(b'one')}'\n  bob: '{hashed(b'two')}'\n",
    )
    os.utime(path, ns=(1, 1))  # a rewrite within the same clock tick of the file system
    clock.now += 2
    assert w.current().authorized(basic("bob", "two"))
    assert w.tls() is None


def test_tls_is_not_switched_on_or_off_by_a_reload(rotated):
    d, w, warnings, clock = rotated
    good = w.current()
    write(d / "web.yml", "")
    for _ in range(3):
        clock.now += 1.5
        assert w.current() is good
    assert len(warnings) == 1 and "tls_server_config was removed" in warnings[0]
    assert "takes a restart" in warnings[0]

    path = write(d / "plain.yml", "")
    plain = Watcher(path, warnings.append, clock=clock)
    write(d / "plain.yml", "tls_server_config:\n  cert_file: cert.pem\n  key_file: cert.key\n")
    clock.now += 1.5
    assert plain.tls() is None and "tls_server_config was added" in warnings[1]


def test_a_watcher_of_a_bad_file_raises(tmp_path):
    with pytest.raises(WebConfigError):
        Watcher(write(tmp_path / "web.yml", "nope: 1\n"), pytest.fail)

"""ibtool.web.config reading its files as hostile input (issue 38): what an error may quote of a
file that is not a web configuration (a private key, a link to /etc/shadow), and files that are
not files (a FIFO, /dev/zero, a socket) or too large, at start and swapped in while serving.

A FIFO test never hangs the suite if the fix regresses: the call runs in a thread and, past its
time, the FIFO's write end is opened and closed, which ends a blocked open(2) and read(2). What
could read /dev/zero whole runs in a subprocess with a bounded address space."""

from __future__ import annotations

import os
import resource
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest

from ibtool.errors import ExitCode
from ibtool.web import config as webconfig
from ibtool.web.config import Watcher, WebConfigError, load
from tests.fixtures import sysfs_trees
from tests.unit.test_webconfig import SERVER, Clock, handshake, pem, write

pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
SECRET = "Zq8xq1aQS3cr3tHashK9pW2vX7mN4bL6tR0yE5uI"
MEMORY = 2 << 30  # bytes of address space a subprocess gets: a read of /dev/zero ends there


def leaked(secret: str, text: str, run: int = 8) -> list[str]:
    """The runs of `run` characters of `secret` that `text` quotes."""
    return [
        secret[i : i + run] for i in range(len(secret) - run + 1) if secret[i : i + run] in text
    ]


def refused(path: str) -> WebConfigError:
    with pytest.raises(WebConfigError) as e:
        load(path)
    assert e.value.exit_code == ExitCode.DATA_ERROR == 7
    return e.value


def said(e: WebConfigError) -> str:
    return e.message + " " + (e.hint or "")


def unblocking(fifos: list[Path], call: Callable[[], Any], timeout: float = 10) -> Any:
    """call() in a thread; if it has not returned in `timeout` seconds (blocked opening or
    reading a FIFO), each FIFO's write end is opened and closed so that it returns, and the test
    fails. Its exception is raised here."""
    out: dict[str, Any] = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as e:  # handed to the test's thread
            out["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        th.join(timeout)
        pytest.fail(f"blocked on {[str(f) for f in fifos]} for {timeout} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def bounded_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def ibtool(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ibtool", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=bounded_memory,
        timeout=timeout,
    )


# -- secrets quoted in errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("server.key", "holds a PEM private key, not a web configuration"),
        ("server-encrypted.key", "holds a PEM private key, not a web configuration"),
        ("server.pem", "holds a PEM certificate, not a web configuration"),
    ],
)
def test_a_key_given_as_the_config_is_named_not_quoted(certs, name, what):
    path = str(certs / name)
    e = refused(path)
    assert e.message == f"web config {path}: {what}"
    assert "key_file" in e.hint and "cert_file" in e.hint
    for line in (certs / name).read_text().splitlines()[1:-1]:
        assert not leaked(line, said(e)), line


def test_an_ec_key_with_its_parameters_block_first_is_a_private_key(tmp_path):
    text = "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"
    text += pem("server.key").replace("BEGIN PRIVATE", "BEGIN EC PRIVATE")
    path = write(tmp_path / "exporter.key", text.replace("END PRIVATE", "END EC PRIVATE"))
    assert refused(path).message.endswith(": holds a PEM private key, not a web configuration")


def test_a_link_to_a_shadow_file_quotes_a_few_characters_at_most(tmp_path):
    line = f"root:$6${SECRET[:8]}${SECRET}:19000:0:99999:7:::\n"
    write(tmp_path / "shadow", line + "daemon:*:19000:0:99999:7:::\n")
    (tmp_path / "web.yml").symlink_to(tmp_path / "shadow")
    e = refused(str(tmp_path / "web.yml"))
    assert not leaked(line, said(e)), said(e)
    assert "(line 1): unknown key" in e.message


# Every message that shows a value or a key name of the file, each given SECRET.
QUOTING = {
    "a scalar": f"{SECRET}\n",
    "a top-level key": f"{SECRET}: 1\n",
    "a nested key": f"tls_server_config:\n  {SECRET}: 1\n",
    "a section that is a scalar": f"tls_server_config: {SECRET}\n",
    "a key set twice": f"basic_auth_users:\n  {SECRET}: x\n  {SECRET}: y\n",
    "http2": f"http_server_config:\n  http2: {SECRET}\n",
    "a header name": f"http_server_config:\n  headers:\n    {SECRET}: x\n",
    "a header value": f"http_server_config:\n  headers:\n    X-Frame-Options: {SECRET}\n",
    "a user name": f"basic_auth_users:\n  {SECRET}: not-a-hash\n",
    "burst": f"rate_limit:\n  burst: {SECRET}\n",
    "interval": f"rate_limit:\n  interval: {SECRET}\n",
    "client_auth_type": SERVER + f"  client_auth_type: {SECRET}\n",
    "min_version": SERVER + f"  min_version: {SECRET}\n",
    "cipher_suites": SERVER + f"  cipher_suites: [{SECRET}]\n",
    "curve_preferences": SERVER + f"  curve_preferences: [{SECRET}]\n",
    "an undefined alias": f"a: *{SECRET}\n",
    "a duplicate anchor": f"a: &{SECRET} 1\nb: &{SECRET} 2\n",
    "an undefined tag handle": f"a: !{SECRET}!x 1\n",
    "a control character after it": f"a: {SECRET}\x01\n",
    "a byte that is not UTF-8 after it": f"{SECRET}\udcff\n",
}


@pytest.mark.parametrize("text", list(QUOTING.values()), ids=list(QUOTING))
def test_an_error_quotes_at_most_a_short_prefix_of_the_file(certs, text):
    """go-yaml (yaml.v2 decode.go terror), which exporter-toolkit uses, shows a value of more
    than 10 bytes as its first 7 and "...": so here, for values and key names alike."""
    data = text.encode("utf-8", "surrogateescape")
    e = refused(write(certs / "web.yml", data))
    assert not leaked(SECRET, said(e)), said(e)
    assert "\n" not in said(e) and said(e).isprintable()


def test_a_shown_value_is_escaped_and_cut_as_go_yaml_cuts_it(certs):
    e = refused(write(certs / "web.yml", SERVER + '  client_auth_type: "\\e[31m\\u202eX"\n'))
    assert "unknown value '\\x1b[31m\\u202eX'" in e.message and e.message.isprintable()
    e = refused(write(certs / "web.yml", SERVER + "  min_version: TLS1.2-or-later\n"))
    assert "unknown TLS version 'TLS1.2-...'" in e.message
    e = refused(write(certs / "web.yml", SERVER + "  min_version: TLS12_TLS13\n"))
    assert "unknown TLS version 'TLS12_T...'" in e.message  # 11 characters: cut
    e = refused(write(certs / "web.yml", SERVER + "  min_version: TLS12TLS13\n"))
    assert "unknown TLS version 'TLS12TLS13'" in e.message  # 10 characters: shown whole


def test_a_path_with_a_control_character_is_escaped(certs):
    e = refused(
        write(certs / "web.yml", 'tls_server_config:\n  cert_file: "a\\eb"\n  key_file: k\n')
    )
    assert "a\\x1bb: No such file or directory" in e.message and e.message.isprintable()


# -- files that are not files ----------------------------------------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_a_fifo_as_the_config_is_not_a_regular_file(fifo):
    e = unblocking([fifo], lambda: refused(str(fifo)))
    assert e.message == f"web config {fifo}: not a regular file (a FIFO)"
    assert "<(...)" in e.hint


@pytest.mark.parametrize("key", ["cert_file", "key_file", "client_ca_file"])
def test_a_fifo_named_by_the_config_is_not_a_regular_file(certs, fifo, key):
    names = {"cert_file": "server.pem", "key_file": "server.key", "client_ca_file": "ca.pem"}
    names[key] = fifo.name
    text = "tls_server_config:\n" + "".join(f"  {k}: {v}\n" for k, v in names.items())
    path = write(certs / "web.yml", text + "  client_auth_type: RequireAndVerifyClientCert\n")
    e = unblocking([fifo], lambda: refused(path))
    assert f"tls_server_config.{key} (line " in e.message
    assert e.message.endswith(f"): {fifo}: not a regular file (a FIFO)"), e.message
    assert e.hint


def test_a_socket_as_the_config_is_not_a_regular_file(tmp_path):
    path = tmp_path / "web.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        assert refused(str(path)).message.endswith(": not a regular file (a socket)")


def test_dev_null_is_still_an_empty_config():
    c = load(os.devnull)
    assert (c.tls, c.users, c.headers) == (False, {}, [])


def test_a_config_over_one_mib_is_refused_unread(tmp_path):
    big = write(tmp_path / "web.yml", "# " + "x" * (1 << 20) + "\n")
    e = refused(big)
    assert e.message == f"web config {big}: larger than 1 MiB"
    write(tmp_path / "web.yml", "# " + "x" * ((1 << 20) - 3) + "\n")  # 1 MiB exactly: read
    assert load(big).tls is False


def test_a_certificate_file_over_one_mib_is_refused(certs):
    padding = ("#" * 1023 + "\n") * 1025  # OpenSSL skips text around PEM blocks
    write(certs / "big.pem", pem("server.pem") + padding)
    path = write(
        certs / "web.yml", "tls_server_config:\n  cert_file: big.pem\n  key_file: server.key\n"
    )
    e = refused(path)
    assert e.message.endswith(
        f"tls_server_config.cert_file (line 2): {certs / 'big.pem'}: larger than 1 MiB"
    )


def test_ssl_is_given_what_was_read_never_a_path_to_open_again(certs, monkeypatch):
    """load_cert_chain() and load_verify_locations() open the paths they get with a blocking
    open(2): a FIFO or /dev/zero swapped in after the check would hold them. They get what was
    read, checked and bounded."""
    given: list[str] = []
    for name in ("load_cert_chain", "load_verify_locations"):
        real = getattr(ssl.SSLContext, name)

        def spy(self, *args, _real=real, **kwargs):
            given.extend(str(a) for a in (*args, *kwargs.values()) if isinstance(a, (str, Path)))
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(ssl.SSLContext, name, spy)
    path = write(
        certs / "web.yml",
        SERVER + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n",
    )
    c = load(path)
    named = {str(certs / n) for n in ("server.pem", "server.key", "ca.pem")}
    assert given and not named & set(given), given
    assert handshake(c.ssl_context(), cert="client")[0]


# -- swapped in while serving ----------------------------------------------------------------


@pytest.fixture
def serving(certs) -> tuple[Path, Watcher, list, Clock]:
    path = write(
        certs / "web.yml",
        SERVER + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n",
    )
    warnings: list[str] = []
    clock = Clock()
    return certs, Watcher(path, warnings.append, clock=clock), warnings, clock


@pytest.mark.parametrize("swapped", ["web.yml", "server.pem", "server.key", "ca.pem"])
def test_a_fifo_swapped_in_keeps_the_last_good_config_with_one_warning(serving, swapped):
    d, w, warnings, clock = serving
    good = w.current()
    os.mkfifo(d / "new")
    os.replace(d / "new", d / swapped)
    for _ in range(3):
        clock.now += 1.5
        assert unblocking([d / swapped], w.tls) is good.ssl_context()
    assert len(warnings) == 1, warnings
    assert f"{d / swapped}: not a regular file (a FIFO)" in warnings[0]
    assert warnings[0].startswith(f"web config {d / 'web.yml'}: ")
    assert warnings[0].endswith("; keeping the configuration loaded before")
    assert handshake(w.tls(), cert="client")[0]


def test_an_oversized_rewrite_keeps_the_last_good_config_with_one_warning(serving):
    d, w, warnings, clock = serving
    good = w.current()
    write(d / "web.yml", SERVER + "#" * (2 << 20) + "\n")
    for _ in range(3):
        clock.now += 1.5
        assert w.current() is good
    assert len(warnings) == 1 and "larger than 1 MiB" in warnings[0]


def test_a_reload_that_fails_unexpectedly_keeps_the_last_good_config(serving, monkeypatch):
    d, w, warnings, clock = serving
    good = w.current()

    def broken(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(webconfig, "load", broken)
    os.utime(d / "web.yml", ns=(1, 1))
    for _ in range(3):
        clock.now += 1.5
        assert w.current() is good
    assert len(warnings) == 1 and "MemoryError" in warnings[0], warnings
    assert warnings[0].endswith("; keeping the configuration loaded before")


# -- the command -----------------------------------------------------------------------------


def zero(tmp_path: Path) -> Path:
    (tmp_path / "zero").symlink_to("/dev/zero")
    return tmp_path / "zero"


START = {
    "config FIFO": ("fifo", None, "a FIFO"),
    "config /dev/zero": ("zero", None, "a character device"),
    "cert_file FIFO": ("fifo", "cert_file", "a FIFO"),
    "cert_file /dev/zero": ("zero", "cert_file", "a character device"),
    "client_ca_file /dev/zero": ("zero", "client_ca_file", "a character device"),
}


@pytest.mark.parametrize(("kind", "key", "what"), list(START.values()), ids=list(START))
def test_at_start_one_line_not_a_regular_file_and_exit_7(certs, kind, key, what):
    bad = zero(certs) if kind == "zero" else certs / "fifo"
    if kind == "fifo":
        os.mkfifo(bad)
    config = str(bad)
    if key is not None:
        names = {"cert_file": "server.pem", "key_file": "server.key", "client_ca_file": "ca.pem"}
        names[key] = str(bad)
        text = "tls_server_config:\n" + "".join(f"  {k}: {v}\n" for k, v in names.items())
        config = write(certs / "web.yml", text + "  client_auth_type: VerifyClientCertIfGiven\n")
    got = ibtool("exporter", "--listen", "127.0.0.1:0", "--web.config.file", config)
    assert (got.returncode, got.stdout) == (7, ""), got.stderr
    lines = got.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ibtool: error: web config {config}: "), lines
    assert f"{bad}: not a regular file ({what}) (hint: " in lines[0], lines


def scrape(url: str) -> tuple[int, Any, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.headers, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, ""


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_fifo_or_dev_zero_swapped_in_while_serving_is_one_warning(tmp_path, kind):
    """The hostile swap of issue 38: the config replaced by a FIFO (the event loop blocked in
    open(2) on the next connection, SIGTERM not heard) or by a link to /dev/zero (every
    connection closed: `TLS for 127.0.0.1: MemoryError`, TLS off). The scrapes go on with the
    last good config, one warning names the file, SIGTERM stops it."""
    config = write(
        tmp_path / "web.yml", "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "--root", str(root), "exporter"]
        + ["--listen", "127.0.0.1:0", "--interval", "1", "--web.config.file", config],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=bounded_memory,
    )
    err: list[str] = []

    def read() -> None:
        for ln in proc.stderr:
            err.append(ln)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving http://"), line + "".join(err)
        url = line.split()[1]

        def served() -> str:
            status, headers, body = scrape(url)
            assert status == 200 and headers["X-Frame-Options"] == "deny", (status, err)
            return body

        def polls() -> float:
            return float(served().split("\nibtool_exporter_polls_total ")[1].split()[0])

        wait_until(lambda: polls() >= 1, "a first poll")
        if kind == "fifo":
            os.mkfifo(tmp_path / "new")
        else:
            (tmp_path / "new").symlink_to("/dev/zero")
        os.replace(tmp_path / "new", config)
        warned = lambda: [ln for ln in err if "web config" in ln]  # noqa: E731
        wait_until(lambda: served() is not None and warned(), "a warning")
        first = polls()
        wait_until(lambda: polls() >= first + 2, "two more polls")
        what = "a FIFO" if kind == "fifo" else "a character device"
        assert len(warned()) == 1, err
        assert f"web config {config}: not a regular file ({what})" in warned()[0]
        assert "keeping the configuration loaded before" in warned()[0]
        assert not [ln for ln in err if "TLS for" in ln], err
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 143
    finally:
        if proc.poll() is None:
            if kind == "fifo":  # a reader blocked in open(2) or read(2) of it: let it go
                try:
                    os.close(os.open(config, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
            proc.kill()
            proc.wait(20)
        reader.join(10)
        proc.stdout.close()
        proc.stderr.close()

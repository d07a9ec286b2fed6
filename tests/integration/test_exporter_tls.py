"""`ibtool exporter --web.config.file` on the real kernel: Prometheus itself scrapes the rxe pair's
metrics through TLS with a client certificate and basic auth; curl with the CA gets them, a
wrong password is 401, a client without a certificate fails the handshake."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

TLS = Path(__file__).resolve().parents[1] / "fixtures" / "tls"
PASSWORD = "s3cret scrape"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def exporter(testbed, tmp_path):
    """ibtool exporter on 127.0.0.1 with TLS (client certificates required) and a user."""
    import bcrypt

    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    config = tmp_path / "web.yml"
    config.write_text(
        "tls_server_config:\n"
        f"  cert_file: {TLS / 'server.pem'}\n"
        f"  key_file: {TLS / 'server.key'}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {TLS / 'ca.pem'}\n"
        "basic_auth_users:\n"
        f"  prometheus: '{hashed}'\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "exporter", "--listen", "127.0.0.1:0"]
        + ["--interval", "1", "--web.config.file", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving https://127.0.0.1:"), line + proc.stderr.read()
        yield line.split()[1]
    finally:
        proc.terminate()
        assert proc.wait(30) == 143


def curl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [shutil.which("curl") or "curl", "-sS", "--max-time", "60", *args],
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_curl_with_the_ca_a_certificate_and_the_password_gets_the_metrics(exporter, testbed):
    good = ["--cacert", str(TLS / "ca.pem"), "--cert", str(TLS / "client.pem")]
    good += ["--key", str(TLS / "client.key")]
    deadline = time.monotonic() + 120
    while True:
        got = curl(*good, "-u", f"prometheus:{PASSWORD}", exporter)
        if got.returncode == 0 and "ibtool_exporter_poll_duration_seconds" in got.stdout:
            break
        assert time.monotonic() < deadline, f"no poll within 120 s: {got.stderr}"
        time.sleep(0.5)
    assert f'ibtool_port_state_id{{device="{testbed["device"]}",port="1"}} 4.0' in got.stdout
    wrong = curl(*good, "-u", "prometheus:wrong", "-o", "/dev/null", "-w", "%{http_code}", exporter)
    assert wrong.stdout == "401", wrong.stderr
    nobody = curl(*good, "-o", "/dev/null", "-w", "%{http_code}", exporter)
    assert nobody.stdout == "401", nobody.stderr
    # No client certificate: the TLS handshake itself fails, before any HTTP.
    bare = curl("--cacert", str(TLS / "ca.pem"), "-u", f"prometheus:{PASSWORD}", exporter)
    assert bare.returncode != 0 and not bare.stdout, (bare.returncode, bare.stdout)
    # A certificate from another CA is refused as well.
    other = ["--cacert", str(TLS / "ca.pem"), "--cert", str(TLS / "other-client.pem")]
    stranger = curl(*other, "--key", str(TLS / "other-client.key"), exporter)
    assert stranger.returncode != 0 and not stranger.stdout
    # Plain HTTP at the TLS port is not answered with metrics.
    plain = curl(exporter.replace("https://", "http://"))
    assert "ibtool_" not in plain.stdout


def test_prometheus_scrapes_it_through_tls_config_and_basic_auth(exporter, testbed, tmp_path):
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is not installed (tests/testbed/testbed deps installs it)"
    target = urllib.parse.urlsplit(exporter).netloc
    (tmp_path / "password").write_text(PASSWORD)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n"
        "scrape_configs:\n"
        "  - job_name: ibtool\n"
        "    scheme: https\n"
        "    tls_config:\n"
        f"      ca_file: {TLS / 'ca.pem'}\n"
        f"      cert_file: {TLS / 'client.pem'}\n"
        f"      key_file: {TLS / 'client.key'}\n"
        "    basic_auth:\n"
        "      username: prometheus\n"
        f"      password_file: {tmp_path / 'password'}\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
        "  - job_name: wrong-password\n"
        "    scheme: https\n"
        "    tls_config:\n"
        f"      ca_file: {TLS / 'ca.pem'}\n"
        f"      cert_file: {TLS / 'client.pem'}\n"
        f"      key_file: {TLS / 'client.key'}\n"
        "    basic_auth:\n      username: prometheus\n      password: wrong\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}"]
        + [f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        deadline, found = time.monotonic() + 180, {}
        while True:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            try:
                with urllib.request.urlopen(f"{api}/targets", timeout=30) as reply:
                    targets = json.load(reply)["data"]["activeTargets"]
                found = {t["labels"]["job"]: t for t in targets}
                device_up = query(api, f'ibtool_port_state_id{{device="{testbed["device"]}"}}')
            except OSError:
                found, device_up = {}, []
            if (
                found.get("ibtool", {}).get("health") == "up"
                and "401" in found.get("wrong-password", {}).get("lastError", "")
                and device_up
            ):
                break
            assert time.monotonic() < deadline, f"targets after 180 s: {found}"
            time.sleep(0.5)
        assert found["wrong-password"]["health"] == "down"
        assert device_up[0]["value"][1] == "4"
        assert query(api, 'up{job="ibtool"}')[0]["value"][1] == "1"
    finally:
        proc.terminate()
        proc.wait(60)


def query(api: str, expr: str) -> list:
    url = f"{api}/query?query={urllib.parse.quote(expr)}"
    with urllib.request.urlopen(url, timeout=30) as reply:
        return json.load(reply)["data"]["result"]

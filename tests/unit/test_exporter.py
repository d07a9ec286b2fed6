"""`ibtool exporter`: the latest poll served to Prometheus; a slow or failing poll never holds a
scrape."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ibtool.api import MetricFamily, exposition
from ibtool.errors import UsageError
from ibtool.live.exporter import parse_listen, serve
from tests.fixtures import sysfs_trees

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "listen"),
    [
        (":9877", ("", 9877)),
        ("9877", ("", 9877)),
        ("127.0.0.1:9877", ("127.0.0.1", 9877)),
        ("[::1]:9877", ("::1", 9877)),
        ("node1:0", ("node1", 0)),
    ],
)
def test_listen_addresses(text, listen):
    assert parse_listen(text) == listen


@pytest.mark.parametrize("text", ["", "::1:9877", "host:", "host:70000", "host:port"])
def test_bad_listen_addresses_are_usage_errors(text):
    with pytest.raises(UsageError):
        parse_listen(text)


def family(value: float) -> list[MetricFamily]:
    f = MetricFamily("ibtool_port_rate", "Port signalling rate", "gauge", "bytes_per_second")
    f.add({"device": "mlx5_0", "port": "1"}, value)
    return [f]


class Served:
    """serve() in a thread on a free port of 127.0.0.1, stopped afterwards."""

    def __init__(self, poll, interval: float = 0.05):
        self.warnings: list[str] = []
        self.stop = threading.Event()
        bound = threading.Event()

        def ready(address):
            self.url = f"http://127.0.0.1:{address[1]}/metrics"
            bound.set()

        self.thread = threading.Thread(
            target=serve,
            args=(("127.0.0.1", 0), poll, interval, self.warnings.append),
            kwargs={"stop": self.stop, "ready": ready, "clock": lambda: 1795000000.0},
            daemon=True,
        )
        self.thread.start()
        assert bound.wait(10)

    def scrape(self) -> tuple[str, float]:
        began = time.monotonic()
        with urllib.request.urlopen(self.url, timeout=10) as reply:
            body = reply.read().decode()
        return body, time.monotonic() - began

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def served():
    running = []

    def start(poll, interval: float = 0.05) -> Served:
        running.append(Served(poll, interval))
        return running[-1]

    yield start
    for s in running:
        s.close()


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_scrape_gets_the_families_as_the_textfile_writes_them(served):
    s = served(lambda: family(1.25e10))
    wait_until(lambda: "ibtool_port_rate" in s.scrape()[0], "a first poll")
    body, _ = s.scrape()
    assert body.startswith(exposition(family(1.25e10)))
    assert "ibtool_exporter_polls_total " in body
    assert "ibtool_exporter_last_poll_timestamp_seconds 1.795e+09\n" in body


def test_a_slow_poll_never_holds_a_scrape(served):
    release = threading.Event()
    polls = []

    def poll():
        polls.append(1)
        if len(polls) > 1:
            release.wait(30)  # a device that takes its time to answer
        return family(len(polls))

    s = served(poll)
    try:
        wait_until(lambda: len(polls) >= 2, "the second poll to start")
        body, took = s.scrape()
        assert took < 5
        assert 'ibtool_port_rate_bytes_per_second{device="mlx5_0",port="1"} 1.0' in body
        assert "ibtool_exporter_polls_total 1.0" in body
    finally:
        release.set()


def test_a_failing_poll_is_a_warning_and_the_last_families_stay(served):
    polls = []

    def poll():
        polls.append(1)
        if len(polls) > 1:
            raise OSError(5, "Input/output error")
        return family(7)

    s = served(poll)
    wait_until(lambda: len(polls) >= 3, "two failed polls")
    body, _ = s.scrape()
    assert 'ibtool_port_rate_bytes_per_second{device="mlx5_0",port="1"} 7.0' in body
    assert "ibtool_exporter_poll_errors_total" in body
    assert s.warnings[0] == "poll failed: OSError: [Errno 5] Input/output error"


def test_the_command_serves_the_health_and_every_counter_of_the_host(tmp_path):
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "--root", str(root), "exporter"]
        + ["--listen", "127.0.0.1:0", "--interval", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[1]
        deadline = time.monotonic() + 30
        body = ""
        while "ibtool_health_status" not in body and time.monotonic() < deadline:
            with urllib.request.urlopen(url, timeout=10) as reply:
                body = reply.read().decode()
            time.sleep(0.05)
        assert "ibtool_health_status 2.0\n" in body  # mlx5_0/2 is down
        assert 'ibtool_port_xmit_data_bytes_total{device="mlx5_0",port="1"}' in body
        assert 'ibtool_hw_statistic_total{device="mlx5_0",name="out_of_buffer",port="1"} 17.0' in (
            body
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143


# -- the HTTP endpoint --------------------------------------------------------------------------


def request(url: str, method: str = "GET", headers: dict | None = None):
    """(status, headers, body) of one request; an HTTP error status is an answer too."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status, reply.headers, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_metrics_answers_get_and_head_the_landing_page_links_it_and_nothing_else_is_served(
    served,
):
    s = served(lambda: family(3))
    wait_until(lambda: "ibtool_port_rate" in s.scrape()[0], "a first poll")
    status, headers, body = request(s.url, "HEAD")
    assert (status, body) == (200, b"")
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert int(headers["Content-Length"]) > 100
    status, headers, body = request(s.url.replace("/metrics", "/"))
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert b'<a href="/metrics">/metrics</a>' in body
    assert request(s.url.replace("/metrics", "/metrics/x"))[0] == 404
    assert request(s.url.replace("/metrics", "/favicon.ico"))[0] == 404
    status, headers, _ = request(s.url, "POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert request(s.url, "DELETE")[0] == 405


def test_name_filter_keeps_the_families_prometheus_asks_for(served):
    s = served(lambda: family(3))
    wait_until(lambda: "ibtool_port_rate" in s.scrape()[0], "a first poll")
    _, _, body = request(s.url + "?name[]=ibtool_port_rate_bytes_per_second")
    text = body.decode()
    assert 'ibtool_port_rate_bytes_per_second{device="mlx5_0",port="1"} 3.0' in text
    assert "ibtool_exporter_polls" not in text and "process_" not in text
    # A counter by its sample's name (with _total) or its family's; two at once.
    _, _, body = request(
        s.url + "?name[]=ibtool_exporter_polls_total&name[]=ibtool_exporter_poll_errors"
    )
    names = {ln.split()[0] for ln in body.decode().splitlines() if not ln.startswith("#")}
    assert names == {"ibtool_exporter_polls_total", "ibtool_exporter_poll_errors_total"}
    status, _, body = request(s.url + "?name[]=no_such_metric")
    assert (status, body) == (200, b"")


def test_process_build_info_and_the_servers_own_series_are_exposed(served):
    s = served(lambda: family(3))
    wait_until(lambda: "ibtool_port_rate" in s.scrape()[0], "a first poll")
    body, _ = s.scrape()
    from ibtool import __version__

    assert (
        f'ibtool_build_info{{pythonversion="{sys.version.split()[0]}",version="{__version__}"}} 1.0'
        in body
    )
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_max_fds"):
        assert f"\n{name} " in body, name
    assert 'ibtool_exporter_http_responses_total{code="200"}' in body
    assert "ibtool_exporter_http_connections " in body
    assert "ibtool_exporter_http_requests_in_flight 1.0" in body  # this very request


def test_gzip_and_openmetrics_as_the_scraper_asks(served):
    import gzip

    s = served(lambda: family(3))
    wait_until(lambda: "ibtool_port_rate" in s.scrape()[0], "a first poll")
    status, headers, body = request(s.url, headers={"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert b"ibtool_port_rate_bytes_per_second" in gzip.decompress(body)
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    status, headers, body = request(s.url, headers={"Accept": accept})
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


def test_the_text_format_is_ibtools_encoder_and_byte_for_byte_prometheus_clients():
    """One encoder of the text format 0.0.4 in ibtool, the textfiles' (views.prometheus): the
    exporter answers with it, and its answer, process_* metrics and name[] included, is what
    prometheus_client's generate_latest writes for the same families. OpenMetrics stays the
    library's."""
    from prometheus_client import ProcessCollector, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import CollectorRegistry

    from ibtool.live.exporter import Endpoint, Latest

    latest = Latest()
    rate = family(3)[0]
    polls = MetricFamily("ibtool_port_xmit_data", "Bytes sent \\ \n", "counter", "bytes")
    polls.add({"device": 'mlx5_"0"', "port": "1"}, 1234567.0)
    latest.store([rate, polls], time.time(), 0.01)
    stats = {"responses": {200: 3}, "closed": {}, "connections": 1, "in_flight": 1, "accepted": 4}
    endpoint = Endpoint(latest, lambda: stats)
    once = list(ProcessCollector(registry=None).collect())  # one reading of /proc/self, kept

    class Process:
        def collect(self):
            return iter(once)

    endpoint.process = Process()
    body, content_type = endpoint.metrics("text/plain;version=0.0.4", None)
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "\nprocess_cpu_seconds_total " in body.decode()

    class Theirs:  # the same families as prometheus_client's own, its process_* metrics too
        def collect(self):
            for f in endpoint.families():
                if f.name.startswith("process_"):
                    continue
                kind = CounterMetricFamily if f.type == "counter" else GaugeMetricFamily
                keys = sorted({k for sample in f.samples for k in sample.labels})
                theirs = kind(f.name, f.documentation, labels=keys)
                for labels, value in f.samples:
                    theirs.add_metric([labels[k] for k in keys], value)
                yield theirs
            yield from once

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Theirs())
    assert body == generate_latest(registry)
    body, _ = endpoint.metrics("", ["ibtool_port_xmit_data_bytes_total", "process_open_fds"])
    names = {ln.split()[0].split("{")[0] for ln in body.decode().splitlines() if ln[0] != "#"}
    assert names == {"ibtool_port_xmit_data_bytes_total", "process_open_fds"}
    body, content_type = endpoint.metrics("application/openmetrics-text;version=1.0.0", None)
    assert content_type.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")


def test_every_kind_of_poll_failure_is_counted(tmp_path):
    """A poll that raises (EMFILE when the process is out of descriptors) and one that could not
    read part of the host (each thing a warning) both count as poll errors."""
    from ibtool.live.exporter import Faults

    warnings: list[str] = []
    faults = Faults(warnings.append)
    polls = []

    def poll():
        polls.append(1)
        if len(polls) == 2:
            raise OSError(24, "Too many open files")
        if len(polls) == 3:
            faults.warn("mlx5_0/1: counters: [Errno 24] Too many open files")
            faults.warn("mlx5_0/2: counters: [Errno 24] Too many open files")
        return family(len(polls))

    stop, bound = threading.Event(), threading.Event()
    urls = []

    def ready(address):
        urls.append(f"http://127.0.0.1:{address[1]}/metrics")
        bound.set()

    thread = threading.Thread(
        target=serve,
        args=(("127.0.0.1", 0), poll, 0.02, warnings.append),
        kwargs={"stop": stop, "ready": ready, "faults": faults},
        daemon=True,
    )
    thread.start()
    try:
        assert bound.wait(10)
        wait_until(lambda: len(polls) >= 4, "four polls")
        body = request(urls[0])[2].decode()
    finally:
        stop.set()
        thread.join(10)
    assert "ibtool_exporter_poll_errors_total 2.0" in body
    assert "ibtool_exporter_poll_faults_total 2.0" in body
    assert "poll failed: OSError: [Errno 24] Too many open files" in warnings


def start_exporter(root, *args: str, nofile: int | None = None) -> tuple[subprocess.Popen, str]:
    import resource

    def limit():
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "--root", str(root), "exporter"]
        + ["--listen", "127.0.0.1:0", "--interval", "1", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=limit,
    )
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        proc.kill()
        raise AssertionError(line + proc.communicate()[1])
    return proc, line.split()[1]


def stop_exporter(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 143


def test_idle_sockets_past_the_open_files_limit_starve_neither_scrapes_nor_the_poller(tmp_path):
    """The attack that held prometheus_client's server: open-files limit 128, 300 idle
    connections. The scrapes are answered and no poll fails for want of a descriptor."""
    import socket

    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    proc, url = start_exporter(root, nofile=128)
    held = []
    try:
        wait_until(lambda: "ibtool_health_status" in request(url)[2].decode(), "a first poll")
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        for _ in range(300):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        polls = lambda: int(  # noqa: E731
            float(
                next(
                    ln.split()[1]
                    for ln in request(url)[2].decode().splitlines()
                    if ln.startswith("ibtool_exporter_polls_total ")
                )
            )
        )
        first = polls()
        wait_until(lambda: polls() >= first + 2, "two polls with the sockets held")
        body = request(url)[2].decode()
        assert "ibtool_exporter_poll_errors_total 0.0" in body
        assert "ibtool_exporter_poll_faults_total 0.0" in body
        evicted = [ln for ln in body.splitlines() if 'reason="evicted"' in ln]
        assert evicted and float(evicted[0].split()[1]) >= 300 - 128, evicted
    finally:
        for s in held:
            s.close()
        stop_exporter(proc)


TLS = REPO / "tests" / "fixtures" / "tls"


def web_config(tmp_path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def test_tls_and_basic_auth_from_the_web_config_file(tmp_path):
    import base64
    import ssl

    import bcrypt

    hashed = bcrypt.hashpw(b"good", bcrypt.gensalt(rounds=4)).decode()
    config = web_config(
        tmp_path,
        f"tls_server_config:\n  cert_file: {TLS / 'server.pem'}\n  key_file: {TLS / 'server.key'}\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n",
    )
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    proc, url = start_exporter(root, "--web.config.file", str(config))
    try:
        assert url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(TLS / "ca.pem"))

        def get(password: str | None):
            headers = {}
            if password is not None:
                token = base64.b64encode(f"prometheus:{password}".encode()).decode()
                headers["Authorization"] = f"Basic {token}"
            req = urllib.request.Request(url, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=10, context=context) as reply:
                    return reply.status, reply.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.headers.get("WWW-Authenticate", "")

        wait_until(lambda: "ibtool_health_status" in get("good")[1], "a first poll over TLS")
        assert get("wrong") == (401, 'Basic realm="ibtool exporter"')
        assert get(None)[0] == 401
        # Plain HTTP at the TLS port: no metrics.
        plain = url.replace("https://", "http://")
        with pytest.raises(OSError):
            urllib.request.urlopen(plain, timeout=10).read()
    finally:
        stop_exporter(proc)


def test_a_web_config_file_that_cannot_be_used_is_one_line_and_exit_7(tmp_path):
    config = web_config(tmp_path, "tls_server_config:\n  cert_file: /nonexistent.pem\n")
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    got = subprocess.run(
        [sys.executable, "-m", "ibtool", "--root", str(root), "exporter"]
        + ["--listen", "127.0.0.1:0", "--web.config.file", str(config)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert got.returncode == 7, got.stderr
    assert got.stdout == ""
    assert len(got.stderr.splitlines()) == 1 and "web config" in got.stderr, got.stderr


@pytest.mark.parametrize("value", ["0", "1001", "x"])
def test_web_max_requests_out_of_range_is_a_usage_error(tmp_path, value):
    got = subprocess.run(
        [sys.executable, "-m", "ibtool", "exporter", "--web.max-requests", value],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert got.returncode == 2 and "--web.max-requests" in got.stderr, got.stderr

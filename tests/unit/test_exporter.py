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
from ibtool.exporter import parse_listen, serve
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

"""The dashboard's Feed over the Engine: what it shows comes from findings' kinds, not wording."""

from __future__ import annotations

import pytest

from ibtool.host import Host
from ibtool.live.feed import Feed
from ibtool.model.health import HealthResult, Status
from tests.fixtures import sysfs_trees


def degraded(tmp_path, *findings: HealthResult) -> dict[str, str]:
    """What the dashboard shows as trained down, by port, with the port check finding these."""
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    host = Host(root=str(root))

    def port(ctx):
        return list(findings)

    feed = Feed(lambda: host, live=False, source="test", checks={"port": port})
    frame = feed.poll()
    return {f"{r.port.device}/{r.port.port}": r.degraded for r in frame.rows if r.degraded}


@pytest.mark.parametrize(
    "summary",
    [
        "trained down: 25 Gb/s 1X, it had 100 Gb/s",
        "slower than it was (25 Gb/s, 100 Gb/s before)",
        "rate 100 Gb/s 4X below the configured 200 Gb/s",
    ],
)
@pytest.mark.parametrize("kind", ["link_degraded", "link_below_configured"])
def test_rewording_the_port_check_changes_not_which_link_is_shown_trained_down(
    tmp_path, summary, kind
):
    found = HealthResult(Status.WARNING, "mlx5_0/1", summary, kind=kind)
    assert degraded(tmp_path, found) == {"mlx5_0/1": summary}


def test_a_summary_that_says_trained_down_without_the_kind_is_not_taken_for_one(tmp_path):
    said = HealthResult(Status.WARNING, "mlx5_0/1", "trained down: 25 Gb/s 1X, it had 100 Gb/s")
    other = HealthResult(Status.WARNING, "mlx5_0/1", "symbol errors", kind="counter_errors")
    assert degraded(tmp_path, said, other) == {}


def test_the_engine_runs_the_checks_once_for_a_capture_and_keeps_their_findings(tmp_path):
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    host = Host(root=str(root))
    runs = []

    def check(ctx):
        runs.append(ctx.host)
        return [HealthResult(Status.OK, "mlx5_0/1", "fine")]

    feed = Feed(lambda: host, live=False, source="test", checks={"port": check})
    first, second = feed.poll(), feed.poll()
    assert runs == [host]  # a capture read again is the same moment: nothing new to check
    assert first.row(("mlx5_0", 1)).health == second.row(("mlx5_0", 1)).health == Status.OK
    assert second.health_time == first.health_time


def test_the_port_checks_own_kind_marks_the_link_below_its_configured_rate(tmp_path):
    from ibtool.health.config import HealthConfig, PortExpect
    from ibtool.plugin.hooks import health_checks
    from ibtool.plugin.manager import build_plugins

    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    host = Host(root=str(root))
    check = health_checks(build_plugins(), lambda m: None)["port"]
    config = HealthConfig(ports={"*": PortExpect(rate=400.0)})
    feed = Feed(lambda: host, live=False, source="test", checks={"port": check}, config=config)
    row = feed.poll().row(("mlx5_0", 1))
    (found,) = [f for f in row.findings if f.kind == "link_below_configured"]
    assert row.degraded == found.summary


def test_a_device_renamed_with_control_characters_keeps_its_findings(tmp_path):
    # a finding's subject holds the name escaped; the port's row must still be its own
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    link = root / "sys" / "class" / "infiniband" / "mlx5_0"
    hostile = "mlx5\x1b[31m_0"
    link.rename(link.with_name(hostile))
    host = Host(root=str(root))

    def check(ctx):
        down = [
            HealthResult(Status.CRITICAL, f"{p.device}/{p.port}", "down") for p in ctx.host.ports()
        ]
        return [*down, HealthResult(Status.WARNING, hostile, "of the device")]

    frame = Feed(lambda: host, live=False, source="test", checks={"port": check}).poll()
    row = frame.row((hostile, 1))
    assert row.health == Status.CRITICAL
    assert [f.summary for f in frame.host_findings] == ["of the device"]  # as for mlx5_0

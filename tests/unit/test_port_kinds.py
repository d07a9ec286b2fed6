"""What the health checks' findings are for a program (their kind), whatever their summary says."""

from __future__ import annotations

from ibtool_plugins import counters, system
from ibtool_plugins.ports import check_ports

from ibtool.api import CheckContext, Status
from ibtool.health.config import HealthConfig, PortExpect
from ibtool.host import Host
from tests.fixtures import sysfs_trees

PORT_1 = "sys/class/infiniband/mlx5_0/ports/1"


def findings(check, root, config=None, previous=None) -> dict[str, list[tuple[str, str, str]]]:
    """subject -> (status, kind, summary) of every finding that is not OK."""
    ctx = CheckContext(Host(root=str(root)), config=config or HealthConfig(), previous=previous)
    found: dict[str, list[tuple[str, str, str]]] = {}
    for r in check(ctx):
        if r.status != Status.OK:
            found.setdefault(r.subject, []).append((r.status.name, r.kind, r.summary))
        else:
            assert r.kind == ""
    return found


def test_a_port_that_trained_down_from_its_best_is_link_degraded(tmp_path):
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path)
    (root / PORT_1 / "rate").write_text("25 Gb/sec (1X EDR)\n")
    had = {"ports": {"mlx5_0/1": {"best_gbps": 100}}}
    assert findings(check_ports, root, previous=had)["mlx5_0/1"] == [
        ("WARNING", "link_degraded", "trained down: 25 Gb/s 1X, it had 100 Gb/s")
    ]


def test_a_port_below_its_configured_rate_or_width_is_link_below_configured(tmp_path):
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path)
    rate = HealthConfig(ports={"mlx5_0/1": PortExpect(rate=200)})
    assert findings(check_ports, root, rate)["mlx5_0/1"] == [
        ("WARNING", "link_below_configured", "rate 100 Gb/s 4X below the configured 200 Gb/s")
    ]
    width = HealthConfig(ports={"mlx5_0/1": PortExpect(width="8X")})
    assert findings(check_ports, root, width)["mlx5_0/1"] == [
        (
            "WARNING",
            "link_below_configured",
            "width 4X, configured 8X: trained down (100 Gb/s 4X)",
        )
    ]


def test_the_other_port_findings_have_their_kinds(tmp_path):
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path)
    (root / PORT_1 / "sm_lid").write_text("0x0\n")
    config = HealthConfig(devices=("mlx5_0", "mlx5_9"), ports={"mlx5_0/3": PortExpect()})
    kinds = {s: [kind for _, kind, _ in f] for s, f in findings(check_ports, root, config).items()}
    assert kinds == {
        "mlx5_0/1": ["no_sm_lid"],
        "mlx5_0/2": ["port_down"],  # DOWN, physical_state POLLING
        "mlx5_9": ["device_missing"],
        "mlx5_0/3": ["port_missing"],
    }


def test_counter_and_system_findings_have_their_kinds(tmp_path):
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path)
    (root / PORT_1 / "counters/symbol_error").write_text("65535\n")
    assert findings(counters.check_counters, root)["mlx5_0/1"] == [
        ("WARNING", "counter_saturated", "symbol_error saturated at 65535: clear it to count")
    ]
    (root / "sys/module").mkdir(parents=True, exist_ok=True)
    modules = HealthConfig(modules=("ib_core", "rdma_ucm"))
    kinds = [kind for _, kind, _ in findings(system.check_system, root, modules)["rdma_ucm"]]
    assert kinds == ["module_not_loaded"]

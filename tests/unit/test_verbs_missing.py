"""Without pyverbs, -d says what is missing and how to install it; nothing else is lost."""

from __future__ import annotations

import sys

from ibtool.host import Host


def test_missing_pyverbs_is_one_warning_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyverbs", None)
    monkeypatch.setitem(sys.modules, "pyverbs.device", None)
    warnings: list[str] = []
    host = Host(warn=warnings.append, details=True)
    assert host.verbs() is None
    assert host.device_caps("mlx5_0") is None
    assert len(warnings) == 1
    assert "pyverbs is not available" in warnings[0]
    assert "apt install python3-pyverbs" in warnings[0]
    assert "--system-site-packages" in warnings[0]


def test_root_trees_have_no_verbs(mlx5_roce):
    r = mlx5_roce("-d", "-j", "port")
    assert r.code == 0 and r.json[0]["active_mtu"] is None
    assert r.warnings == ["ibtool: warning: -d: verbs details need the live host, not --root"]

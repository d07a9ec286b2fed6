"""`ibtool port -d` and the fabric: the P_Key table, the VLs and the SL-to-VL mapping, automatic
path migration; and the P_Key index the data path's QPs are built with (`--pkey-index`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ibtool_plugins.ports import show

from ibtool.errors import DataError, ExitCode, NotFoundError
from ibtool.host import Host
from ibtool.model.records import PKey
from ibtool.sources.sysfs.infiniband import SysfsSource
from tests.fixtures import sysfs_trees
from tests.unit.conftest import on_live_host, run_cli

MLX5_IB_PORT_1 = [
    "    pkeys 128 slots, 127 empty",
    "    pkey index 0: 0xffff full member, default partition",
]


def details(ibtool, selector: str) -> list[str]:
    """The lines -d adds under the port's own line."""
    r = ibtool("-d", "port", selector)
    assert r.code == 0, r.err
    return r.out.splitlines()[1:]


# -- the P_Key table -----------------------------------------------------------------------------


def test_an_infiniband_port_shows_its_one_partition_and_counts_the_empty_slots(mlx5_ib_hca):
    assert details(mlx5_ib_hca, "mlx5_0/1") == MLX5_IB_PORT_1
    (p,) = mlx5_ib_hca("-d", "-j", "port", "mlx5_0/1").json
    assert p["pkey_tbl_len"] == 128
    assert p["pkeys"] == [{"index": 0, "pkey": "0xffff", "membership": "full", "default": True}]


def test_omni_path_full_and_limited_members_and_the_default_partition(hfi1_opa):
    lines = details(hfi1_opa, "hfi1_0/1")
    assert lines[:3] == [
        "    pkeys 16 slots, 14 empty",
        "    pkey index 0: 0x8001 full member",
        "    pkey index 1: 0x7fff limited member, default partition",
    ]
    (p,) = hfi1_opa("-d", "-j", "port").json
    assert p["pkeys"] == [
        {"index": 0, "pkey": "0x8001", "membership": "full", "default": False},
        {"index": 1, "pkey": "0x7fff", "membership": "limited", "default": True},
    ]


def test_a_roce_port_has_its_one_slot(mlx5_roce):
    assert details(mlx5_roce, "mlx5_0/1") == [
        "    pkeys 1 slot, 0 empty",
        "    pkey index 0: 0xffff full member, default partition",
    ]


def test_an_iwarp_ports_zero_pkey_is_an_empty_slot_not_a_partition(cxgb4_iwarp):
    assert details(cxgb4_iwarp, "cxgb4_0/1") == ["    pkeys 1 slot, 1 empty"]
    (p,) = cxgb4_iwarp("-d", "-j", "port", "cxgb4_0/1").json
    assert (p["pkey_tbl_len"], p["pkeys"]) == (1, [])


def test_a_capture_without_pkeys_shows_no_table(incomplete_capture):
    r = incomplete_capture("-d", "-j", "port", "mlx4_0/1")
    (p,) = r.json
    assert (p["pkey_tbl_len"], p["pkeys"]) == (None, None)
    assert all(not line.startswith("    pkey") for line in details(incomplete_capture, "mlx4_0"))


@pytest.mark.parametrize(
    "text, problem",
    [
        ("ffff", "malformed value 'ffff'"),
        ("0x1ffff", "'0x1ffff' is out of range (0x0..0xffff)"),
        (None, "cannot read: Is a directory"),
    ],
    ids=["no-0x", "17-bits", "unreadable"],
)
def test_a_bad_pkey_slot_is_one_warning_and_the_rest_is_shown(mlx5_ib_hca, text, problem):
    slot = mlx5_ib_hca.root / "sys/class/infiniband/mlx5_0/ports/1/pkeys/5"
    slot.unlink()
    if text is None:
        slot.mkdir()  # a read that fails, as the kernel's can
    else:
        slot.write_text(text + "\n")
    r = mlx5_ib_hca("-d", "port", "mlx5_0/1")
    assert r.code == 0
    assert r.warnings == [
        f"ibtool: warning: mlx5_0/ports/1/pkeys/5: {problem}",
        "ibtool: warning: -d: verbs details need the live host, not --root",
    ]
    assert r.out.splitlines()[1:] == [
        "    pkeys 128 slots, 126 empty",  # slot 5 is not known to be empty
        MLX5_IB_PORT_1[1],
        "    pkey index 5: unknown",
    ]
    (p,) = mlx5_ib_hca("-d", "-j", "port", "mlx5_0/1").json
    assert p["pkeys"][1] == {"index": 5, "pkey": None, "membership": None, "default": None}


def test_plain_port_neither_reads_nor_shows_the_table(mlx5_ib_hca):
    (mlx5_ib_hca.root / "sys/class/infiniband/mlx5_0/ports/1/pkeys/0").write_text("junk\n")
    r = mlx5_ib_hca("port")
    assert (r.code, r.err) == (0, "")
    assert "pkey" not in r.out
    assert "pkeys" not in mlx5_ib_hca("-j", "port").json[0]


# -- SL to VL ------------------------------------------------------------------------------------


def test_qib_shows_its_sl_to_vl_table(tmp_path):
    root = sysfs_trees.build("qib_ib", tmp_path)
    r = run_cli(["--root", str(root), "-d", "port"])
    assert r.out.splitlines()[1:] == [
        "    pkeys 4 slots, 3 empty",
        "    pkey index 0: 0xffff full member, default partition",
        "    sl2vl 0:0 1:1 2:2 3:3 4:0 5:1 6:2 7:3 8:0 9:1 10:2 11:3 12:0 13:1 14:2 15:3",
    ]
    (p,) = run_cli(["--root", str(root), "-d", "-j", "port"]).json
    assert p["sl2vl"] == [sl % 4 for sl in range(16)]


def test_omni_path_maps_an_sl_through_its_service_channel(hfi1_opa):
    root = hfi1_opa.root / "sys/class/infiniband/hfi1_0/ports/1"
    (root / "sl2sc" / "3").write_text("15\n")  # SL3 -> SC15 -> VL15
    (root / "sc2vl" / "2").write_text("1\n")  # SL2 -> SC2 -> VL1
    (p,) = hfi1_opa("-d", "-j", "port").json
    expected = [sl if sl < 8 or sl == 15 else 0 for sl in range(32)]
    expected[2], expected[3] = 1, 15
    assert p["sl2vl"] == expected
    assert details(hfi1_opa, "hfi1_0/1")[3].startswith("    sl2vl 0:0 1:1 2:1 3:15 4:4 ")


def test_an_unreadable_sl2vl_entry_is_unknown_and_warned_about(tmp_path):
    root = sysfs_trees.build("qib_ib", tmp_path)
    (root / "sys/class/infiniband/qib0/ports/1/sl2vl/7").write_text("16\n")  # VLs are 4 bits
    r = run_cli(["--root", str(root), "-d", "port"])
    assert r.warnings == [
        "ibtool: warning: qib0/ports/1/sl2vl/7: '16' is out of range (0..15)",
        "ibtool: warning: -d: verbs details need the live host, not --root",
    ]
    assert " 6:2 7:unknown 8:0 " in r.out


def test_drivers_without_a_table_in_sysfs_show_none(mlx5_ib_hca):
    (p, _) = mlx5_ib_hca("-d", "-j", "port").json
    assert p["sl2vl"] is None
    assert not [line for line in details(mlx5_ib_hca, "mlx5_0/1") if "sl2vl" in line]


# -- verbs: VLs and automatic path migration -----------------------------------------------------


class FakeVerbs:
    """The verbs source as a ConnectX-5 answers (VLCap 4: VL0-7; AUTO_PATH_MIG set)."""

    def __init__(self, attrs: dict):
        self.attrs = attrs

    def port_attrs(self, device: str, port: int) -> dict:
        return {"active_mtu": 4096, "max_mtu": 4096, **self.attrs}


def verbs_host(root: Path, attrs: dict, warnings: list[str]) -> Host:
    sysfs = SysfsSource(str(root), warnings.append)
    return Host(
        warn=warnings.append,
        details=True,
        sysfs=sysfs,
        verbs=lambda: FakeVerbs(attrs),
        live=False,
    )


def test_verbs_give_the_vls_and_path_migration(tmp_path):
    warnings: list[str] = []
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path)
    host = verbs_host(root, {"max_vl_num": 4, "auto_path_mig": True}, warnings)
    (p,) = host.ports("mlx5_0/1")
    assert show.detail_lines(p)[2:] == ["max_vl_num 4 (VL0-7)", "auto_path_mig yes"]
    assert (p.max_vl_num, p.auto_path_mig, warnings) == (4, True, [])


@pytest.mark.parametrize(
    "vl_num, shown", [(1, "VL0"), (2, "VL0-1"), (3, "VL0-3"), (5, "VL0-14"), (6, "reserved")]
)
def test_every_vl_cap_encoding_is_named(tmp_path, vl_num, shown):
    host = verbs_host(sysfs_trees.build("mlx5_ib_hca", tmp_path), {"max_vl_num": vl_num}, [])
    (p,) = host.ports("mlx5_0/1")
    assert f"max_vl_num {vl_num} ({shown})" in show.detail_lines(p)


def test_a_snapshot_saved_before_the_vls_were_read_shows_none(tmp_path):
    # port_attrs of an older ibtool's snapshot: no max_vl_num, no auto_path_mig
    host = verbs_host(sysfs_trees.build("mlx5_ib_hca", tmp_path), {}, [])
    (p,) = host.ports("mlx5_0/1")
    assert (p.max_vl_num, p.auto_path_mig) == (None, None)
    assert show.detail_lines(p) == [line.strip() for line in MLX5_IB_PORT_1]


def test_netlinks_device_capabilities_say_whether_a_port_can_migrate(tmp_path):
    from ibtool.sources.netlink.merging import Merger

    class Session:
        def device_replies(self):
            return {"mlx5_0": {"RDMA_NLDEV_ATTR_CAP_FLAGS": 0x1223C66}}  # bit 4 clear

    root = sysfs_trees.build("mlx5_ib_hca", tmp_path)
    host = verbs_host(root, {"max_vl_num": 4, "auto_path_mig": True}, [])
    merger = Merger(Session())
    merger.port_replies["mlx5_0"] = {}
    (p,) = [merger.port(p) for p in host.ports("mlx5_0/1")]
    assert (p.auto_path_mig, p.sources["auto_path_mig"]) == (False, "netlink")
    assert p.sources["max_vl_num"] == "verbs" and p.sources["pkeys"] == "sysfs"


# -- the P_Key index of the data path ------------------------------------------------------------


@pytest.fixture
def hfi1_host(tmp_path) -> Host:
    return Host(root=str(sysfs_trees.build("hfi1_opa", tmp_path)))


def test_a_populated_slot_is_the_pkey_the_qps_get(hfi1_host):
    assert hfi1_host.pkey("hfi1_0", 1, 1) == PKey(1, 0x7FFF)
    assert hfi1_host.pkey("hfi1_0", 1, 1).label == "0x7fff (index 1)"


def test_an_index_outside_the_table_names_the_table_and_the_populated_slots(hfi1_host):
    with pytest.raises(NotFoundError) as e:
        hfi1_host.pkey("hfi1_0", 1, 16)
    table = f"{hfi1_host.root}/sys/class/infiniband/hfi1_0/ports/1/pkeys"
    assert e.value.message == f"hfi1_0/1 has no P_Key index 16: {table} has 16 slots (0..15)"
    assert e.value.hint == "populated: index 0 (0x8001), index 1 (0x7fff)"
    assert e.value.exit_code == ExitCode.NOT_FOUND


def test_an_empty_slot_is_no_partition(hfi1_host):
    with pytest.raises(NotFoundError) as e:
        hfi1_host.pkey("hfi1_0", 1, 2)
    table = f"{hfi1_host.root}/sys/class/infiniband/hfi1_0/ports/1/pkeys"
    assert e.value.message == f"P_Key index 2 of hfi1_0/1 is empty ({table}/2: 0x0000)"


def test_an_unreadable_slot_asked_for_is_a_data_error(hfi1_host):
    slot = Path(hfi1_host.root) / "sys/class/infiniband/hfi1_0/ports/1/pkeys/1"
    slot.write_text("garbage\n")
    with pytest.raises(DataError, match=r"cannot read P_Key index 1 of hfi1_0/1 \("):
        hfi1_host.pkey("hfi1_0", 1, 1)


def test_the_default_index_is_taken_as_it_is(tmp_path):
    host = Host(sysfs=SysfsSource(str(sysfs_trees.build("cxgb4_iwarp", tmp_path))), live=False)
    assert host.pkey("cxgb4_0", 1, 0, asked=False) == PKey(0, None)  # 0x0000: no value
    assert host.pkey("cxgb4_0", 1, 0, asked=False).label == "index 0"
    with pytest.raises(NotFoundError, match="is empty"):
        host.pkey("cxgb4_0", 1, 0)


@pytest.fixture
def live_hfi1(tmp_path, fake_pyverbs):
    """(fabric, ibtool) on the live host whose sysfs is the hfi1_opa tree; hfi1_0/1 an
    InfiniBand port in fake verbs."""
    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("hfi1_0", 1, link_layer=1, lid=5)
    return fabric, on_live_host(sysfs_trees.build("hfi1_opa", tmp_path))


def test_loopback_builds_its_qps_in_the_partition_asked_for(live_hfi1, monkeypatch):
    from ibtool.rdma import ladder

    _, ibtool = live_hfi1
    seen: list[int] = []
    connect_rc, ready_ud = ladder.Ladder.connect_rc, ladder.Ladder.ready_ud

    def rc(self, qp, psn, peer, access, rd_atomic=1, path=ladder.DEFAULT_PATH):
        connect_rc(self, qp, psn, peer, access, rd_atomic, path)
        seen.append(qp.attr.pkey_index)

    def ud(self, qp, psn, qkey=ladder.DEFAULT_QKEY, pkey_index=0):
        ready_ud(self, qp, psn, qkey, pkey_index)
        seen.append(qp.attr.pkey_index)

    monkeypatch.setattr(ladder.Ladder, "connect_rc", rc)
    monkeypatch.setattr(ladder.Ladder, "ready_ud", ud)
    r = ibtool("-j", "loopback", "--iters", "2", "--ops", "send,ud_send", "--pkey-index", "1")
    assert r.code == 0, r.err
    assert (r.json["pkey_index"], r.json["pkey"]) == (1, "0x7fff")
    assert seen == [1, 1, 1, 1]  # two RC QPs, two UD QPs
    text = ibtool("loopback", "--iters", "1", "--ops", "send", "--pkey-index", "0").out
    assert (
        text.splitlines()[0]
        == "loopback on hfi1_0/1, pkey 0x8001 (index 0), 4096 bytes, 1 iterations"
    )


@pytest.mark.parametrize("argv", [["loopback"], ["ping", "127.0.0.1"], ["ping", "--server"]])
def test_an_empty_slot_is_refused_before_any_qp_exists(live_hfi1, argv):
    fabric, ibtool = live_hfi1
    r = ibtool(*argv, "--pkey-index", "2")
    assert (r.code, r.out) == (ExitCode.NOT_FOUND, "")
    assert r.err.startswith("ibtool: error: P_Key index 2 of hfi1_0/1 is empty (")
    assert r.err.endswith("(hint: populated: index 0 (0x8001), index 1 (0x7fff))\n")
    assert fabric.qps == {}


@pytest.mark.parametrize("argv", [["loopback"], ["ping", "127.0.0.1"]])
def test_a_negative_index_is_a_usage_error(live_hfi1, argv):
    _, ibtool = live_hfi1
    r = ibtool(*argv, "--pkey-index", "-1")
    assert (r.code, r.out) == (ExitCode.USAGE, "")
    said = f"ibtool {argv[0]}: error: argument --pkey-index: must be 0 to 65535, not -1\n"
    assert r.err.endswith(said)


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--cm", "192.0.2.1"], "--cm takes no --pkey-index"),
        (["--compat", "rping", "192.0.2.1"], "--compat rping takes no --pkey-index"),
    ],
)
def test_rdma_cm_picks_the_pkey_itself(live_hfi1, argv, said):
    _, ibtool = live_hfi1
    r = ibtool("ping", *argv, "--pkey-index", "0")
    assert (r.code, r.out) == (ExitCode.USAGE, "")
    assert r.err.startswith(f"ibtool: error: {said} (hint: rdma_cm takes the P_Key from the ")


def test_pings_qp_path_carries_the_index():
    import argparse

    from ibtool.api.datapath import path_spec

    args = argparse.Namespace(sl=3, tclass=0, mtu=None, pkey_index=1)
    assert path_spec(args).pkey_index == 1
    assert path_spec(argparse.Namespace(sl=0, tclass=0, mtu=None, pkey_index=None)).pkey_index == 0

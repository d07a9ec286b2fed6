"""`ibtool topo`: GPUs, RDMA devices and the PCIe between them, on trees of machines built
from their published topologies (tests/fixtures/gpu_trees.py), each against the `nvidia-smi
topo -m` matrix its owner posted; the distance rules on small trees; NCCL's environment; trees
spoiled one file at a time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ibtool.host import Host
from ibtool.model.system import PciLink
from ibtool.model.topo import (
    NODE,
    PHB,
    PIX,
    PXB,
    SYS,
    Gpu,
    Nic,
    NicPort,
    PciFunction,
    Topology,
    distance,
    nccl_environment,
)
from tests.fixtures import gpu_trees
from tests.unit.conftest import run_cli

TREES = ("dgx-a100", "hgx-h200", "pcie-server", "two-socket")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("gpu")
    return {name: gpu_trees.build(name, base / name) for name in TREES}


def topology_of(root: Path) -> tuple[Topology, list[str]]:
    warnings: list[str] = []
    return Host(str(root), warnings.append).topology(), warnings


def published(matrix: str) -> list[tuple[str, str, str]]:
    """(row, column, distance) of a posted matrix, its first line the column names; ' X'
    cells count."""
    lines = matrix.splitlines()
    columns = lines[0].split()
    cells = []
    for line in lines[1:]:
        row, *values = line.split()
        assert len(values) == len(columns), line
        cells += [(row, c, v) for c, v in zip(columns, values)]
    return cells


def matrix_of(topo: Topology, nic_names: dict[str, str] | None = None) -> dict:
    members = {g.name: g.function for g in topo.gpus}
    members.update({n.name: n.function for n in topo.nics})
    for label, name in (nic_names or {}).items():
        members[label] = members[name]
    return members


@pytest.mark.parametrize(
    "tree, expected, names",
    [
        ("dgx-a100", gpu_trees.A100_EXPECTED, None),
        ("hgx-h200", gpu_trees.H200_EXPECTED, {f"NIC{i}": f"mlx5_{i}" for i in range(8)}),
        ("pcie-server", gpu_trees.PCIE_SERVER_EXPECTED, None),
        ("two-socket", gpu_trees.TWO_SOCKET_EXPECTED, None),
    ],
)
def test_the_matrix_is_the_one_its_owner_posted(built, tree, expected, names):
    topo, warnings = topology_of(built[tree])
    assert warnings == []
    members = matrix_of(topo, names)
    got = [
        (r, c, "X" if r == c else distance(members[r], members[c]))
        for r, c, _ in published(expected)
    ]
    assert got == published(expected)


def test_dgx_a100_every_gpu_has_its_two_hcas_and_the_storage_ports_serve_none(built):
    topo, _ = topology_of(built["dgx-a100"])
    assert [g.function.bdf for g in topo.gpus] == [
        "0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0",
        "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0",
    ]  # fmt: skip
    closest = {
        g.name: (lvl, [n.name for n in nics]) for g in topo.gpus for lvl, nics in [topo.closest(g)]
    }
    assert closest["GPU0"] == (PXB, ["mlx5_0", "mlx5_1"])
    assert closest["GPU7"] == (PXB, ["mlx5_8", "mlx5_9"])
    env = nccl_environment(topo, "enp225s0f0", None)
    assert dict(env.variables) == {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_6:1,mlx5_7:1,mlx5_8:1,mlx5_9:1",
        "NCCL_SOCKET_IFNAME": "=enp225s0f0",
    }
    assert env.notes == ()  # InfiniBand: no GID index to give


def test_a_gpu_knows_its_path_numa_and_link(built):
    topo, _ = topology_of(built["dgx-a100"])
    gpu0 = topo.gpus[0].function
    assert gpu0.bridges == (
        "0000:06:00.0", "0000:05:00.0", "0000:04:00.0", "0000:03:00.0",
        "0000:02:00.0", "0000:01:00.0", "0000:00:01.1",
    )  # fmt: skip
    assert gpu0.host_bridge == "pci0000:00"
    assert (gpu0.vendor, gpu0.device, gpu0.pci_class) == (0x10DE, 0x20B0, 0x030200)
    assert gpu0.numa == 3 and 48 in gpu0.cpus and 176 in gpu0.cpus and 64 not in gpu0.cpus
    assert gpu0.link == PciLink("0000:07:00.0", "16.0 GT/s PCIe", 16, "16.0 GT/s PCIe", 16)
    assert gpu0.driver == "nvidia" and gpu0.iommu_group is None  # no IOMMU there


def test_roce_ports_give_their_gid_index_and_the_environment_says_it(built):
    topo, _ = topology_of(built["pcie-server"])
    assert [(n.name, n.ports) for n in topo.nics] == [
        ("mlx5_0", (NicPort(1, "Ethernet", "ACTIVE", "enp226s0f0np0", 3),)),
        ("mlx5_1", (NicPort(1, "Ethernet", "ACTIVE", "enp226s0f1np1", 3),)),
    ]
    env = nccl_environment(topo, None, "no default route")
    assert env.variables == (("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1"), ("NCCL_IB_GID_INDEX", "3"))
    assert env.notes == ("NCCL_SOCKET_IFNAME is not set: no default route",)


# -- the distance rules, on the smallest trees that show them ----------------------------------


def fn(bdf: str, *bridges: str, host: str = "pci0000:00", numa: int | None = 0) -> PciFunction:
    return PciFunction(bdf, bridges=bridges, host_bridge=host, numa=numa)


RP, USP, DSP1, DSP2 = "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0"


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (fn("0000:03:00.0", DSP1, USP, RP), fn("0000:04:00.0", DSP2, USP, RP), PIX),  # one switch
        (fn("0000:01:00.0", RP), fn("0000:01:00.1", RP), PIX),  # two functions, one root port
        (fn("0000:03:00.0", DSP1, USP, RP), fn("0000:03:00.1", DSP1, USP, RP), PIX),
        (fn("0000:03:00.0", DSP1, USP, RP), fn("0000:01:00.0", RP), PXB),  # a switch, then up
        (fn("0000:05:00.0", "0000:04:00.0", "0000:03:00.0", DSP1, USP, RP),
         fn("0000:06:00.0", DSP2, USP, RP), PXB),  # nested switches
        (fn("0000:01:00.0", RP), fn("0000:41:00.0", "0000:00:03.0"), PHB),  # two root ports
        (fn("0000:00:02.0"), fn("0000:00:03.0"), PHB),  # on the host bridge's bus (a VM)
        (fn("0000:01:00.0", RP), fn("0000:41:00.0", "0000:40:01.0", host="pci0000:40"), NODE),
        (fn("0000:01:00.0", RP),
         fn("0000:81:00.0", "0000:80:01.0", host="pci0000:80", numa=1), SYS),
        (fn("0000:01:00.0", RP, numa=None), fn("0000:41:00.0", host="pci0000:40", numa=None), NODE),
    ],
)  # fmt: skip
def test_distance(a, b, expected):
    assert distance(a, b) == expected
    assert distance(b, a) == expected


def _nic(name: str, f: PciFunction, *ports: NicPort) -> Nic:
    return Nic(name, f, ports or (NicPort(1, "InfiniBand", "ACTIVE"),))


def test_a_gpu_with_no_nic_closer_than_sys_is_said_and_does_not_pick_one():
    gpu0 = Gpu(0, fn("0000:01:00.0", RP))
    gpu1 = Gpu(1, fn("0000:81:00.0", "0000:80:01.0", host="pci0000:80", numa=1))
    nic = _nic("mlx5_0", fn("0000:02:00.0", "0000:00:02.0"))
    storage = _nic("mlx5_1", fn("0000:c1:00.0", "0000:c0:01.0", host="pci0000:c0", numa=1))
    topo = Topology((gpu0, gpu1), (nic, storage))
    env = nccl_environment(topo, "eth0", None)
    # gpu1's nearest is mlx5_1 (NODE), so it is chosen; gpu0's mlx5_0 (PHB)
    assert dict(env.variables)["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    far = Topology((gpu1,), (nic,))
    env = nccl_environment(far, "eth0", None)
    assert env.notes[0].startswith("GPU1 (0000:81:00.0) has no RDMA device closer than SYS")
    assert dict(env.variables)["NCCL_IB_HCA"] == "=mlx5_0:1"  # every NIC, no GPU had one


def test_ports_that_are_down_are_left_out_and_said():
    gpu = Gpu(0, fn("0000:01:00.0", RP))
    down = _nic("mlx5_0", fn("0000:01:00.1", RP), NicPort(1, "InfiniBand", "DOWN"))
    env = nccl_environment(Topology((gpu,), (down,)), None, None)
    assert env.variables == ()
    assert env.notes == (
        "mlx5_0 has no ACTIVE port: left out of NCCL_IB_HCA",
        "no ACTIVE RDMA port to name: NCCL_IB_HCA is not set",
    )


def test_roce_ports_with_different_gid_indexes_set_none():
    gpu = Gpu(0, fn("0000:01:00.0", RP))
    a = _nic("mlx5_0", fn("0000:01:00.1", RP), NicPort(1, "Ethernet", "ACTIVE", "eth1", 3))
    b = _nic("mlx5_1", fn("0000:01:00.2", RP), NicPort(1, "Ethernet", "ACTIVE", "eth2", 5))
    env = nccl_environment(Topology((gpu,), (a, b)), None, None)
    assert [name for name, _ in env.variables] == ["NCCL_IB_HCA"]
    assert "(mlx5_0:1 3, mlx5_1:1 5)" in env.notes[0]


# -- the command ------------------------------------------------------------------------------


def test_topo_text_and_json(built):
    r = run_cli(["--root", str(built["hgx-h200"]), "topo"])
    assert (r.code, r.err) == (0, "")
    lines = r.out.splitlines()
    assert lines[0].split() == ["GPU", "PCI", "ID", "NUMA", "CPUS", "LINK", "CLOSEST", "RDMA"]
    assert lines[1].split() == ["GPU0", "0000:1b:00.0", "10de:2335", "0", "0-47,96-143",
                                "32GT/s", "x16", "PIX", "mlx5_0:1"]  # fmt: skip
    assert any(line.startswith("mlx5_7 ") and line.split()[-1] == "X" for line in lines)
    j = run_cli(["--root", str(built["hgx-h200"]), "-j", "topo"]).json
    assert j["gpus"][4]["closest"] == {"distance": "PIX", "rdma": ["mlx5_4"]}
    assert j["matrix"]["GPU0"]["mlx5_4"] == "SYS"
    assert j["rdma"][0]["ports"] == [
        {
            "port": 1,
            "state": "ACTIVE",
            "link_layer": "InfiniBand",
            "netdev": None,
            "gid_index": None,
        }
    ]


def test_topo_details_show_each_path(built):
    r = run_cli(["--root", str(built["pcie-server"]), "-d", "topo"])
    assert "mlx5_1: 0000:e2:00.1 < 0000:e0:03.1 < pci0000:e0" in r.out.splitlines()


def test_topo_nccl_exports(built):
    r = run_cli(["--root", str(built["pcie-server"]), "topo", "--nccl"])
    assert (r.code, r.err) == (0, "")
    assert r.out.splitlines() == [
        "export NCCL_IB_HCA==mlx5_0:1,mlx5_1:1",
        "export NCCL_IB_GID_INDEX=3",
        "# NCCL_SOCKET_IFNAME is not set: a capture holds no routes (run it on the host)",
    ]
    j = run_cli(["--root", str(built["pcie-server"]), "-j", "topo", "--nccl"]).json
    assert j["environment"]["NCCL_IB_GID_INDEX"] == "3"


def test_a_host_without_gpus_or_pci_says_so(tmp_path):
    from tests.fixtures import sysfs_trees

    root = sysfs_trees.build("mlx5_roce", tmp_path / "t")
    r = run_cli(["--root", str(root), "topo"])
    assert r.code == 0
    assert r.out.splitlines()[0] == "no GPU (NVIDIA or AMD, by PCI class) on this host"
    assert "mlx5_0" in r.out


# -- spoiled trees ------------------------------------------------------------------------------


@pytest.fixture
def h200(tmp_path) -> Path:
    return gpu_trees.build("hgx-h200", tmp_path / "h200")


def _gpu0(root: Path) -> Path:
    return Path(os.path.realpath(root / "sys/bus/pci/devices/0000:1b:00.0"))


@pytest.mark.parametrize("name, value", [("class", "0x03020"), ("vendor", "nvidia"), ("class", "")])
def test_a_malformed_id_is_one_warning_and_the_rest_is_shown(h200, name, value):
    (_gpu0(h200) / name).write_text(value + "\n")
    topo, warnings = topology_of(h200)
    assert [g.function.bdf for g in topo.gpus][0] == "0000:43:00.0"  # GPU0 is not counted
    assert len(topo.gpus) == 7
    assert len(warnings) == 1 and f"0000:1b:00.0/{name}: malformed value" in warnings[0]


def test_a_bus_link_out_of_the_root_is_not_followed(h200, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "class").write_text("0x030200\n")
    (outside / "vendor").write_text("0x10de\n")
    link = h200 / "sys/bus/pci/devices/0000:ff:00.0"
    os.symlink(outside, link)
    topo, warnings = topology_of(h200)
    assert len(topo.gpus) == 8
    assert any("a link out of the root" in w for w in warnings)


def test_a_degraded_gpu_link_is_shown_against_its_maximum(h200):
    gpu = _gpu0(h200)
    (gpu / "current_link_width").write_text("8\n")
    r = run_cli(["--root", str(h200), "topo"])
    assert "32GT/s x8 (of 32GT/s x16)" in r.out.splitlines()[1]


# -- GPUDirect RDMA readiness -------------------------------------------------------------------


def readiness(root: Path) -> list[tuple[str, str, str]]:
    from ibtool.model.topo import judge_gpudirect

    host = Host(str(root), lambda m: None)
    topo = host.topology()
    return [(f.status, f.subject, f.said) for f in judge_gpudirect(topo, host.gpudirect(topo))]


def test_the_hgx_is_ready_for_gpudirect(built):
    found = readiness(built["hgx-h200"])
    assert found[0] == ("ok", "registration", "nvidia-peermem is loaded")
    assert found[1:] == [
        ("ok", f"GPU{i}-mlx5_{i}", "PIX; no ACS redirect between them; IOMMU passthrough")
        for i in range(8)
    ]


def test_the_pcie_server_says_what_stands_in_the_way(built):
    found = readiness(built["pcie-server"])
    assert found[0] == ("FAIL", "registration", "nvidia-peermem is not loaded")
    gpu2 = [f for f in found if f[1] == "GPU2-mlx5_0"]
    assert gpu2 == [
        ("ok", "GPU2-mlx5_0", "PHB; no ACS redirect between them"),
        ("warn", "GPU2-mlx5_0", "PHB: farther than PXB, so NCCL sends the data through host "
         "memory"),
        ("warn", "GPU2-mlx5_0", "the IOMMU translates DMA (DMA-FQ); ATS is on at 0000:e2:00.0, "
         "so translated requests may still go direct"),
    ]  # fmt: skip


def _acs_ctrl(config: Path, value: int) -> None:
    data = bytearray(config.read_bytes())
    assert int.from_bytes(data[0x100:0x102], "little") == 0x000D  # the fixture's ACS is first
    data[0x106:0x108] = value.to_bytes(2, "little")
    config.write_bytes(bytes(data))


def test_acs_redirect_on_the_switch_port_is_a_failure_with_its_fix(h200):
    dsp = _gpu0(h200).parent  # the downstream port above GPU0
    _acs_ctrl(dsp / "config", gpu_trees.ACS_LINUX)
    found = readiness(h200)
    assert ("FAIL", "GPU0-mlx5_0", f"ACS on bridge {dsp.name} sends peer-to-peer traffic up to "
            "the root complex (ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ "
            "EgressCtrl- DirectTrans-)") in found  # fmt: skip
    assert ("ok", "GPU0-mlx5_0", "PIX; IOMMU passthrough") in found
    r = run_cli(["--root", str(h200), "topo"])
    assert f"          fix: setpci -s {dsp.name} ECAP_ACS+0x6.w=0000 (until reboot), or" in (
        r.out.splitlines()
    )
    assert run_cli(["--root", str(h200), "-j", "topo"]).json["gpudirect"][2] == {
        "status": "fail", "subject": "GPU0-mlx5_0",
        "said": found[2][2], "fix": f"setpci -s {dsp.name} ECAP_ACS+0x6.w=0000 (until reboot), "
        "or turn ACS off in the firmware setup",
    }  # fmt: skip


def test_only_the_header_readable_is_unknown_and_says_to_run_as_root(h200):
    dsp = _gpu0(h200).parent
    config = dsp / "config"
    config.write_bytes(config.read_bytes()[:64])  # what a reader without CAP_SYS_ADMIN gets
    found = readiness(h200)
    assert ("unknown", "GPU0-mlx5_0", f"ACS of {dsp.name}: only the header is readable "
            "without CAP_SYS_ADMIN") in found  # fmt: skip


def test_peermem_unloaded_and_the_iommu_translating(h200):
    import shutil

    shutil.rmtree(h200 / "sys/module/nvidia_peermem")
    gpu_trees.iommu_types(h200, "DMA")
    found = readiness(h200)
    assert found[0] == ("FAIL", "registration", "nvidia-peermem is not loaded")
    assert ("warn", "GPU3-mlx5_3", "the IOMMU translates DMA (DMA)") in found
    (h200 / "sys/kernel/iommu_groups/1/type").unlink()  # GPU0's root port's; not GPU0's
    for group in (h200 / "sys/kernel/iommu_groups").iterdir():
        (group / "type").unlink(missing_ok=True)
    found = readiness(h200)
    assert ("unknown", "GPU0-mlx5_0", "the IOMMU's mode cannot be told (Linux before 5.11 has "
            "no group type)") in found  # fmt: skip


def test_dma_buf_stands_in_for_peermem_with_the_open_module():
    from ibtool.model.topo import GpuDirectFacts, judge_gpudirect

    topo = Topology((Gpu(0, PciFunction("0000:01:00.0", 0x10DE, 0x2330, 0x030200)),), ())
    facts = GpuDirectFacts(False, True, None, (6, 8), 50, False, {}, {})
    assert judge_gpudirect(topo, facts)[0].said == (
        "dma-buf: the open NVIDIA kernel module, Linux 6.8, rdma-core 50"
    )
    old = GpuDirectFacts(False, True, None, (5, 10), 33, False, {}, {})
    assert judge_gpudirect(topo, old)[0].said == (
        "nvidia-peermem is not loaded and dma-buf cannot be used (Linux 5.10 is older than "
        "5.12; rdma-core 33 is older than 34)"
    )


@pytest.mark.parametrize(
    "data",
    [
        bytes(4096),
        b"\xff" * 4096,
        # a capability list and an extended list that point at themselves
        bytes(6) + b"\x10\x00" + bytes(0x34 - 8) + b"\x40" + bytes(11) + b"\x01\x40"
        + bytes(0x100 - 0x42) + (0x000D | 1 << 16 | 0x100 << 20).to_bytes(4, "little")
        + bytes(4096 - 0x104),
        bytes(300),
    ],
)  # fmt: skip
def test_a_hostile_config_space_ends(data):
    from ibtool.sources.sysfs.pci import parse_config

    config = parse_config(data)
    assert config.readable == len(data)


def test_a_config_file_too_large_is_not_read(h200):
    dsp = _gpu0(h200).parent
    (dsp / "config").write_bytes(bytes(8192))
    host = Host(str(h200), (warnings := []).append)
    host.gpudirect(host.topology())
    assert any(w.endswith(f"{dsp.name}/config: larger than 4096 bytes: not read") for w in warnings)


# -- captures -----------------------------------------------------------------------------------


def _save(root: Path, path: Path) -> dict:
    from ibtool.errors import IbtoolError
    from ibtool.snapshot import save as snapshot
    from ibtool.sources.netlink import NldevClient
    from tests.fixtures import captured_kernel
    from tests.fixtures.netlink import FakeKernel

    def no_verbs():
        raise IbtoolError("pyverbs is not installed")

    return snapshot.save(
        str(path), lambda m: None, "test", root=str(root),
        open_netlink=lambda: NldevClient(sock=FakeKernel(captured_kernel.answer)),
        open_verbs=no_verbs, release="6.8.0-45-generic", comm=lambda pid: None,
    )  # fmt: skip


@pytest.mark.parametrize("tree", TREES)
def test_a_snapshot_answers_topo_as_the_tree_did(built, tree, tmp_path):
    path = tmp_path / "node.json.gz"
    data = _save(built[tree], path)
    for argv in (["topo"], ["-j", "topo"], ["topo", "--nccl"], ["-d", "topo"]):
        from_tree = run_cli(["--root", str(built[tree]), *argv])
        replayed = run_cli(["--snapshot", str(path), *argv])
        assert (replayed.code, replayed.err) == (0, ""), argv
        assert replayed.out == from_tree.out, argv
    assert data["gpudirect"]["rdma_core"] is None  # not the running host's


def test_a_snapshot_keeps_no_serial_number_nor_vpd(built, tmp_path):
    import base64
    import shutil
    import struct

    root = tmp_path / "t"
    shutil.copytree(built["hgx-h200"], root, symlinks=True)
    gpu = _gpu0(root)
    (gpu / "vpd").write_bytes(b"\x82\x10\x00SN: MT2233X00001")
    config = bytearray((gpu / "config").read_bytes())
    # a Device Serial Number capability after the ATS one the fixture has at 0x100
    config[0x100 + 2 : 0x100 + 4] = struct.pack("<H", 1 | 0x110 << 4)
    config[0x110:0x11C] = struct.pack("<IQ", 0x0003 | 1 << 16, 0x0123456789ABCDEF)
    (gpu / "config").write_bytes(bytes(config))
    data = _save(root, tmp_path / "s.json")
    entries = {e["path"]: e for e in data["sysfs"]}
    rel = str(gpu.relative_to(root))
    assert rel + "/vpd" not in entries
    kept = base64.b64decode(entries[rel + "/config"]["bytes"])
    assert kept[0x114:0x11C] == bytes(8) and kept[:0x110] == bytes(config[:0x110])


def test_a_damaged_gpudirect_record_is_exit_7(built, tmp_path):
    import gzip
    import json

    path = tmp_path / "s.json.gz"
    _save(built["hgx-h200"], path)
    data = json.loads(gzip.decompress(path.read_bytes()))
    for bad in ({"modules": {"nvidia_peermem": "yes"}, "rdma_core": None},
                {"modules": None}, [], {"modules": {"x" * 10: True}, "rdma_core": None},
                {"modules": None, "rdma_core": "9" * 100}):  # fmt: skip
        data["gpudirect"] = bad
        path.write_bytes(gzip.compress(json.dumps(data).encode()))
        r = run_cli(["--snapshot", str(path), "topo"])
        assert r.code == 7, bad
        assert r.err.startswith("ibtool: error: ") and "'gpudirect' is malformed" in r.err


# -- doctor's line ------------------------------------------------------------------------------


def _doctor(root: Path, dev: str) -> dict:
    r = run_cli(["--root", str(root), "-j", "doctor", "--no-probe", "--dev", dev])
    return next((f for f in r.json["checks"] if f["check"] == "gpudirect"), None)


def test_doctor_judges_the_gpus_its_port_serves(built, h200):
    assert _doctor(built["hgx-h200"], "mlx5_3") == {
        "check": "gpudirect", "status": "PASS", "evidence": "GPU3 PIX: ready, nvidia-peermem is "
        "loaded", "fix": None,
    }  # fmt: skip
    storage = _doctor(built["dgx-a100"], "mlx5_4")
    assert (storage["status"], storage["evidence"][:40]) == (
        "SKIP",
        "mlx5_4 is no GPU's closest RDMA device (",
    )
    _acs_ctrl(_gpu0(h200).parent / "config", gpu_trees.ACS_RR | gpu_trees.ACS_CR)
    broken = _doctor(h200, "mlx5_0")
    assert broken["status"] == "FAIL" and broken["fix"].startswith("setpci -s 0000:17:01.0 ")
    assert _doctor(h200, "mlx5_1")["status"] == "PASS"  # GPU1's switch is not GPU0's


def test_doctor_on_a_host_without_gpus_has_no_gpudirect_line(tmp_path):
    from tests.fixtures import sysfs_trees

    root = sysfs_trees.build("mlx5_roce", tmp_path / "t")
    assert _doctor(root, "mlx5_0") is None


# -- the health check ---------------------------------------------------------------------------


def _health(root: Path, tmp_path: Path, table: str | None) -> tuple[int, list[str]]:
    argv = ["--root", str(root), "health", "--no-state"]
    if table is not None:
        config = tmp_path / "health.toml"
        config.write_text(table)
        argv += ["--config", str(config)]
    r = run_cli(argv)
    return r.code, [line for line in r.out.splitlines() if "] gpudirect " in line]


def test_the_health_check_is_opt_in(built, tmp_path):
    assert _health(built["hgx-h200"], tmp_path, None) == (0, [])
    code, lines = _health(built["hgx-h200"], tmp_path, "[checks.gpudirect]\ngpus = 8\n")
    assert code == 0 and len(lines) == 9
    assert lines[0] == "[OK] gpudirect nvidia-peermem is loaded"


def test_the_health_check_names_a_missing_gpu_and_acs(h200, tmp_path):
    import shutil

    _acs_ctrl(_gpu0(h200).parent / "config", gpu_trees.ACS_RR)
    gpu7 = Path(os.path.realpath(h200 / "sys/bus/pci/devices/0000:df:00.0"))
    shutil.rmtree(gpu7)  # fell off the bus
    (h200 / "sys/bus/pci/devices/0000:df:00.0").unlink()
    code, lines = _health(h200, tmp_path, "[checks.gpudirect]\ngpus = 8\n")
    assert code == 2
    assert lines[:2] == [
        "[CRITICAL] gpudirect 7 GPUs of 8: a GPU is missing from the PCI bus",
        "[CRITICAL] gpudirect GPU0-mlx5_0: ACS on bridge 0000:17:01.0 sends peer-to-peer traffic "
        "up to the root complex (ACSCtl: SrcValid- TransBlk- ReqRedir+ CmpltRedir- UpstreamFwd- "
        "EgressCtrl- DirectTrans-) (fix: setpci -s 0000:17:01.0 ECAP_ACS+0x6.w=0000 (until "
        "reboot), or turn ACS off in the firmware setup)",
    ]
    from ibtool_plugins.topo import check_gpudirect

    from ibtool.health.config import HealthConfig
    from ibtool.health.run import CheckContext

    config = HealthConfig(checks={"gpudirect": {"gpus": 8}})
    results = list(check_gpudirect(CheckContext(Host(str(h200)), config, {"gpus": 8})))
    assert [r.kind for r in results if r.status.name != "OK"] == ["gpu_missing", "gdr_acs"]


@pytest.mark.parametrize(
    "table, said",
    [
        ("distance = 'FAR'", "distance must be one of PIX, PXB, PHB, NODE, SYS"),
        ("gpus = 0", "gpus must be a number from 1 to 64"),
        ("gpu = 8", "names no option 'gpu' (gpus, distance)"),
    ],
)
def test_a_bad_gpudirect_table_is_unknown_naming_it(built, tmp_path, table, said):
    code, lines = _health(built["hgx-h200"], tmp_path, f"[checks.gpudirect]\n{table}\n")
    assert (code, lines) == (3, [f"[UNKNOWN] gpudirect GPUDirect RDMA not checked: "
                                 f"[checks.gpudirect] {said}"])  # fmt: skip


def test_the_distance_option_moves_the_warning(built, tmp_path):
    _, lines = _health(built["pcie-server"], tmp_path, "[checks.gpudirect]\ndistance = 'NODE'\n")
    assert not any("farther than" in line for line in lines)


def test_without_gpus_every_active_port_is_named_pci_or_not():
    rxe = Nic("rxe0", None, (NicPort(1, "Ethernet", "ACTIVE", "veth0", 1),))
    hca = _nic("mlx5_0", fn("0000:01:00.0", RP))
    env = nccl_environment(Topology((), (hca,), (rxe,)), "eth0", None)
    assert dict(env.variables) == {
        "NCCL_IB_HCA": "=mlx5_0:1,rxe0:1", "NCCL_IB_GID_INDEX": "1", "NCCL_SOCKET_IFNAME": "=eth0",
    }  # fmt: skip
    with_gpu = Topology((Gpu(0, fn("0000:02:00.0", RP)),), (hca,), (rxe,))
    assert dict(nccl_environment(with_gpu, None, None).variables) == {"NCCL_IB_HCA": "=mlx5_0:1"}


def test_the_two_socket_server_says_its_first_socket_has_no_nic(built):
    topo, _ = topology_of(built["two-socket"])
    env = nccl_environment(topo, None, None)
    assert dict(env.variables) == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}
    assert [n[:55] for n in env.notes] == [
        "GPU0 (0000:18:00.0) has no RDMA device closer than SYS:",
        "GPU1 (0000:3b:00.0) has no RDMA device closer than SYS:",
    ]


def test_a_virtual_function_is_no_job_s_nic_beside_its_pf(h200):
    import shutil

    pf = _gpu0(h200).parent.parent / "0000:17:00.0" / "0000:18:00.0"  # mlx5_0's function
    assert (pf / "infiniband" / "mlx5_0").is_dir()
    vf_fn = gpu_trees.Fn(gpu_trees.MELLANOX, 0x101E, 0x020700, 0, "0-47,96-143",
                         driver="mlx5_core", ats=False)  # fmt: skip
    vf = gpu_trees.function(
        h200, str((pf.parent / "0000:18:00.2").relative_to(h200 / "sys/devices")), vf_fn
    )  # noqa: E501
    os.symlink("../0000:18:00.0", vf / "physfn")
    gpu_trees.ib_nic(h200, "mlx5_8", vf, 0x946DAE0300FF0018, "400 Gb/sec (4X NDR)")
    topo, warnings = topology_of(h200)
    assert warnings == []
    assert [n.name for n in topo.nics][-1] == "mlx5_8"  # in the matrix, as nvidia-smi has it
    level, nics = topo.closest(topo.gpus[0])
    assert (level, [n.name for n in nics]) == ("PIX", ["mlx5_0"])
    env = nccl_environment(topo, None, None)
    assert "mlx5_8" not in dict(env.variables)["NCCL_IB_HCA"]
    # in a pod, the VF without its PF: the VF is the GPU's
    shutil.rmtree(pf / "infiniband")
    (h200 / "sys/class/infiniband/mlx5_0").unlink()
    topo, _ = topology_of(h200)
    assert [n.name for n in topo.closest(topo.gpus[0])[1]] == ["mlx5_8"]


def test_without_gpus_the_virtual_functions_stay_out(tmp_path):
    from tests.fixtures import sysfs_trees

    root = tmp_path / "vfs"
    root.mkdir()
    sysfs_trees.sriov_vfs(root, count=3)  # mlx5_0 the PF, mlx5_1..3 its VFs
    topo, _ = topology_of(root)
    assert [n.name for n in topo.nics] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert [n.name for n in topo.for_jobs()] == ["mlx5_0"]
    assert dict(nccl_environment(topo, None, None).variables)["NCCL_IB_HCA"] == "=mlx5_0:1"

"""`ibtool topo` on the testbed's running kernel: the VM's real PCI bus read (its functions'
classes, links and configuration space, no GPU among them), the Soft-RoCE devices named as
having no PCI function, and --nccl from the kernel's own route and the --best GID rule. The
GPU machines themselves are fixture trees (tests/unit/test_topo.py): no testbed has a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ibtool.sources.sysfs.pci import parse_config

pytestmark = pytest.mark.integration


def ibtool(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ibtool", *argv], capture_output=True, text=True, timeout=180
    )


def test_topo_reads_the_running_kernel(testbed):
    proc = ibtool("-j", "topo")
    assert (proc.returncode, proc.stderr) == (0, "")
    data = json.loads(proc.stdout)
    assert data["gpus"] == [] and data["gpudirect"] == []
    assert testbed["device"] in data["not_pci"]  # rxe: a netdev's device, on no slot
    text = ibtool("topo")
    assert text.returncode == 0
    assert text.stdout.splitlines()[0] == "no GPU (NVIDIA or AMD, by PCI class) on this host"
    assert f"not on PCI (a netdev's): {', '.join(data['not_pci'])}" in text.stdout


def test_nccl_names_the_soft_roce_ports_with_the_best_gid_and_the_default_route(testbed):
    proc = ibtool("-j", "topo", "--nccl")
    assert (proc.returncode, proc.stderr) == (0, "")
    env = json.loads(proc.stdout)
    hca = env["environment"]["NCCL_IB_HCA"]
    assert f"{testbed['device']}:1" in hca.lstrip("=").split(",")
    best = ibtool("gids", "--best", testbed["netdev"]).stdout.split()
    assert env["environment"].get("NCCL_IB_GID_INDEX") in (None, *best)  # when the ports agree
    route = subprocess.run(["ip", "-j", "route", "get", "192.0.2.1"], capture_output=True,
                           text=True)  # fmt: skip
    if route.returncode == 0:  # the oracle: iproute2's answer for the same address
        assert env["environment"]["NCCL_SOCKET_IFNAME"] == "=" + json.loads(route.stdout)[0]["dev"]
    else:
        assert "NCCL_SOCKET_IFNAME is not set: no default route" in env["notes"]


def test_every_config_space_of_the_vm_parses_as_the_kernel_sized_it():
    """The VM's real functions: the config file is what the kernel gives root (256 bytes for a
    conventional function, 4096 for PCI Express), parsed without fault; a PCI Express one has
    its port type."""
    bus = "/sys/bus/pci/devices"
    seen = 0
    for name in sorted(os.listdir(bus)):
        with open(os.path.join(bus, name, "config"), "rb") as f:
            data = f.read(4097)
        config = parse_config(data)
        assert config.readable == len(data) in (64, 256, 4096), name
        if len(data) == 4096 and os.path.exists(os.path.join(bus, name, "current_link_speed")):
            assert config.port_type is not None, name
        seen += 1
    assert seen

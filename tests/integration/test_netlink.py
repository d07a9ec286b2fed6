"""The NLDEV client on the live kernel, against iproute2's rdma, which no one here wrote.

GET against `rdma -j dev show`, PORT_GET against `rdma -j link show`, SYS_GET against
`rdma system show` (iproute2 6.1 prints that one as text even under -j), RES_GET against
`rdma -j res show`, STAT_GET against `rdma -j stat show`; then what the kernel refuses, and
`ibtool system set` (each setting put back afterwards).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys

import pytest

from ibtool.cli import main
from ibtool.errors import ExitCode, UnsupportedError
from ibtool.model.records import PhysState
from ibtool.sources.netlink import AsyncNldevClient, NldevClient, records

pytestmark = pytest.mark.integration

# Device capability bits as iproute2's rdma/dev.c names them (typos included).
DEVICE_CAPS = {
    "RESIZE_MAX_WR": 0,
    "BAD_PKEY_CNTR": 1,
    "BAD_QKEY_CNTR": 2,
    "RAW_MULTI": 3,
    "AUTO_PATH_MIG": 4,
    "CHANGE_PHY_PORT": 5,
    "UD_AV_PORT_ENFORCE_PORT_ENFORCE": 6,
    "CURR_QP_STATE_MOD": 7,
    "SHUTDOWN_PORT": 8,
    "INIT_TYPE": 9,
    "PORT_ACTIVE_EVENT": 10,
    "SYS_IMAGE_GUID": 11,
    "RC_RNR_NAK_GEN": 12,
    "SRQ_RESIZE": 13,
    "N_NOTIFY_CQ": 14,
    "LOCAL_DMA_LKEY": 15,
    "MEM_WINDOW": 17,
    "UD_IP_CSUM": 18,
    "UD_TSO": 19,
    "XRC": 20,
    "MEM_MGT_EXTENSIONS": 21,
    "BLOCK_MULTICAST_LOOPBACK": 22,
    "MEM_WINDOW_TYPE_2A": 23,
    "MEM_WINDOW_TYPE_2B": 24,
    "RC_IP_CSUM": 25,
    "RAW_IP_CSUM": 26,
    "CROSS_CHANNEL": 27,
    "MANAGED_FLOW_STEERING": 29,
    "SIGNATURE_HANDOVER": 30,
    "ON_DEMAND_PAGING": 31,
    "SG_GAPS_REG": 32,
    "VIRTUAL_FUNCTION": 33,
    "RAW_SCATTER_FCS": 34,
    "RDMA_NETDEV_OPA_VNIC": 35,
    "PCI_WRITE_END_PADDING": 36,
}


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout


def rdma_json(*args: str):
    return json.loads(sh("rdma", "-j", *args))


@pytest.fixture(scope="module")
def nl():
    with NldevClient() as client:
        yield client


@pytest.fixture(scope="module")
def devices(nl):
    return {d["RDMA_NLDEV_ATTR_DEV_NAME"]: d for d in nl.devices()}


def test_get_dump_agrees_with_rdma_dev_show(devices):
    theirs = {d["ifname"]: d for d in rdma_json("-d", "dev", "show")}
    assert set(devices) == set(theirs) == set(os.listdir("/sys/class/infiniband"))
    for name, reply in devices.items():
        rdma = theirs[name]
        device = records.device(reply)
        assert reply["RDMA_NLDEV_ATTR_DEV_INDEX"] == rdma["ifindex"]
        assert device.node_type.key == rdma["node_type"]
        assert device.node_guid == rdma["node_guid"]
        assert device.sys_image_guid == rdma["sys_image_guid"]
        assert device.fw_ver == rdma.get("fw")
        assert bool(reply["RDMA_NLDEV_ATTR_DEV_DIM"]) == rdma["adaptive-moderation"]
        caps = reply["RDMA_NLDEV_ATTR_CAP_FLAGS"]
        assert sorted(DEVICE_CAPS[c] for c in rdma["caps"]) == [
            bit for bit in range(64) if caps >> bit & 1
        ]


def test_get_doit_is_what_the_dump_says(nl, devices):
    for reply in devices.values():
        assert nl.device(reply["RDMA_NLDEV_ATTR_DEV_INDEX"]) == reply


def _iproute2_phys_state(state: PhysState) -> str:
    # rdma(8) calls physical state 4 ARMED; ibtool uses its IBTA name.
    return "ARMED" if state == PhysState.PORT_CONFIGURATION_TRAINING else state.name


def test_port_get_agrees_with_rdma_link_show(nl, devices):
    theirs = {(p["ifname"], p["port"]): p for p in rdma_json("link", "show")}
    ours = {}
    for reply in devices.values():
        index = reply["RDMA_NLDEV_ATTR_DEV_INDEX"]
        for port_reply in nl.ports(index):
            port = records.port(port_reply)
            assert nl.port(index, port.port) == port_reply  # the doit reply comes typed GET
            ours[(port.device, port.port)] = (port, port_reply)
    assert set(ours) == set(theirs)
    for key, (port, reply) in ours.items():
        rdma = theirs[key]
        assert reply["RDMA_NLDEV_ATTR_DEV_INDEX"] == rdma["ifindex"]
        assert port.state.name == rdma["state"]
        assert _iproute2_phys_state(port.physical_state) == rdma["physical_state"]
        assert port.netdev == rdma.get("netdev")
        assert reply.get("RDMA_NLDEV_ATTR_NDEV_INDEX") == rdma.get("netdev_index")
        for field in ("lid", "sm_lid", "lmc"):
            assert getattr(port, field) == rdma.get(field), field


def rdma_system() -> dict[str, str]:
    words = sh("rdma", "system", "show").split()
    return dict(zip(words[::2], words[1::2]))


def _on_off(value: bool | None) -> str:
    return "on" if value else "off"  # rdma(8) shows a setting the kernel lacks as off


def test_sys_get_agrees_with_rdma_system_show(nl):
    system = records.rdma_system(nl.system())
    theirs = rdma_system()
    assert system.netns_mode.key == theirs["netns"]
    assert _on_off(system.copy_on_fork) == theirs["copy-on-fork"]
    # Older iproute2 (Debian 12's 6.1) prints neither of these.
    if "privileged-qkey" in theirs:
        assert _on_off(system.privileged_qkey) == theirs["privileged-qkey"]
    if "monitor" in theirs:
        assert _on_off(system.monitor) == theirs["monitor"]


def test_ibtool_system_agrees_with_rdma_system_show():
    ours = shown_system()
    theirs = rdma_system()
    assert ours["netns"] == theirs["netns"]
    assert _on_off(ours["copy-on-fork"]) == theirs["copy-on-fork"]


def test_res_get_dump_agrees_with_rdma_res_show(nl):
    theirs = {r["ifname"]: r for r in rdma_json("res", "show")}
    ours = {r["RDMA_NLDEV_ATTR_DEV_NAME"]: r for r in nl.resource_summaries()}
    assert set(ours) == set(theirs)
    for name, reply in ours.items():
        rdma = theirs[name]
        summary = records.resource_summary(reply)
        assert summary == {k: rdma[k] for k in summary}


def test_stat_get_agrees_with_rdma_statistic_show(nl, devices):
    for name, reply in devices.items():
        index = reply["RDMA_NLDEV_ATTR_DEV_INDEX"]
        before = {s.name: s.value for s in records.hw_counters(nl.hw_counters(index, 1))}
        (rdma,) = rdma_json("statistic", "show", "link", f"{name}/1")
        after = {s.name: s.value for s in records.hw_counters(nl.hw_counters(index, 1))}
        assert set(before) == set(after) == set(rdma) - {"ifname", "ifindex", "port"}
        for counter, value in rdma.items():
            if counter in before:
                assert before[counter] <= value <= after[counter], counter


def test_the_async_client_in_a_running_loop_agrees(nl, devices):
    async def main():
        async with AsyncNldevClient() as anl:
            return await asyncio.gather(anl.devices(), anl.system())

    async_devices, async_system = asyncio.run(main())
    assert {d["RDMA_NLDEV_ATTR_DEV_NAME"]: d for d in async_devices} == devices
    assert async_system == nl.system()


def test_a_command_the_kernel_does_not_have(nl):
    with pytest.raises(UnsupportedError, match="this kernel does not support NLDEV command 8"):
        nl.request(8)  # "8 is free to use" in every kernel so far


def ibtool(*args: str) -> tuple[int, str, str]:
    """ibtool run in this process (a Python start costs seconds in the emulated guest)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def shown_system() -> dict:
    code, out, err = ibtool("-j", "system")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def restore_system():
    """Whatever a test sets, the settings it found are put back."""
    before = shown_system()
    yield before
    ibtool("system", "set", "netns", before["netns"])
    if before["privileged-qkey"] is not None:
        ibtool("system", "set", "privileged-qkey", "on" if before["privileged-qkey"] else "off")
    assert shown_system() == before


def test_set_privileged_qkey_and_back(restore_system):
    if restore_system["privileged-qkey"] is None:
        pytest.skip("this kernel has no privileged QKEY mode")
    for value, expected in (("on", True), ("off", False)):
        assert ibtool("system", "set", "privileged-qkey", value) == (0, "", "")
        assert shown_system()["privileged-qkey"] is expected


def test_set_netns_exclusive_and_back_or_busy(restore_system):
    # The kernel changes the mode only while the initial network namespace is the only one.
    code, _, err = ibtool("system", "set", "netns", "exclusive")
    if code == ExitCode.FAILED:
        assert "Device or resource busy" in err
        assert "no network namespace but the initial one" in err
        assert len(sh("lsns", "-t", "net", "-n").splitlines()) > 1
        return
    assert (code, err) == (0, "")
    assert shown_system()["netns"] == rdma_system()["netns"] == "exclusive"
    assert ibtool("system", "set", "netns", "shared") == (0, "", "")
    assert shown_system()["netns"] == rdma_system()["netns"] == "shared"


WITHOUT_NET_ADMIN = """
import io, json, sys
from ibtool.cli import main
for argv in (["system"], ["system", "set", "netns", "shared"]):
    err = io.StringIO()
    code = main(argv, stdout=io.StringIO(), stderr=err)
    print(json.dumps([code, err.getvalue()]))
"""


def test_without_cap_net_admin_show_works_and_set_names_the_capability(restore_system):
    # One Python start for both: it costs about ten seconds in the emulated guest.
    proc = subprocess.run(
        ["setpriv", "--inh-caps=-all", "--bounding-set=-net_admin"]
        + [sys.executable, "-c", WITHOUT_NET_ADMIN],
        capture_output=True,
        text=True,
        timeout=120,
    )
    show, set_ = (json.loads(line) for line in proc.stdout.splitlines())
    assert show == [0, ""], proc.stderr
    assert set_ == [
        ExitCode.PERMISSION,
        "ibtool: error: RDMA_NLDEV_CMD_SYS_SET needs CAP_NET_ADMIN (hint: the kernel asks for "
        "CAP_NET_ADMIN for changing the netns or privileged QKEY mode: run as root)\n",
    ]

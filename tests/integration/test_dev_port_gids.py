"""dev, port and gids against tools no one here wrote, on the live kernel.

Oracles: rdma -j (iproute2), ibv_devinfo -v (rdma-core), sysfs.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

SYS = "/sys/class/infiniband"


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout


def ibtool_json(*args: str):
    proc = subprocess.run(
        [sys.executable, "-m", "ibtool", "-j", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def devinfo() -> dict:
    """ibv_devinfo -v as {dev: {"fields": {...}, "ports": {n: {..., "gids": {i: (gid, type)}}}}}."""
    result: dict = {}
    dev = port = None
    for line in sh("ibv_devinfo", "-v").splitlines():
        if m := re.match(r"hca_id:\s*(\S+)", line):
            dev, port = m.group(1), None
            result[dev] = {"fields": {}, "ports": {}}
        elif m := re.match(r"\s+port:\s*(\d+)", line):
            port = int(m.group(1))
            result[dev]["ports"][port] = {"gids": {}}
        elif m := re.match(r"\s+GID\[\s*(\d+)\]:\s*(\S+?),?\s*(RoCE v[12]|IB)?\s*$", line):
            result[dev]["ports"][port]["gids"][int(m.group(1))] = (
                m.group(2).rstrip(","),
                m.group(3),
            )
        elif m := re.match(r"\s+(\w+):\s+(.*)$", line):
            target = result[dev]["ports"][port] if port else result[dev]["fields"]
            target.setdefault(m.group(1), m.group(2).strip())
    return result


def test_dev_agrees_with_rdma_dev_show():
    ours = {d["ifname"]: d for d in ibtool_json("dev")}
    theirs = {d["ifname"]: d for d in json.loads(sh("rdma", "-j", "dev", "show"))}
    assert set(ours) == set(theirs) == set(os.listdir(SYS))
    for name, t in theirs.items():
        o = ours[name]
        assert o["node_type"] == t["node_type"]
        assert o["node_guid"] == t["node_guid"]
        assert o["sys_image_guid"] == t["sys_image_guid"]
        assert o.get("fw") == t.get("fw")


def test_dev_details_agree_with_ibv_devinfo():
    info = devinfo()
    for d in ibtool_json("-d", "dev"):
        fields = info[d["ifname"]]["fields"]
        caps = d["caps"]
        assert caps is not None, "pyverbs details missing in the testbed"
        assert caps["max_qp"] == int(fields["max_qp"])
        assert caps["max_cq"] == int(fields["max_cq"])
        assert caps["max_mr_size"] == int(fields["max_mr_size"], 0)
        assert caps["phys_port_cnt"] == int(fields["phys_port_cnt"]) == d["ports"]
        assert caps["atomic_caps"] in fields["atomic_cap"]


def test_port_agrees_with_rdma_link_show():
    ours = {(p["ifname"], p["port"]): p for p in ibtool_json("port")}
    theirs = {(p["ifname"], p["port"]): p for p in json.loads(sh("rdma", "-j", "link", "show"))}
    assert set(ours) == set(theirs)
    for key, t in theirs.items():
        o = ours[key]
        assert o["state"] == t["state"]
        assert o["physical_state"] == t["physical_state"]
        assert o.get("netdev") == t.get("netdev")
        for field in ("lid", "sm_lid", "lmc"):
            if field in t:
                assert o[field] == t[field]


def test_details_merge_netlink_and_say_where_each_field_came_from():
    plain = {d["ifname"]: d for d in ibtool_json("dev")}
    theirs = {d["ifname"]: d for d in json.loads(sh("rdma", "-j", "dev", "show"))}
    for d in ibtool_json("-d", "dev"):
        src = d["sources"]
        assert src["node_type"] == src["node_guid"] == src["ports"] == "netlink", src
        assert src["node_desc"] == "sysfs"
        assert d["node_guid"] == plain[d["ifname"]]["node_guid"] == theirs[d["ifname"]]["node_guid"]
    links = {(p["ifname"], p["port"]): p for p in json.loads(sh("rdma", "-j", "link", "show"))}
    for p in ibtool_json("-d", "port"):
        src = p["sources"]
        assert src["state"] == src["physical_state"] == src["netdev"] == "netlink", src
        assert src["rate"] == "sysfs" and src["active_mtu"] == src["max_mtu"] == "verbs"
        t = links[(p["ifname"], p["port"])]
        assert (p["state"], p["physical_state"], p["netdev"]) == (
            t["state"],
            t["physical_state"],
            t["netdev"],
        )


def test_port_details_agree_with_ibv_devinfo():
    info = devinfo()
    for p in ibtool_json("-d", "port"):
        theirs = info[p["ifname"]]["ports"][p["port"]]
        assert theirs["state"].startswith(f"PORT_{p['state']}")
        assert p["link_layer"] == theirs["link_layer"]
        assert p["active_mtu"] == int(theirs["active_mtu"].split()[0])
        assert p["max_mtu"] == int(theirs["max_mtu"].split()[0])
        assert (p["lid"] or 0) == int(theirs["port_lid"], 0)


def test_port_details_show_the_pkey_table_vls_and_apm_as_the_kernel_has_them():
    info = devinfo()
    rdma_caps = {
        d["ifname"]: d.get("caps", []) for d in json.loads(sh("rdma", "-d", "-j", "dev", "show"))
    }
    for p in ibtool_json("-d", "port"):
        table = f"{SYS}/{p['ifname']}/ports/{p['port']}/pkeys"
        kernel = {int(i): int(open(f"{table}/{i}").read(), 16) for i in os.listdir(table)}
        assert p["pkey_tbl_len"] == len(kernel)
        assert [(k["index"], int(k["pkey"], 16)) for k in p["pkeys"]] == sorted(
            (i, v) for i, v in kernel.items() if v
        )
        for k in p["pkeys"]:
            value = int(k["pkey"], 16)
            assert k["membership"] == ("full" if value & 0x8000 else "limited")
            assert k["default"] == (value & 0x7FFF == 0x7FFF)
        theirs = info[p["ifname"]]["ports"][p["port"]]
        assert p["pkey_tbl_len"] == int(theirs["pkey_tbl_len"])
        assert p["max_vl_num"] == int(theirs["max_vl_num"].split()[0])
        assert p["auto_path_mig"] == ("AUTO_PATH_MIG" in rdma_caps[p["ifname"]])
        assert p["sources"]["auto_path_mig"] == "netlink"
        assert p["sources"]["max_vl_num"] == "verbs" and p["sources"]["pkeys"] == "sysfs"
        assert p["sl2vl"] is None  # rxe shows no SL-to-VL table


def test_gids_agree_with_ibv_devinfo_and_sysfs():
    info = devinfo()
    ours = ibtool_json("gids")
    assert ours, "the testbed has GIDs"
    seen = set()
    for g in ours:
        theirs_gid, theirs_type = info[g["ifname"]]["ports"][g["port"]]["gids"][g["index"]]
        assert ipaddress.ip_address(theirs_gid) == ipaddress.ip_address(
            bytes.fromhex(g["gid"].replace(":", ""))
        )
        assert g["type"] == theirs_type
        path = f"{SYS}/{g['ifname']}/ports/{g['port']}/gid_attrs/ndevs/{g['index']}"
        assert g["netdev"] == open(path).read().strip()
        seen.add((g["ifname"], g["port"], g["index"]))
    listed = {
        (d, p, i)
        for d, ports in info.items()
        for p, port in ports["ports"].items()
        for i in port["gids"]
    }
    assert seen == listed


def test_best_gid_is_the_ipv4_roce_v2_gid_of_the_netdev():
    for p in ibtool_json("port"):
        if p["link_layer"] != "Ethernet" or not p.get("netdev"):
            continue
        best = ibtool_json("gids", "--best", p["netdev"])
        assert best["type"] == "RoCE v2"
        assert best["netdev"] == p["netdev"]
        addrs = json.loads(sh("ip", "-j", "addr", "show", "dev", p["netdev"]))[0]["addr_info"]
        v4 = [a["local"] for a in addrs if a["family"] == "inet"]
        if v4:
            assert best["ip"] in v4


def ibtool_raw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ibtool", *args], capture_output=True, text=True, timeout=60
    )


def test_port_state_follows_the_link(link_down):
    (port,) = ibtool_json("port", "rxe0/1")
    assert (port["state"], port["physical_state"]) == ("DOWN", "DISABLED")
    theirs = json.loads(sh("rdma", "-j", "link", "show", "rxe0/1"))[0]
    assert (port["state"], port["physical_state"]) == (theirs["state"], theirs["physical_state"])


def test_deleted_device_is_unknown_with_the_devices_that_exist(rxe_deleted):
    proc = ibtool_raw("port", "rxe0")
    assert proc.returncode in (3, 4) and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("ibtool: error: ")


def test_unloaded_driver_is_no_rdma_devices_with_the_hint(rxe_unloaded):
    proc = ibtool_raw("dev")
    assert proc.returncode == 3 and proc.stdout == ""
    assert "no RDMA devices" in proc.stderr and "rdma link add" in proc.stderr


def test_fabric_on_a_roce_only_host_says_there_is_no_subnet_to_scan():
    """SoftRoCE has no InfiniBand port: `ibtool fabric` says so through the real libibumad,
    whether the kernel gives rxe a umad device (a RoCE port) or none (no CA), in one line."""
    r = subprocess.run(
        [sys.executable, "-m", "ibtool", "fabric"], capture_output=True, text=True, timeout=300
    )
    assert (r.returncode, r.stdout) == (6, "")
    lines = [line for line in r.stderr.splitlines() if not line.startswith("ibtool: warning:")]
    assert len(lines) == 1
    assert (
        "a RoCE port has no subnet to scan" in lines[0] or "no InfiniBand device here" in lines[0]
    )

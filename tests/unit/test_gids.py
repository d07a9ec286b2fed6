"""`ibtool gids`: the GID table without empty slots, its filters, and `--best`, the RoCE v2 GID
index an application should use."""

from __future__ import annotations

import ipaddress

import pytest

ROCE_LL = "fe80:0000:0000:0000:0e42:a1ff:fe5e:9b10"  # EUI-64 of 0c:42:a1:5e:9b:10
V4 = "0000:0000:0000:0000:0000:ffff:c0a8:0a01"
V6 = "2001:0db8:0010:0000:0000:0000:0000:0001"
VLAN_V4 = "0000:0000:0000:0000:0000:ffff:c0a8:6401"


def roce_row(index, gid, gid_type, netdev, vlan, ip):
    return {
        "ifname": "mlx5_0",
        "port": 1,
        "index": index,
        "gid": gid,
        "type": gid_type,
        "netdev": netdev,
        "vlan": vlan,
        "ip": ip,
    }


ROCE_TABLE = [
    roce_row(0, ROCE_LL, "RoCE v1", "enp3s0f0", None, "fe80::e42:a1ff:fe5e:9b10"),
    roce_row(1, ROCE_LL, "RoCE v2", "enp3s0f0", None, "fe80::e42:a1ff:fe5e:9b10"),
    roce_row(2, V4, "RoCE v1", "enp3s0f0", None, "192.168.10.1"),
    roce_row(3, V4, "RoCE v2", "enp3s0f0", None, "192.168.10.1"),
    roce_row(4, V6, "RoCE v1", "enp3s0f0", None, "2001:db8:10::1"),
    roce_row(5, V6, "RoCE v2", "enp3s0f0", None, "2001:db8:10::1"),
    roce_row(6, VLAN_V4, "RoCE v1", "enp3s0f0.100", 100, "192.168.100.1"),
    roce_row(7, VLAN_V4, "RoCE v2", "enp3s0f0.100", 100, "192.168.100.1"),
    roce_row(8, ROCE_LL, "RoCE v1", "enp3s0f0.100", 100, "fe80::e42:a1ff:fe5e:9b10"),
    roce_row(9, ROCE_LL, "RoCE v2", "enp3s0f0.100", 100, "fe80::e42:a1ff:fe5e:9b10"),
]

IB_TABLE = [
    {
        "ifname": "mlx5_0",
        "port": port,
        "index": 0,
        "gid": f"fe80:0000:0000:0000:9803:9b03:009f:{guid_low}",
        "type": "IB",
        "netdev": None,
        "vlan": None,
        "ip": None,
    }
    for port, guid_low in ((1, "cfd6"), (2, "cfd7"))
]


def indexes(result) -> list[int]:
    return [g["index"] for g in result.json]


# -- the table --------------------------------------------------------------------------------


def test_roce_table_types_addresses_and_vlan_without_empty_slots(mlx5_roce):
    r = mlx5_roce("-j", "gids")
    assert (r.code, r.err) == (0, "")
    assert r.json == ROCE_TABLE  # slots 10-254 read the zero GID and are not shown


def test_roce_table_text(mlx5_roce):
    r = mlx5_roce("gids")
    assert r.code == 0
    lines = r.out.splitlines()
    assert lines[0].split() == ["DEV", "PORT", "INDEX", "GID", "TYPE", "NETDEV", "VLAN", "IP"]
    assert len(lines) == 11
    assert lines[4].split() == ["mlx5_0", "1", "3", V4, "RoCE", "v2", "enp3s0f0", "192.168.10.1"]
    assert lines[8].split() == [
        "mlx5_0",
        "1",
        "7",
        VLAN_V4,
        "RoCE",
        "v2",
        "enp3s0f0.100",
        "100",
        "192.168.100.1",
    ]


def test_pretty_json_gids(mlx5_roce):
    r = mlx5_roce("-p", "gids")
    assert r.out.startswith('[\n  {\n    "ifname": "mlx5_0",\n')
    assert r.json == ROCE_TABLE


def test_ib_gids_are_type_ib_without_netdev_or_ip(mlx5_ib_hca):
    r = mlx5_ib_hca("-j", "gids")
    assert (r.code, r.err) == (0, "")
    assert r.json == IB_TABLE


def test_ib_gids_text_has_one_row_per_port(mlx5_ib_hca):
    lines = mlx5_ib_hca("gids").out.splitlines()
    assert [line.split() for line in lines[1:]] == [
        ["mlx5_0", "1", "0", "fe80:0000:0000:0000:9803:9b03:009f:cfd6", "IB"],
        ["mlx5_0", "2", "0", "fe80:0000:0000:0000:9803:9b03:009f:cfd7", "IB"],
    ]


def test_omni_path_gid_is_ib(hfi1_opa):
    r = hfi1_opa("-j", "gids")
    assert (r.code, r.err) == (0, "")
    assert [(g["index"], g["gid"], g["type"], g["ip"]) for g in r.json] == [
        (0, "fe80:0000:0000:0000:0011:7501:0179:0e2c", "IB", None)
    ]


@pytest.mark.parametrize("tree", ["cxgb4_iwarp", "i40iw_iwarp"])
def test_iwarp_gid_is_the_mac_not_a_roce_address(tree, request):
    r = request.getfixturevalue(tree)("-j", "gids")
    assert (r.code, r.err) == (0, "")
    assert r.json
    for g in r.json:
        assert g["ip"] is None, g
        assert g["type"] not in ("RoCE v1", "RoCE v2"), g
        assert g["gid"].endswith(":0000:0000:0000:0000:0000"), g


def test_chelsio_gids_name_the_port_netdevs(cxgb4_iwarp):
    r = cxgb4_iwarp("-j", "gids")
    assert [(g["port"], g["gid"], g["netdev"]) for g in r.json] == [
        (1, "0007:4341:6a30:0000:0000:0000:0000:0000", "enp5s0f4"),
        (2, "0007:4341:6a38:0000:0000:0000:0000:0000", "enp5s0f4d1"),
    ]


def test_broken_gid_file_is_reported_and_everything_else_shown(broken_device):
    r = broken_device("-j", "gids")
    assert r.code == 0
    assert r.warnings == ["ibtool: warning: mlx4_0/ports/1/gids/3: cannot read: Is a directory"]
    mlx4 = [g for g in r.json if g["ifname"] == "mlx4_0"]
    assert [(g["index"], g["type"], g["ip"]) for g in mlx4] == [
        (0, "RoCE v1", "fe80::202:c9ff:fe4f:1a20"),
        (1, "RoCE v2", "fe80::202:c9ff:fe4f:1a20"),
        (2, "RoCE v1", "10.20.0.5"),
    ]
    assert [g for g in r.json if g["ifname"] == "mlx5_0"] == ROCE_TABLE


# -- filters ----------------------------------------------------------------------------------


def test_type_filter_tells_roce_v1_from_v2(mlx5_roce):
    assert indexes(mlx5_roce("-j", "gids", "--type", "v2")) == [1, 3, 5, 7, 9]
    assert indexes(mlx5_roce("-j", "gids", "--type", "v1")) == [0, 2, 4, 6, 8]
    assert mlx5_roce("-j", "gids", "--type", "ib").json == []


def test_type_filter_tells_ib_from_roce_v1(mlx5_ib_hca):
    assert mlx5_ib_hca("-j", "gids", "--type", "ib").json == IB_TABLE
    assert mlx5_ib_hca("-j", "gids", "--type", "v1").json == []
    assert mlx5_ib_hca("-j", "gids", "--type", "v2").json == []


def test_netdev_filter_takes_the_vlan_netdev(mlx5_roce):
    r = mlx5_roce("-j", "gids", "--netdev", "enp3s0f0.100")
    assert r.json == ROCE_TABLE[6:10]
    assert indexes(mlx5_roce("-j", "gids", "--netdev", "enp3s0f0")) == [0, 1, 2, 3, 4, 5]


def test_ip_filter_matches_the_address_however_it_is_written(mlx5_roce):
    assert indexes(mlx5_roce("-j", "gids", "--ip", "192.168.10.1")) == [2, 3]
    assert indexes(mlx5_roce("-j", "gids", "--ip", "::ffff:192.168.10.1")) == [2, 3]
    assert indexes(mlx5_roce("-j", "gids", "--ip", "::FFFF:c0a8:a01")) == [2, 3]
    assert indexes(mlx5_roce("-j", "gids", "--ip", "2001:0db8:10:0::0001")) == [4, 5]
    assert mlx5_roce("-j", "gids", "--ip", "192.168.10.99").json == []


def test_filters_combine(mlx5_roce):
    r = mlx5_roce("-j", "gids", "--type", "v2", "--netdev", "enp3s0f0")
    assert indexes(r) == [1, 3, 5]


def test_port_filter_and_port_selector(mlx5_ib_hca):
    assert mlx5_ib_hca("-j", "gids", "--port", "2").json == IB_TABLE[1:]
    assert mlx5_ib_hca("-j", "gids", "mlx5_0/2").json == IB_TABLE[1:]
    assert mlx5_ib_hca("-j", "gids", "show", "mlx5_0/1").json == IB_TABLE[:1]


# -- --best -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, index",
    [
        ([], 3),  # IPv4 RoCE v2 of the netdev, not link-local 1 nor the VLAN's 7
        (["enp3s0f0"], 3),
        (["enp3s0f0.100"], 7),
        (["192.168.10.1"], 3),
        (["192.168.100.1"], 7),
        (["2001:db8:10::1"], 5),
    ],
)
def test_best_gid_index(mlx5_roce, argv, index):
    r = mlx5_roce("gids", "--best", *argv)
    assert (r.code, r.out, r.err) == (0, f"{index}\n", "")


def test_best_json_is_the_whole_gid(mlx5_roce):
    r = mlx5_roce("-j", "gids", "--best", "enp3s0f0.100")
    assert r.code == 0
    assert r.json == ROCE_TABLE[7]


def test_best_prefers_ipv4_even_when_ipv6_comes_first_in_the_table(mlx5_roce):
    gids = mlx5_roce.root / "sys/class/infiniband/mlx5_0/ports/1/gids"
    for index, value in ((2, V6), (3, V6), (4, V4), (5, V4)):
        (gids / str(index)).write_text(value + "\n")
    assert mlx5_roce("-j", "gids", "--type", "v2", "--netdev", "enp3s0f0").json[1]["ip"] == (
        "2001:db8:10::1"
    )
    r = mlx5_roce("gids", "--best", "enp3s0f0")
    assert (r.code, r.out) == (0, "5\n")


def test_best_uses_the_vlan_only_when_asked(mlx5_roce):
    # Take the IPv4 address off the netdev itself: its routable IPv6 GID wins, not the VLAN's
    # IPv4 one.
    gids = mlx5_roce.root / "sys/class/infiniband/mlx5_0/ports/1/gids"
    for index in (2, 3):
        (gids / str(index)).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    assert mlx5_roce("gids", "--best").out == "5\n"
    assert mlx5_roce("gids", "--best", "enp3s0f0.100").out == "7\n"


def test_best_on_an_infiniband_host_fails_with_the_reason(mlx5_ib_hca):
    r = mlx5_ib_hca("gids", "--best")
    assert (r.code, r.out) == (1, "")
    assert r.err.startswith("ibtool: error: no RoCE v2 GID")
    assert "InfiniBand" in r.err and "LID" in r.err
    assert "Traceback" not in r.err


def test_best_on_an_ipoib_netdev_says_the_port_is_infiniband(mlx5_ib_hca):
    # ib0 is mlx5_0/1's netdev: the answer is "address it by LID", not "no such netdev".
    r = mlx5_ib_hca("gids", "--best", "ib0")
    assert (r.code, r.out) == (1, "")
    assert "InfiniBand" in r.err, r.err


@pytest.mark.parametrize("tree", ["cxgb4_iwarp", "i40iw_iwarp"])
def test_best_on_iwarp_fails_saying_the_port_is_iwarp(tree, request):
    r = request.getfixturevalue(tree)("gids", "--best")
    assert (r.code, r.out) == (1, "")
    assert "iWARP" in r.err, r.err


def test_best_on_an_unknown_netdev_names_the_rdma_netdevs(mlx5_roce):
    r = mlx5_roce("gids", "--best", "eth9")
    assert (r.code, r.out) == (1, "")
    assert r.err == (
        "ibtool: error: no RoCE v2 GID for netdev eth9 "
        "(hint: RDMA netdevs here: enp3s0f0, enp3s0f0.100)\n"
    )


def test_best_for_an_address_no_port_has(mlx5_roce):
    r = mlx5_roce("gids", "--best", "10.9.9.9")
    assert (r.code, r.out) == (1, "")
    assert r.err.startswith("ibtool: error: no RoCE v2 GID for address 10.9.9.9 (hint: ")


def test_best_skips_the_broken_device(broken_device):
    r = broken_device("-j", "gids", "--best")
    assert r.code == 0
    assert (r.json["ifname"], r.json["index"]) == ("mlx5_0", 3)


# -- 500 SR-IOV VFs ---------------------------------------------------------------------------


def test_every_vf_gid_is_listed(sriov_500_vfs):
    r = sriov_500_vfs("-j", "gids")
    assert (r.code, r.err) == (0, "")
    assert len(r.json) == len(ROCE_TABLE) + 500 * 4
    last = [g for g in r.json if g["ifname"] == "mlx5_500"]
    assert [(g["index"], g["type"], g["netdev"], g["ip"]) for g in last] == [
        (0, "RoCE v1", "enp3s0f0v499", "fe80::e42:a1ff:fe5f:1f3"),
        (1, "RoCE v2", "enp3s0f0v499", "fe80::e42:a1ff:fe5f:1f3"),
        (2, "RoCE v1", "enp3s0f0v499", "10.1.1.244"),
        (3, "RoCE v2", "enp3s0f0v499", "10.1.1.244"),
    ]


def test_best_on_a_vf_netdev_and_by_vf_address(sriov_500_vfs):
    r = sriov_500_vfs("-j", "gids", "--best", "enp3s0f0v499")
    assert (r.json["ifname"], r.json["index"], r.json["ip"]) == ("mlx5_500", 3, "10.1.1.244")
    r = sriov_500_vfs("-j", "gids", "--best", "10.1.0.7")
    assert (r.json["ifname"], r.json["netdev"]) == ("mlx5_7", "enp3s0f0v6")
    assert sriov_500_vfs("-j", "gids", "--best").json["ifname"] == "mlx5_0"


def test_vf_gids_by_selector(sriov_500_vfs):
    r = sriov_500_vfs("-j", "gids", "mlx5_42")
    assert [g["ip"] for g in r.json if g["type"] == "RoCE v2"] == [
        "fe80::e42:a1ff:fe5f:29",
        "10.1.0.42",
    ]


# rxe0 as the testbed kernel showed it (tests/testbed/guest.sh: veth0 192.168.77.1 and fd77::1,
# VLAN veth0.100 192.168.100.1): the capture is in git; without it these skip (and
# fail under CI).


def test_captured_rxe_gids_are_roce_v2_only_with_addresses_and_vlan(captured_rxe):
    r = captured_rxe("-j", "gids")
    assert (r.code, r.err) == (0, "")
    (dev,) = captured_rxe("-j", "dev").json
    link_local = "fe80:0000:0000:0000:" + dev["node_guid"]
    ll_ip = str(ipaddress.ip_address(bytes.fromhex(link_local.replace(":", ""))))
    assert [(g["gid"] == link_local, g["netdev"], g["vlan"], g["ip"]) for g in r.json] == [
        (True, "veth0", None, ll_ip),
        (False, "veth0", None, "192.168.77.1"),
        (False, "veth0", None, "fd77::1"),
        (False, "veth0.100", 100, "192.168.100.1"),
        (True, "veth0.100", 100, ll_ip),
    ]
    assert {g["type"] for g in r.json} == {"RoCE v2"}  # rxe makes no RoCE v1 GIDs


@pytest.mark.parametrize(
    "argv, ip",
    [
        ([], "192.168.77.1"),
        (["veth0"], "192.168.77.1"),
        (["veth0.100"], "192.168.100.1"),
        (["fd77::1"], "fd77::1"),
    ],
)
def test_captured_rxe_best_gid(captured_rxe, argv, ip):
    r = captured_rxe("-j", "gids", "--best", *argv)
    assert (r.code, r.err) == (0, "")
    assert (r.json["type"], r.json["ip"]) == ("RoCE v2", ip)
    assert captured_rxe("gids", "--best", *argv).out == f"{r.json['index']}\n"


# -- bad entries --------------------------------------------------------------------------------


def roce_port(tree):
    return tree.root / "sys/class/infiniband/mlx5_0/ports/1"


def test_a_gid_with_non_hex_digits_is_one_warning_and_every_other_gid_is_shown(garbled_values):
    # It crashed gids and gids --best for every device (internal error).
    warning = (
        "ibtool: warning: mlx4_0/ports/1/gids/0: malformed GID "
        "'fe80:0000:0000:0000:0002:c903:00zz:b2c1'"
    )
    r = garbled_values("-j", "gids")
    assert r.code == 0
    assert r.warnings[-1] == warning and r.err.count("gids/0") == 1
    assert [g for g in r.json if g["ifname"] == "mlx5_0"] == ROCE_TABLE
    assert [(g["ifname"], g["port"], g["index"]) for g in r.json if g["ifname"] == "mlx4_0"] == [
        ("mlx4_0", 2, 0)
    ]
    r = garbled_values("gids", "--best")
    assert (r.code, r.out) == (0, "3\n")
    assert warning in r.warnings
    r = garbled_values("gids", "--best", "ib1")
    assert r.code == 1
    assert r.err.endswith(
        "ibtool: error: no RoCE v2 GID for netdev ib1 "
        "(hint: InfiniBand ports have no RoCE GIDs: address mlx4_0/2 by LID)\n"
    )


def test_a_corrupted_roce_gid_is_left_out_and_best_takes_the_next(mlx5_roce):
    (roce_port(mlx5_roce) / "gids/3").write_text(V4.replace("c0a8", "c0g8") + "\n")
    r = mlx5_roce("gids", "--best")
    assert (r.code, r.out) == (0, "5\n")  # the IPv6 RoCE v2 GID: 3 is gone
    assert r.warnings == [
        "ibtool: warning: mlx5_0/ports/1/gids/3: malformed GID "
        "'0000:0000:0000:0000:0000:ffff:c0g8:0a01'"
    ]
    assert indexes(mlx5_roce("-j", "gids")) == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def test_a_gid_netdev_that_is_no_netdev_name_is_warned_about(mlx5_roce):
    (roce_port(mlx5_roce) / "gid_attrs/ndevs/3").write_bytes(b"enp3s0f0 \x07\n")
    r = mlx5_roce("-j", "gids")
    assert r.warnings == [
        "ibtool: warning: mlx5_0/ports/1/gid_attrs/ndevs/3: malformed value 'enp3s0f0 \\x07'"
    ]
    g = r.json[3]
    assert (g["index"], g["netdev"], g["vlan"], g["type"]) == (3, None, None, "RoCE v2")
    assert r.json[:3] + r.json[4:] == ROCE_TABLE[:3] + ROCE_TABLE[4:]


def test_an_unreadable_roce_gid_netdev_is_warned_about(mlx5_roce):
    ndev = roce_port(mlx5_roce) / "gid_attrs/ndevs/5"
    ndev.unlink()
    ndev.mkdir()  # a failing read: RoCE GIDs always have a netdev
    r = mlx5_roce("-j", "gids")
    assert r.warnings == ["ibtool: warning: mlx5_0/ports/1/gid_attrs/ndevs/5: unreadable"]
    assert r.json[5]["netdev"] is None


def test_a_long_unknown_gid_type_is_quoted_short(mlx5_roce):
    (roce_port(mlx5_roce) / "gid_attrs/types/1").write_text("RoCE v3 " * 20 + "\n")
    r = mlx5_roce("-j", "gids")
    assert r.warnings == [
        "ibtool: warning: mlx5_0/ports/1/gid_attrs/types/1: unknown GID type "
        "'RoCE v3 RoCE v3 RoCE v3 RoCE v3 RoCE v3 '..."
    ]
    assert r.json[1]["type"] is None


@pytest.mark.parametrize(
    "config, warning",
    [
        ("garbage", "malformed value 'garbage'"),
        ("", "malformed value ''"),
        (
            "VLAN Dev name\t | VLAN ID\nName-Type: VLAN_NAME_TYPE_RAW_PLUS_VID_NO_PAD\n"
            "enp3s0f0.100   | one  | enp3s0f0",
            "malformed line 'enp3s0f0.100   | one  | enp3s0f0'",
        ),
    ],
    ids=["garbage", "empty", "bad line"],
)
def test_a_malformed_vlan_config_is_warned_about_and_vlans_are_unknown(mlx5_roce, config, warning):
    path = mlx5_roce.root / "proc/net/vlan/config"
    path.write_text(config + "\n" if config else "")
    r = mlx5_roce("-j", "gids")
    assert r.code == 0
    assert r.warnings == [f"ibtool: warning: {path}: {warning}"]
    assert [g["vlan"] for g in r.json] == [None] * len(ROCE_TABLE)
    # the GIDs themselves are all there
    assert [g["gid"] for g in r.json] == [g["gid"] for g in ROCE_TABLE]

"""`ibtool port` (alias `link`): state, rate, LIDs and netdev, as people and scripts see them."""

from __future__ import annotations

from tests.fixtures.sysfs_trees import CAPTURED_RXE

IB_PORT_1 = {
    "ifname": "mlx5_0",
    "port": 1,
    "state": "ACTIVE",
    "physical_state": "LINK_UP",
    "link_layer": "InfiniBand",
    "rate": "100 Gb/sec (4X EDR)",
    "rate_gbps": 100.0,
    "width": "4X",
    "speed": "EDR",
    "lid": 28,
    "lmc": 2,
    "lid_range": [28, 31],
    "sm_lid": 1,
    "sm_sl": 0,
    "netdev": "ib0",
}

IB_PORT_2_DOWN = {
    "ifname": "mlx5_0",
    "port": 2,
    "state": "DOWN",
    "physical_state": "POLLING",
    "link_layer": "InfiniBand",
    "rate": "10 Gb/sec (4X SDR)",
    "rate_gbps": 10.0,
    "width": "4X",
    "speed": "SDR",
    "lid": None,
    "lmc": None,
    "lid_range": None,
    "sm_lid": None,
    "sm_sl": None,
    "netdev": "ib1",
}

ROCE_PORT = {
    "ifname": "mlx5_0",
    "port": 1,
    "state": "ACTIVE",
    "physical_state": "LINK_UP",
    "link_layer": "Ethernet",
    "rate": "100 Gb/sec (4X EDR)",
    "rate_gbps": 100.0,
    "width": "4X",
    "speed": "EDR",
    "lid": None,
    "lmc": None,
    "lid_range": None,
    "sm_lid": None,
    "sm_sl": None,
    "netdev": "enp3s0f0",
}


def test_ib_ports_text(mlx5_ib_hca):
    r = mlx5_ib_hca("port")
    assert (r.code, r.err) == (0, "")
    assert r.out.splitlines() == [
        "mlx5_0/1: state ACTIVE physical_state LINK_UP link_layer InfiniBand "
        "rate 100 Gb/sec (4X EDR) lid 28 lmc 2 lids 28-31 sm_lid 1 sm_sl 0 netdev ib0",
        "mlx5_0/2: state DOWN physical_state POLLING link_layer InfiniBand "
        "rate 10 Gb/sec (4X SDR) netdev ib1",
    ]


def test_ib_ports_json_lids_in_decimal_and_the_lmc_range(mlx5_ib_hca):
    r = mlx5_ib_hca("-j", "port")
    assert (r.code, r.err) == (0, "")
    assert r.json == [IB_PORT_1, IB_PORT_2_DOWN]


def test_link_is_an_alias_of_port(mlx5_ib_hca):
    assert mlx5_ib_hca("link").out == mlx5_ib_hca("port").out


def test_dev_slash_port_selects_one_port(mlx5_ib_hca):
    r = mlx5_ib_hca("-j", "port", "show", "mlx5_0/2")
    assert (r.code, r.json) == (0, [IB_PORT_2_DOWN])
    assert mlx5_ib_hca("-j", "port", "mlx5_0").json == [IB_PORT_1, IB_PORT_2_DOWN]


def test_pretty_json_parses_to_the_same_ports(mlx5_ib_hca):
    r = mlx5_ib_hca("-p", "port", "mlx5_0/1")
    assert r.out.startswith('[\n  {\n    "ifname": "mlx5_0",\n    "port": 1,\n')
    assert r.json == [IB_PORT_1]


def test_details_decode_the_capability_mask(mlx5_ib_hca):
    r = mlx5_ib_hca("-d", "-j", "port", "mlx5_0/1")
    assert r.code == 0
    (p,) = r.json
    assert p["gid_tbl_len"] == 128
    assert p["cap_mask"] == 0x2651E848
    assert p["caps"] == [
        "TRAP",
        "SL_MAP",
        "SYS_IMAGE_GUID",
        "CABLE_INFO",
        "EXTENDED_SPEEDS",
        "CAP_MASK2",
        "CM",
        "VENDOR_CLASS",
        "CAP_MASK_NOTICE",
        "CLIENT_REG",
        "IP_BASED_GIDS",
        "MULT_PKER_TRAP",
    ]
    text = mlx5_ib_hca("-d", "port", "mlx5_0/1").out
    assert "gid_tbl_len 128 cap_mask 0x2651e848 caps TRAP,SL_MAP," in text


def test_roce_port_has_no_lids_and_names_its_netdev(mlx5_roce):
    r = mlx5_roce("-j", "port")
    assert (r.code, r.err) == (0, "")
    assert r.json == [ROCE_PORT]
    assert mlx5_roce("port").out == (
        "mlx5_0/1: state ACTIVE physical_state LINK_UP link_layer Ethernet "
        "rate 100 Gb/sec (4X EDR) netdev enp3s0f0\n"
    )
    assert mlx5_roce("-d", "-j", "port").json[0]["gid_tbl_len"] == 255


def test_iwarp_port_state_follows_the_netdev(cxgb4_iwarp):
    r = cxgb4_iwarp("-j", "port")
    assert (r.code, r.err) == (0, "")
    up, no_address = r.json
    assert (up["state"], up["physical_state"], up["netdev"]) == ("ACTIVE", "LINK_UP", "enp5s0f4")
    assert (no_address["state"], no_address["physical_state"], no_address["netdev"]) == (
        "INIT",
        "PORT_CONFIGURATION_TRAINING",
        "enp5s0f4d1",
    )
    assert {p["link_layer"] for p in r.json} == {"Ethernet"}
    assert [p["lid"] for p in r.json] == [None, None]


def test_old_kernel_rate_without_suffix_is_sdr(i40iw_iwarp):
    r = i40iw_iwarp("-j", "port")
    assert (r.code, r.err) == (0, "")
    (p,) = r.json
    assert (p["rate"], p["rate_gbps"], p["width"], p["speed"]) == (
        "10 Gb/sec (4X)",
        10.0,
        "4X",
        "SDR",
    )
    assert p["netdev"] == "eno1"
    assert i40iw_iwarp("port").out == (
        "i40iw0/1: state ACTIVE physical_state LINK_UP link_layer Ethernet "
        "rate 10 Gb/sec (4X) netdev eno1\n"
    )


def test_omni_path_port_has_a_lid_and_an_sm(hfi1_opa):
    r = hfi1_opa("-j", "port")
    assert (r.code, r.err) == (0, "")
    (p,) = r.json
    assert p["link_layer"] == "InfiniBand"
    assert (p["lid"], p["lmc"], p["sm_lid"], p["sm_sl"]) == (5, 0, 1, 0)
    assert (p["rate_gbps"], p["speed"]) == (100.0, "EDR")
    assert p["netdev"] == "ib0"
    assert hfi1_opa("port").out == (
        "hfi1_0/1: state ACTIVE physical_state LINK_UP link_layer InfiniBand "
        "rate 100 Gb/sec (4X EDR) lid 5 lmc 0 sm_lid 1 sm_sl 0 netdev ib0\n"
    )


def test_broken_port_shows_unknown_and_the_healthy_port_in_full(broken_device):
    r = broken_device("port")
    assert r.code == 0
    assert r.out.splitlines() == [
        "mlx4_0/1: state unknown physical_state LINK_UP link_layer Ethernet "
        "rate unknown netdev enp2s0",
        "mlx5_0/1: state ACTIVE physical_state LINK_UP link_layer Ethernet "
        "rate 100 Gb/sec (4X EDR) netdev enp3s0f0",
    ]
    assert sorted(r.warnings) == [
        "ibtool: warning: mlx4_0/ports/1/rate: malformed value 'fast'",
        "ibtool: warning: mlx4_0/ports/1/state: malformed value 'garbage'",
    ]


def test_broken_port_json_nulls(broken_device):
    broken, healthy = broken_device("-j", "port").json
    assert broken["state"] is None and broken["rate"] is None and broken["rate_gbps"] is None
    assert broken["physical_state"] == "LINK_UP"
    assert healthy == ROCE_PORT


def test_every_vf_port_is_listed_with_its_netdev(sriov_500_vfs):
    r = sriov_500_vfs("-j", "port")
    assert (r.code, r.err) == (0, "")
    assert len(r.json) == 501
    assert {p["state"] for p in r.json} == {"ACTIVE"}
    assert [p["netdev"] for p in r.json[:3]] == ["enp3s0f0", "enp3s0f0v0", "enp3s0f0v1"]
    (p,) = sriov_500_vfs("-j", "port", "mlx5_250/1").json
    assert (p["ifname"], p["netdev"]) == ("mlx5_250", "enp3s0f0v249")


# rxe0 as the testbed kernel showed it: tested whenever the capture is in the tree (it is in
# git, so CI runs this; no skip).
if (CAPTURED_RXE / "sys" / "class" / "infiniband").is_dir():

    def test_captured_rxe_port_on_veth(captured_rxe):
        r = captured_rxe("-j", "port")
        assert (r.code, r.err) == (0, "")
        assert r.json == [
            {
                "ifname": "rxe0",
                "port": 1,
                "state": "ACTIVE",
                "physical_state": "LINK_UP",
                "link_layer": "Ethernet",
                # veth says 10000 Mb/s; the core maps that to 1X FDR10.
                "rate": "10 Gb/sec (1X FDR10)",
                "rate_gbps": 10.0,
                "width": "1X",
                "speed": "FDR10",
                "lid": None,
                "lmc": None,
                "lid_range": None,
                "sm_lid": None,
                "sm_sl": None,
                "netdev": "veth0",
            }
        ]

"""The sysfs parsers on the strings kernels of different generations print."""

from __future__ import annotations

import re

import pytest

from ibtool.model.names import natural_key
from ibtool.model.records import NodeType, PhysState, PortState
from ibtool.sources.sysfs.values import (
    gid_ip,
    iwarp_hardware,
    parse_decimal,
    parse_enum,
    parse_enum_line,
    parse_hex,
    parse_rate,
    valid_netdev_name,
)


@pytest.mark.parametrize(
    "text, gbps, width, speed",
    [
        ("100 Gb/sec (4X EDR)", 100.0, "4X", "EDR"),
        ("56 Gb/sec (4X FDR)", 56.0, "4X", "FDR"),
        ("40 Gb/sec (4X QDR)", 40.0, "4X", "QDR"),
        ("25 Gb/sec (1X EDR)", 25.0, "1X", "EDR"),
        ("2.5 Gb/sec (1X SDR)", 2.5, "1X", "SDR"),
        ("10 Gb/sec (1X FDR10)", 10.0, "1X", "FDR10"),
        ("200 Gb/sec (4X HDR)", 200.0, "4X", "HDR"),
        ("400 Gb/sec (4X NDR)", 400.0, "4X", "NDR"),
        ("800 Gb/sec (4X XDR)", 800.0, "4X", "XDR"),
        ("600 Gb/sec (12X HDR)", 600.0, "12X", "HDR"),
        ("20 Gb/sec (4X DDR)", 20.0, "4X", "DDR"),
        # Older kernels printed no suffix for SDR.
        ("10 Gb/sec (4X)", 10.0, "4X", "SDR"),
        ("2.5 Gb/sec (1X)", 2.5, "1X", "SDR"),
    ],
)
def test_parse_rate_reads_both_generations_of_rate_text(text, gbps, width, speed):
    rate = parse_rate(text)
    assert (rate.text, rate.gbps, rate.width, rate.speed) == (text, gbps, width, speed)


@pytest.mark.parametrize("text", ["fast", "", "100 Gb/sec", "Gb/sec (4X EDR)", "100 Mb/sec (4X)"])
def test_parse_rate_rejects_what_is_not_a_rate(text):
    with pytest.raises(ValueError):
        parse_rate(text)


@pytest.mark.parametrize(
    "text, number",
    [
        ("4: ACTIVE", 4),
        ("1: DOWN", 1),
        ("5: LinkUp", 5),
        ("4: PortConfigurationTraining", 4),
        ("1: CA", 1),
        ("4: RNIC", 4),
        ("7: <unknown>", 7),
    ],
)
def test_parse_enum_line_takes_the_number_before_the_colon(text, number):
    assert parse_enum_line(text) == number


@pytest.mark.parametrize("text", ["garbage", "", ": ACTIVE", "ACTIVE: 4"])
def test_parse_enum_line_rejects_text_without_a_number(text):
    with pytest.raises(ValueError):
        parse_enum_line(text)


@pytest.mark.parametrize(
    "gid, ip",
    [
        ("0000:0000:0000:0000:0000:ffff:c0a8:0a01", "192.168.10.1"),
        ("0000:0000:0000:0000:0000:ffff:0a01:01f4", "10.1.1.244"),
        ("2001:0db8:0010:0000:0000:0000:0000:0001", "2001:db8:10::1"),
        ("fe80:0000:0000:0000:0e42:a1ff:fe5e:9b10", "fe80::e42:a1ff:fe5e:9b10"),
    ],
)
def test_gid_ip_decodes_ipv4_mapped_and_ipv6_gids(gid, ip):
    assert gid_ip(gid) == ip


def test_natural_sort_puts_mlx5_2_before_mlx5_10():
    names = ["mlx5_10", "mlx5_2", "mlx5_1", "mlx5_100", "mlx5_0", "hfi1_0", "mlx4_0", "rxe0"]
    assert sorted(names, key=natural_key) == [
        "hfi1_0",
        "mlx4_0",
        "mlx5_0",
        "mlx5_1",
        "mlx5_2",
        "mlx5_10",
        "mlx5_100",
        "rxe0",
    ]


def test_natural_sort_mixes_kernel_and_renamed_device_names():
    names = ["mlx5_bond_0", "mlx5_1", "rocep3s0f0", "ibp1s0f1", "ibp1s0f0", "mlx5_0"]
    assert sorted(names, key=natural_key) == [
        "ibp1s0f0",
        "ibp1s0f1",
        "mlx5_0",
        "mlx5_1",
        "mlx5_bond_0",
        "rocep3s0f0",
    ]


@pytest.mark.parametrize("text", ["٤: ACTIVE", "4", "+4: ACTIVE", " 4: ACTIVE", "4_0: X"])
def test_parse_enum_line_takes_only_what_the_kernel_prints(text):
    # "%d: %s": ASCII digits then a colon; int() would take Arabic-Indic digits and underscores
    with pytest.raises(ValueError):
        parse_enum_line(text)


@pytest.mark.parametrize(
    "parse, text, value",
    [
        (parse_decimal(7), "0", 0),
        (parse_decimal(7), "7", 7),
        (parse_hex(0xFFFF), "0x1c", 0x1C),
        (parse_hex(0xFFFF), "0xffff", 0xFFFF),
        (parse_hex(0xFFFFFFFF), "0x2651e848", 0x2651E848),
        (parse_enum(PortState, "a port state"), "5: ACTIVE_DEFER", PortState.ACTIVE_DEFER),
        (parse_enum(PhysState, "a physical port state"), "11: <unknown>", PhysState.OPA_TEST),
        (parse_enum(NodeType, "a node type"), "7: unspecified", NodeType.UNSPECIFIED),
    ],
)
def test_parsers_take_the_values_the_kernel_prints(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(
    "parse, text, problem",
    [
        (parse_decimal(7), "8", "'8' is out of range (0..7)"),
        (parse_decimal(7), "-1", "'-1' is out of range (0..7)"),
        (parse_decimal(7), "20000", "'20000' is out of range (0..7)"),
        (parse_hex(0xFFFF), "0x10000", "'0x10000' is out of range (0x0..0xffff)"),
        (
            parse_enum(PortState, "a port state"),
            "9: UNKNOWN",
            "'9: UNKNOWN' is not a port state the kernel defines",
        ),
        (
            parse_enum(PhysState, "a physical port state"),
            "99: <unknown>",
            "'99: <unknown>' is not a physical port state the kernel defines",
        ),
    ],
)
def test_parsers_refuse_values_the_kernel_never_prints(parse, text, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse(text)


@pytest.mark.parametrize("text", ["", "1c", "0x", "0x1g", "٧", "1_0", " 7", "0x1c\n0x1d"])
def test_numbers_must_be_written_as_sysfs_writes_them(text):
    for parse in (parse_decimal(0xFFFF), parse_hex(0xFFFF)):
        with pytest.raises(ValueError):
            parse(text)


@pytest.mark.parametrize("name", ["eth0", "enp3s0f0.100", "ib0", "veth0", "a" * 15])
def test_netdev_names_the_kernel_accepts(name):
    assert valid_netdev_name(name)


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a" * 16, "eth 0", "eth0:1", "a/b", "eth\t0", "\x00", "é" * 8]
)
def test_netdev_names_the_kernel_refuses(name):
    # net/core/dev.c dev_valid_name: 1..15 bytes, no '/', ':' or white space, not . or ..
    assert not valid_netdev_name(name)


@pytest.mark.parametrize(
    "driver, hca_type, iwarp",
    [
        ("i40e", None, True),  # i40iw hangs off the i40e PCI function
        ("cxgb4", None, True),
        (None, "I40IW", True),
        (None, "cxgb4", True),
        (None, "FastLinQ QL8070 iWARP", True),  # qedr
        (None, "FastLinQ QL8070 RoCE", False),
        ("mlx5_core", "MT4119", False),
        (None, None, False),
    ],
)
def test_iwarp_hardware_without_a_node_type(driver, hca_type, iwarp):
    assert iwarp_hardware(driver, hca_type) is iwarp

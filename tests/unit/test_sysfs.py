"""The sysfs parsers on the strings kernels of different generations print."""

from __future__ import annotations

import pytest

from ibtool.sources.sysfs import gid_ip, natural_key, parse_enum_line, parse_rate


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

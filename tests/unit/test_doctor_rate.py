"""The rate check: a port's rate against the most it supports. On Ethernet (RoCE, iWARP) the
netdev's fastest supported link mode, read with the ethtool ioctl ETHTOOL_GLINKSETTINGS (its
bitmap-size handshake emulated here as net/ethtool/ioctl.c answers it, and run against this
machine's kernel); on InfiniBand it is not knowable without a MAD, and the line says so."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import struct

import pytest

from ibtool.doctor import checks, link, run
from ibtool.doctor.checks import Context
from ibtool.doctor.link import LinkSettings
from ibtool.model.doctor import Facts, Verdict

PASS, WARN, SKIP = Verdict.PASS, Verdict.WARN, Verdict.SKIP


def port(**changes) -> Facts:
    base = Facts(device="mlx5_0", port=1, link_layer="Ethernet", state="ACTIVE",
                 rate="100 Gb/sec (4X EDR)", netdev="enp3s0f0")  # fmt: skip
    return dataclasses.replace(base, **changes)


CX5 = ("100000baseCR4/Full", "100000baseSR4/Full", "50000baseCR2/Full", "40000baseCR4/Full",
       "25000baseCR/Full", "10000baseKR/Full", "1000baseKX/Full")  # fmt: skip


def rate(facts: Facts, settings: LinkSettings | None = None, why: str | None = None):
    return checks.check_rate(facts, None, Context(link=settings, link_why=why))


def test_a_port_at_its_maximum_passes():
    f = rate(port(), LinkSettings("enp3s0f0", 100000, CX5, ()))
    assert (f.verdict, f.evidence) == (
        PASS,
        "mlx5_0/1 at 100 Gb/sec (4X EDR): enp3s0f0 at 100 Gb/s, the fastest it supports "
        "(100000baseCR4/Full)",
    )


def test_a_100g_port_trained_to_one_lane_warns_naming_both():
    f = rate(port(rate="25 Gb/sec (1X EDR)"), LinkSettings("enp3s0f0", 25000, CX5, ()))
    assert f.verdict == WARN
    assert f.evidence == (
        "mlx5_0/1 at 25 Gb/sec (1X EDR): enp3s0f0 runs at 25 Gb/s, below the 100 Gb/s it "
        "supports (100000baseCR4/Full: 4 lanes, 1X here)"
    )
    assert f.fix == (
        "reseat or replace the cable (or its transceiver) and check the switch port (its speed "
        "setting, its cable): `ethtool enp3s0f0` shows what both ends advertise"
    )


def test_a_switch_port_that_offers_no_more_is_named_first():
    partner = ("40000baseCR4/Full", "10000baseKR/Full")
    f = rate(port(rate="40 Gb/sec (4X FDR10)"), LinkSettings("enp3s0f0", 40000, CX5, partner))
    assert f.verdict == WARN
    assert f.evidence.endswith("; the link partner advertises no more (40000baseCR4/Full)")
    assert f.fix.startswith("check the switch port first: it advertises no more than 40000base")
    partner = ("100000baseCR4/Full",)
    f = rate(port(rate="40 Gb/sec (4X FDR10)"), LinkSettings("enp3s0f0", 40000, CX5, partner))
    assert f.evidence.endswith("; the link partner advertises 100000baseCR4/Full")
    assert f.fix.startswith("reseat or replace the cable")


def test_a_virtual_nic_has_nothing_to_judge_against():
    """virtio_net: SPEED_UNKNOWN and no link modes; the RoCE port over it shows 1X SDR, which
    is what ib_get_eth_speed makes of an unknown speed."""
    f = rate(port(device="rxe0", rate="2.5 Gb/sec (1X SDR)", netdev="enp0s10"),
             LinkSettings("enp0s10", None, (), ()))  # fmt: skip
    assert (f.verdict, f.evidence) == (
        SKIP,
        "rxe0/1 at 2.5 Gb/sec (1X SDR) (1X SDR is what the kernel shows for an unknown speed); "
        "enp0s10 reports no speed and no supported link modes (a virtual NIC): nothing to judge "
        "it against",
    )
    f = rate(port(netdev="bond0"), LinkSettings("bond0", 200000, (), ()))
    assert f.verdict == SKIP and "bond0 runs at 200 Gb/s and reports no supported link modes" in (
        f.evidence
    )


def test_infiniband_says_its_maximum_is_not_knowable_here():
    f = rate(port(device="hfi1_0", link_layer="InfiniBand", netdev="ib0"))
    assert f.verdict == SKIP
    assert f.evidence.startswith("hfi1_0/1 at 100 Gb/sec (4X EDR); its maximum is not known here")
    assert "PortInfo" in f.evidence and "MAD" in f.evidence


@pytest.mark.parametrize(
    "facts,settings,why,said",
    [
        (port(state="DOWN"), None, None, "mlx5_0/1 not ACTIVE: no rate to judge"),
        (port(rate=None), None, None, "mlx5_0/1: rate not known"),
        (port(), None, "enp3s0f0's supported link modes need the running kernel (ethtool)",
         "mlx5_0/1 at 100 Gb/sec (4X EDR); enp3s0f0's supported link modes need the running "
         "kernel (ethtool)"),
        (port(), LinkSettings("enp3s0f0", None, CX5, ()), None,
         "mlx5_0/1 at 100 Gb/sec (4X EDR); enp3s0f0 reports no speed now (it supports up to "
         "100 Gb/s, 100000baseCR4/Full)"),
        (port(), LinkSettings("enp3s0f0", 100000, CX5, (), unknown_bits=2), None,
         "mlx5_0/1 at 100 Gb/sec (4X EDR); enp3s0f0 at 100 Gb/s also supports link modes newer "
         "than this ibtool knows: not judged"),
    ],
)  # fmt: skip
def test_what_cannot_be_judged_is_a_skip_saying_why(facts, settings, why, said):
    f = rate(facts, settings, why)
    assert (f.verdict, f.evidence) == (SKIP, said)


def test_the_rate_line_follows_the_port_line():
    names = [c.__name__ for c in checks.CHECKS]
    assert names[names.index("check_port") + 1] == "check_rate"


# -- the ioctl -------------------------------------------------------------------------------

SETTINGS = struct.Struct("=IIBBBBBBBbBBBB7I")
NWORDS = 4  # __ETHTOOL_LINK_MODE_MASK_NU32 of a kernel with 97..128 link modes


def kernel(speed: int, supported: list[int], partner: list[int], calls: list):
    """ETHTOOL_GLINKSETTINGS as net/ethtool/ioctl.c answers it: asked with a bitmap size that
    is not its own, it writes back cmd and minus its size; asked with its size, it fills the
    settings and the supported, advertising and lp_advertising bitmaps."""

    def words(bits: list[int]) -> list[int]:
        out = [0] * NWORDS
        for b in bits:
            out[b // 32] |= 1 << (b % 32)
        return out

    def ioctl(fd, request, ifreq):
        name, address = struct.unpack("16sP16x", ifreq)
        assert request == link.SIOCETHTOOL and name.rstrip(b"\0") == b"enp3s0f0"
        head = SETTINGS.unpack(ctypes.string_at(address, SETTINGS.size))
        assert head[0] == link.ETHTOOL_GLINKSETTINGS
        calls.append(head[9])
        if head[9] != NWORDS:
            back = SETTINGS.pack(link.ETHTOOL_GLINKSETTINGS, 0, *([0] * 7), -NWORDS,
                                 *([0] * 4), *([0] * 7))  # fmt: skip
            ctypes.memmove(address, back, len(back))
            return
        back = SETTINGS.pack(link.ETHTOOL_GLINKSETTINGS, speed, 1, 0xEF, 0, 1, 0, 0, 0, NWORDS,
                             0, 0, 0, 0, *([0] * 7))  # fmt: skip
        back += struct.pack(f"={3 * NWORDS}I", *words(supported), *words(supported),
                            *words(partner))  # fmt: skip
        ctypes.memmove(address, back, len(back))

    return ioctl


def test_the_bitmap_size_is_agreed_then_the_modes_are_read():
    calls: list = []
    # 100000baseCR4 (38), 25000baseCR (31), 40000baseCR4 (24), Autoneg (6), FEC_RS (50),
    # 800000baseCR8 (93) and bit 126, which no table of this ibtool names
    ioctl = kernel(25000, [38, 31, 24, 6, 50], [31, 93, 126], calls)
    got = link.link_settings("enp3s0f0", ioctl=ioctl)
    assert calls == [0, NWORDS]
    assert got == LinkSettings(
        "enp3s0f0",
        25000,
        ("100000baseCR4/Full", "40000baseCR4/Full", "25000baseCR/Full"),
        ("800000baseCR8/Full", "25000baseCR/Full"),
        0,
    )


def test_an_unknown_speed_and_a_bad_answer():
    got = link.link_settings("enp3s0f0", ioctl=kernel(0xFFFFFFFF, [], [], []))
    assert got == LinkSettings("enp3s0f0", None, (), ())

    def never_agrees(fd, request, ifreq):
        _, address = struct.unpack("16sP16x", ifreq)
        back = SETTINGS.pack(link.ETHTOOL_GLINKSETTINGS, 0, *([0] * 7), -3, *([0] * 4),
                             *([0] * 7))  # fmt: skip
        ctypes.memmove(address, back, len(back))

    with pytest.raises(ValueError, match="link_mode_masks_nwords"):
        link.link_settings("enp3s0f0", ioctl=never_agrees)
    with pytest.raises(ValueError, match="not a netdev name"):
        link.link_settings("x" * 16)


def test_the_mode_table_is_the_uapi_enum():
    """Spot checks against include/uapi/linux/ethtool.h's ETHTOOL_LINK_MODE_*_BIT values."""
    assert len(link.LINK_MODES) == 125
    assert link.LINK_MODES[5] == "1000baseT/Full" and link.LINK_MODES[6] == "-"  # Autoneg
    assert link.LINK_MODES[36] == "100000baseKR4/Full"
    assert link.LINK_MODES[62] == "200000baseKR4/Full"
    assert link.LINK_MODES[89] == "400000baseCR4/Full"
    assert link.LINK_MODES[124] == "1600000baseDR8_2/Full"
    assert link.mode_lanes("100000baseCR4/Full") == 4 and link.mode_lanes("1000baseT/Full") is None
    assert link.speed_text(2500) == "2.5 Gb/s" and link.speed_text(100) == "100 Mb/s"


# -- the running kernel ----------------------------------------------------------------------


def test_the_loopback_has_no_link_settings():
    with pytest.raises(OSError) as e:
        link.link_settings("lo")
    assert e.value.errno == errno.EOPNOTSUPP


def test_every_netdev_here_agrees_with_its_sysfs_speed():
    """What the ioctl says of each netdev of this machine, against /sys/class/net/*/speed (the
    kernel reads both from the driver's get_link_ksettings)."""
    for name in sorted(os.listdir("/sys/class/net")):
        try:
            with open(f"/sys/class/net/{name}/speed") as f:
                sysfs = int(f.read())
        except OSError:
            continue  # EINVAL: no link settings (lo, ifb) or the link is down
        try:
            got = link.link_settings(name)
        except OSError:
            continue
        assert got.speed == (None if sysfs in (-1, 0) else sysfs), name


def test_doctor_reads_the_link_only_on_the_running_kernel(monkeypatch):
    seen = []

    def settings(netdev):
        seen.append(netdev)
        return LinkSettings(netdev, 25000, CX5, ())

    monkeypatch.setattr(link, "link_settings", settings)

    class Live:
        live, root = True, "/"

    class Capture:
        live, root = False, "/tmp/capture"

    assert run.link_facts(Live(), port()) == (LinkSettings("enp3s0f0", 25000, CX5, ()), None)
    assert run.link_facts(Capture(), port()) == (
        None, "enp3s0f0's supported link modes need the running kernel (ethtool)"
    )  # fmt: skip
    assert run.link_facts(Live(), port(link_layer="InfiniBand")) == (None, None)
    assert seen == ["enp3s0f0"]

    def refused(netdev):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(link, "link_settings", refused)
    assert run.link_facts(Live(), port()) == (
        None, "enp3s0f0's link modes not known (ethtool: Operation not supported)"
    )  # fmt: skip

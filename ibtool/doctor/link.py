"""What an Ethernet netdev says of its link: its speed now and the link modes it supports (and
its link partner advertises), through the ethtool ioctl ETHTOOL_GLINKSETTINGS, which any user
may ask (net/ethtool/ioctl.c: only the set commands need CAP_NET_ADMIN). sysfs has the speed
(/sys/class/net/NETDEV/speed) but not the supported modes.

A RoCE port's `rate` file is that speed translated into an InfiniBand width and speed
(drivers/infiniband/core/verbs.c, ib_get_eth_speed: an unknown speed becomes 1X SDR, 2.5
Gb/sec), so the netdev's fastest supported mode is the port's maximum. InfiniBand ports have no
such file: their supported widths and speeds are in PortInfo (LinkWidthSupported,
LinkSpeedSupported), which only a MAD reads.

The running kernel only (an ioctl on a socket); nothing under --root.
"""

from __future__ import annotations

import ctypes
import re
import socket
import struct

from ibtool.model.deferred import dataclass

SIOCETHTOOL = 0x8946  # include/uapi/linux/sockios.h
ETHTOOL_GLINKSETTINGS = 0x4C  # include/uapi/linux/ethtool.h
SPEED_UNKNOWN = 0xFFFFFFFF  # SPEED_UNKNOWN (-1) as the u32 speed field carries it
IFNAMSIZ = 16
# struct ethtool_link_settings: cmd, speed, duplex, port, phy_address, autoneg, mdio_support,
# eth_tp_mdix, eth_tp_mdix_ctrl, link_mode_masks_nwords (s8), transceiver, master_slave_cfg,
# master_slave_state, rate_matching, reserved[7]; then the supported, advertising and
# lp_advertising bitmaps of link_mode_masks_nwords u32 each.
_SETTINGS = struct.Struct("=IIBBBBBBBbBBBB7I")
_NWORDS = 9  # the index of link_mode_masks_nwords in _SETTINGS
_IFREQ = struct.Struct("16sP16x")  # struct ifreq: the name, then ifr_data (40 bytes on LP64)

# enum ethtool_link_mode_bit_indices (include/uapi/linux/ethtool.h, to bit 124 of v7.0): the
# link modes by bit, as ethtool(8) names them; "-" for the bits that are no speed (Autoneg,
# TP, Pause, FEC, ...). A bit past the table is a mode this ibtool does not know.
LINK_MODES = tuple(
    """
    10baseT/Half 10baseT/Full 100baseT/Half 100baseT/Full 1000baseT/Half 1000baseT/Full - -
    - - - - 10000baseT/Full - - 2500baseX/Full - 1000baseKX/Full 10000baseKX4/Full
    10000baseKR/Full - 20000baseMLD2/Full 20000baseKR2/Full 40000baseKR4/Full
    40000baseCR4/Full 40000baseSR4/Full 40000baseLR4/Full 56000baseKR4/Full
    56000baseCR4/Full 56000baseSR4/Full 56000baseLR4/Full 25000baseCR/Full 25000baseKR/Full
    25000baseSR/Full 50000baseCR2/Full 50000baseKR2/Full 100000baseKR4/Full
    100000baseSR4/Full 100000baseCR4/Full 100000baseLR4_ER4/Full 50000baseSR2/Full
    1000baseX/Full 10000baseCR/Full 10000baseSR/Full 10000baseLR/Full 10000baseLRM/Full
    10000baseER/Full 2500baseT/Full 5000baseT/Full - - - 50000baseKR/Full 50000baseSR/Full
    50000baseCR/Full 50000baseLR_ER_FR/Full 50000baseDR/Full 100000baseKR2/Full
    100000baseSR2/Full 100000baseCR2/Full 100000baseLR2_ER2_FR2/Full 100000baseDR2/Full
    200000baseKR4/Full 200000baseSR4/Full 200000baseLR4_ER4_FR4/Full 200000baseDR4/Full
    200000baseCR4/Full 100baseT1/Full 1000baseT1/Full 400000baseKR8/Full 400000baseSR8/Full
    400000baseLR8_ER8_FR8/Full 400000baseDR8/Full 400000baseCR8/Full - 100000baseKR/Full
    100000baseSR/Full 100000baseLR_ER_FR/Full 100000baseCR/Full 100000baseDR/Full
    200000baseKR2/Full 200000baseSR2/Full 200000baseLR2_ER2_FR2/Full 200000baseDR2/Full
    200000baseCR2/Full 400000baseKR4/Full 400000baseSR4/Full 400000baseLR4_ER4_FR4/Full
    400000baseDR4/Full 400000baseCR4/Full 100baseFX/Half 100baseFX/Full 10baseT1L/Full
    800000baseCR8/Full 800000baseKR8/Full 800000baseDR8/Full 800000baseDR8_2/Full
    800000baseSR8/Full 800000baseVR8/Full 10baseT1S/Full 10baseT1S/Half 10baseT1S_P2MP/Half
    10baseT1BRR/Full 200000baseCR/Full 200000baseKR/Full 200000baseDR/Full
    200000baseDR_2/Full 200000baseSR/Full 200000baseVR/Full 400000baseCR2/Full
    400000baseKR2/Full 400000baseDR2/Full 400000baseDR2_2/Full 400000baseSR2/Full
    400000baseVR2/Full 800000baseCR4/Full 800000baseKR4/Full 800000baseDR4/Full
    800000baseDR4_2/Full 800000baseSR4/Full 800000baseVR4/Full 1600000baseCR8/Full
    1600000baseKR8/Full 1600000baseDR8/Full 1600000baseDR8_2/Full
    """.split()
)
_MODE = re.compile(r"(\d+)base([A-Z]+)(\d*)")


def mode_speed(mode: str) -> int:
    """A link mode's speed in Mb/s: 100000baseCR4/Full -> 100000."""
    m = _MODE.match(mode)
    return int(m.group(1)) if m else 0


def mode_lanes(mode: str) -> int | None:
    """The lanes a link mode runs on (100000baseCR4 -> 4, 25000baseSR -> 1); None for twisted
    pair (baseT), whose pairs are not lanes."""
    m = _MODE.match(mode)
    if m is None or m.group(2).startswith("T"):
        return None
    return int(m.group(3) or 1)


def speed_text(mbps: int) -> str:
    """Mb/s as ethtool's users say it: 100 Gb/s, 2.5 Gb/s, 100 Mb/s."""
    if mbps >= 1000:
        return f"{mbps / 1000:g} Gb/s"
    return f"{mbps} Mb/s"


@dataclass(frozen=True)
class LinkSettings:
    """A netdev's link as ETHTOOL_GLINKSETTINGS tells it."""

    netdev: str
    speed: int | None  # Mb/s now; None: unknown (SPEED_UNKNOWN, or 0 while the link is down)
    supported: tuple[str, ...]  # link modes, fastest first
    partner: tuple[str, ...]  # what the link partner advertises (empty: not told)
    unknown_bits: int = 0  # supported bits past LINK_MODES (modes newer than this table)

    @property
    def fastest(self) -> str | None:
        return self.supported[0] if self.supported else None

    @property
    def partner_fastest(self) -> str | None:
        return self.partner[0] if self.partner else None


def _modes(words: tuple[int, ...]) -> tuple[tuple[str, ...], int]:
    found, unknown = [], 0
    for i, word in enumerate(words):
        for b in range(32):
            if not word >> b & 1:
                continue
            bit = i * 32 + b
            if bit >= len(LINK_MODES):
                unknown += 1
            elif LINK_MODES[bit] != "-":
                found.append(LINK_MODES[bit])
    found.sort(key=mode_speed, reverse=True)
    return tuple(found), unknown


def _ioctl(fd: int, request: int, arg: bytes) -> None:
    import fcntl

    fcntl.ioctl(fd, request, arg)


def link_settings(netdev: str, ioctl=_ioctl) -> LinkSettings:
    """`netdev`'s link settings; OSError as the kernel refuses (EOPNOTSUPP: the driver has no
    link settings, ENODEV: no such netdev here), ValueError for an answer that is not one.

    The bitmaps' size is agreed first, as ethtool(8) does: asked with 0 words, the kernel
    answers with minus the number it uses, and fills them when asked with that."""
    name = netdev.encode()
    if not name or len(name) >= IFNAMSIZ or b"/" in name or b"\0" in name:
        raise ValueError(f"not a netdev name: {netdev!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        nwords = 0
        for _ in range(2):
            buf = ctypes.create_string_buffer(_SETTINGS.size + 3 * 4 * nwords)
            _SETTINGS.pack_into(buf, 0, ETHTOOL_GLINKSETTINGS, 0, *([0] * 7), nwords,
                                *([0] * 4), *([0] * 7))  # fmt: skip
            ioctl(s.fileno(), SIOCETHTOOL, _IFREQ.pack(name, ctypes.addressof(buf)))
            fields = _SETTINGS.unpack_from(buf)
            got = fields[_NWORDS]
            if nwords == 0 and got < 0:
                nwords = -got
                continue
            if got <= 0 or got != nwords:
                raise ValueError(f"link_mode_masks_nwords {got} after asking {nwords}")
            words = struct.unpack_from(f"={3 * nwords}I", buf, _SETTINGS.size)
            supported, unknown = _modes(words[:nwords])
            partner, _ = _modes(words[2 * nwords :])
            speed = fields[1]
            return LinkSettings(
                netdev,
                None if speed in (0, SPEED_UNKNOWN) else speed,
                supported,
                partner,
                unknown,
            )
    raise ValueError("no link_mode_masks_nwords agreed")

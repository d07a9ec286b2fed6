"""Every number a flag of counters, monitor, tui, loopback, ping and gids takes is finite and
within the range its man page states; anything else is a usage error (exit 2) naming that range,
before the command reads or opens anything."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ibtool.errors import ExitCode
from ibtool.rdma.ping.session import MAX_PING_SIZE

INT_MAX = 2**31 - 1
LONGEST = 2147483  # seconds: iputils' ping keeps its times in milliseconds in a C int


def show(value: float) -> str:
    """A number as typed: whole ones in full."""
    return str(int(value)) if float(value).is_integer() else f"{value:.10g}"


@dataclass(frozen=True)
class Flag:
    command: str
    flag: str
    kind: type
    low: float
    high: float
    said: str  # the range as the error states it
    low_open: bool = False

    def __str__(self) -> str:
        return f"{self.command} {self.flag}"

    def just_outside(self) -> list[str]:
        """The nearest values the range leaves out, either side."""
        if self.kind is int:
            return [str(self.low - 1), str(self.high + 1)]
        low = self.low if self.low_open else (self.low * 0.99 if self.low else -0.001)
        return [show(low), show(self.high * 1.01)]

    def ends(self) -> list[str]:
        """The values the range keeps at its ends."""
        return [show(v) for v in ([] if self.low_open else [self.low]) + [self.high]]


def seconds(command: str, flag: str, low: float, high: float, low_open: bool = False) -> Flag:
    if low_open:
        said = f"more than {show(low)} and at most {show(high)} seconds"
    else:
        said = f"{show(low)} to {show(high)} seconds"
    return Flag(command, flag, float, low, high, said, low_open)


def integer(command: str, flag: str, low: int, high: int, unit: str = "") -> Flag:
    return Flag(command, flag, int, low, high, f"{low} to {high}" + (f" {unit}" if unit else ""))


FLAGS = [
    seconds("counters", "--interval", 0.001, 86400),
    seconds("counters", "--watch", 0.001, 86400),
    seconds("monitor", "--interval", 0.001, 86400),
    integer("monitor", "--count", 1, INT_MAX),
    seconds("monitor", "--timeout", 0, LONGEST, low_open=True),
    seconds("tui", "--interval", 0.2, 10),
    seconds("tui", "--health-interval", 1, 86400),
    integer("loopback", "--size", 1, 2**31, "bytes"),
    integer("loopback", "--iters", 1, 1_000_000),
    integer("loopback", "--gid-index", 0, 255),
    integer("loopback", "--pkey-index", 0, 65535),
    seconds("loopback", "--timeout", 0, 3600, low_open=True),
    integer("loopback", "--depth", 1, 65536),
    integer("loopback", "--sl", 0, 15),
    integer("ping", "--sl", 0, 15),
    integer("ping", "--tclass", 0, 255),
    integer("ping", "--mtu", 256, 4096, "bytes"),
    integer("ping", "--port", 1, 65535),
    integer("ping", "--gid-index", 0, 255),
    integer("ping", "--pkey-index", 0, 65535),
    integer("ping", "--count", 1, INT_MAX),
    seconds("ping", "--interval", 0, LONGEST),
    integer("ping", "--size", 1, MAX_PING_SIZE, "bytes"),
    seconds("ping", "--deadline", 0, LONGEST, low_open=True),
    seconds("ping", "--timeout", 0.001, LONGEST),
    integer("ping", "--max-clients", 1, INT_MAX),
    integer("gids", "--port", 0, 255),
]

NOT_FINITE_OR_HUGE = ["nan", "inf", "-inf", "1e308"]


@pytest.mark.parametrize(
    ("flag", "value"),
    [(f, v) for f in FLAGS for v in NOT_FINITE_OR_HUGE + f.just_outside()],
    ids=lambda x: str(x),
)
def test_a_value_outside_the_range_is_a_usage_error_naming_it(cli, flag, value):
    # FLAG=VALUE: argparse would take a lone "-inf" for an option
    r = cli(flag.command, f"{flag.flag}={value}")
    assert (r.code, r.out) == (ExitCode.USAGE, ""), r
    assert f"argument {flag.flag}" in r.err or f"/{flag.flag}:" in r.err
    assert flag.said in r.err, r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize(
    ("flag", "value"), [(f, v) for f in FLAGS for v in f.ends()], ids=lambda x: str(x)
)
def test_the_ends_of_the_range_are_taken(cli, flag, value):
    # -h after the flag: argparse has converted the value when it gets there, then prints help
    r = cli(flag.command, f"{flag.flag}={value}", "-h")
    assert (r.code, r.err) == (0, ""), r
    assert r.out.startswith(f"usage: ibtool {flag.command} ")


def test_rates_over_a_millisecond_are_rates(mlx5_ib_hca):
    r = mlx5_ib_hca("-j", "counters", "--rate", "--interval", "0.001", "mlx5_0/1")
    assert r.code == 0, r.err
    assert all(row["rate_per_sec"] == 0 for row in r.json if row["rate_per_sec"] is not None)


def test_a_watch_polling_every_day_ends_at_its_timeout(mlx5_ib_hca):
    r = mlx5_ib_hca("monitor", "--interval", "86400", "--timeout", "0.05")
    assert (r.code, r.out, r.err) == (0, "", "")

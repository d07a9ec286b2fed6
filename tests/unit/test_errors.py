"""Errors as the operator meets them: one line on stderr with a hint, a documented exit code,
nothing on stdout, and never a traceback."""

from __future__ import annotations

import pytest

from ibtool.errors import ExitCode

RXE_HINT = "rdma link add rxe0 type rxe netdev"


def assert_clean_error(r, code: int) -> None:
    assert r.code == code, r
    assert r.out == ""
    assert "Traceback" not in r.err
    assert "internal error" not in r.err


@pytest.mark.parametrize(
    "argv",
    [["dev", "mlx9_0"], ["port", "mlx9_0"], ["gids", "mlx9_0"], ["gids", "mlx9_0", "--best"]],
)
def test_unknown_device_names_the_devices_there(mlx5_ib_hca, argv):
    r = mlx5_ib_hca(*argv)
    assert_clean_error(r, ExitCode.NOT_FOUND)
    assert r.err == "ibtool: error: unknown device 'mlx9_0' (hint: devices here: mlx5_0)\n"


def test_unknown_device_lists_every_device_even_a_broken_one(broken_device):
    r = broken_device("dev", "mlx5_9")
    assert_clean_error(r, 4)
    assert "(hint: devices here: mlx4_0, mlx5_0)" in r.err


@pytest.mark.parametrize("command", [["port"], ["gids"], ["dev"]])
def test_unknown_port_lists_the_ports(mlx5_ib_hca, command):
    r = mlx5_ib_hca(*command, "mlx5_0/3")
    assert_clean_error(r, 4)
    assert r.err == (
        "ibtool: error: mlx5_0 has no port 3 (hint: ports of mlx5_0: mlx5_0/1, mlx5_0/2)\n"
    )


def test_port_zero_is_not_a_port(mlx5_roce):
    r = mlx5_roce("port", "mlx5_0/0")
    assert_clean_error(r, 4)
    assert "ports of mlx5_0: mlx5_0/1" in r.err


@pytest.mark.parametrize(
    "command", [["dev"], ["port"], ["link"], ["gids"], ["-j", "gids"], ["gids", "--best"]]
)
def test_no_sysfs_class_dir_exits_3_with_the_rxe_hint(empty_root, command):
    r = empty_root(*command)
    assert_clean_error(r, ExitCode.NO_DEVICES)
    assert r.err.startswith("ibtool: error: no RDMA devices (")
    assert "sys/class/infiniband does not exist" in r.err
    assert RXE_HINT in r.err


def test_empty_sysfs_class_dir_exits_3(empty_root):
    (empty_root.root / "sys" / "class" / "infiniband").mkdir(parents=True)
    r = empty_root("dev")
    assert_clean_error(r, 3)
    assert "no RDMA devices (empty " in r.err and RXE_HINT in r.err


def test_class_path_that_is_not_a_directory_is_not_an_internal_error(empty_root):
    (empty_root.root / "sys" / "class").mkdir(parents=True)
    (empty_root.root / "sys" / "class" / "infiniband").write_text("not a directory\n")
    r = empty_root("dev")
    assert r.code not in (ExitCode.OK, ExitCode.INTERNAL), r
    assert_clean_error(r, r.code)


@pytest.mark.parametrize("selector", ["mlx5_0/x", "mlx5_0/", "/1", "mlx5_0/-1"])
def test_bad_selector_exits_2(mlx5_ib_hca, selector):
    r = mlx5_ib_hca("port", selector)
    assert_clean_error(r, ExitCode.USAGE)
    assert r.err == (
        f"ibtool: error: bad device selector {selector!r} "
        "(hint: use DEV or DEV/PORT, e.g. mlx5_0/1)\n"
    )


def test_two_selectors_exit_2(mlx5_ib_hca):
    r = mlx5_ib_hca("dev", "show", "mlx5_0", "mlx5_1")
    assert_clean_error(r, 2)
    assert "unexpected arguments: mlx5_1" in r.err


def test_ip_filter_that_is_not_an_address_exits_2(mlx5_roce):
    r = mlx5_roce("gids", "--ip", "192.168.10")
    assert_clean_error(r, 2)
    assert r.err == "ibtool: error: --ip 192.168.10: not an IP address\n"


@pytest.mark.parametrize(
    "argv",
    [["gids", "--type", "v3"], ["gids", "--port", "one"], ["frobnicate"], ["dev", "--bogus"]],
)
def test_argparse_errors_exit_2_with_usage(mlx5_roce, argv):
    r = mlx5_roce(*argv)
    assert_clean_error(r, 2)
    assert r.err.startswith("usage: ibtool")
    assert "error:" in r.err


def test_no_object_prints_help_and_exits_2(mlx5_roce):
    r = mlx5_roce()
    assert_clean_error(r, 2)
    assert "dev (device)" in r.err and "port (link)" in r.err


def test_root_that_is_not_a_directory_exits_2(cli, tmp_path):
    r = cli("--root", str(tmp_path / "nowhere"), "dev")
    assert_clean_error(r, 2)
    assert r.err == f"ibtool: error: --root {tmp_path / 'nowhere'}: not a directory\n"


def test_errors_never_print_a_traceback_even_on_broken_trees(broken_device):
    for argv in (["dev"], ["port"], ["gids"], ["-j", "gids", "--best"], ["-d", "dev"]):
        r = broken_device(*argv)
        assert r.code == 0, (argv, r)
        assert "Traceback" not in r.err and "internal error" not in r.err
        assert all(line.startswith("ibtool: warning: ") for line in r.err.splitlines()), r.err


@pytest.mark.parametrize(
    "argv",
    [
        ["res"],
        ["system"],
        ["loopback"],
        ["ping", "--server"],
        ["counters", "optional"],
        ["link", "add", "rxe9", "type", "rxe", "netdev", "eth0"],
    ],
)
def test_what_needs_the_running_kernel_is_one_usage_error_under_root(mlx5_roce, argv):
    # Host.require_live: the one check, one error class (NotLiveError, a usage error, exit 2)
    r = mlx5_roce(*argv)
    assert (r.code, r.out) == (2, "")
    assert r.err.startswith("ibtool: error: ") and r.err.count("\n") == 1
    assert "--root trees hold only sysfs" in r.err or "; --root is a copy" in r.err

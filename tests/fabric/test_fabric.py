"""`ibtool fabric` on simulated fabrics, answer for answer against ibnetdiscover's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.fabric import oracle

IBTOOL = [sys.executable, "-m", "ibtool"]
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ibtool(fabric, *argv, host=None, env=None):
    env = {**fabric.env(host), **(env or {})}
    env["PYTHONPATH"] = CHECKOUT
    return subprocess.run(
        [*IBTOOL, *argv], env=env, capture_output=True, text=True, timeout=120, cwd=fabric.dir
    )


def said(r) -> list[str]:
    """ibtool's standard error, without the line umad2sim prints as it loads (the simulator's,
    before any of ibtool's code runs)."""
    return [line for line in r.stderr.splitlines() if "sim_connect: attached" not in line]


def scan(fabric, host=None):
    r = ibtool(fabric, "-j", "fabric", host=host)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def diags(fabric, *argv, host=None) -> str:
    r = fabric.run(list(argv), host=host)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("host", [None, "node005 mlx5_0"])
def test_the_nodes_are_ibnetdiscovers(small, host):
    ours = scan(small, host)
    theirs = oracle.nodes(diags(small, "ibnetdiscover", host=host))
    assert {n["guid"]: n["type"] for n in ours["nodes"]} == {
        g: t["type"] for g, t in theirs.items()
    }
    for n in ours["nodes"]:
        t = theirs[n["guid"]]
        assert (n["ports"], n["description"]) == (t["ports"], t["description"])
        if n["type"] == "SW":
            assert n["lid"] == t["lid"]
    assert len(ours["nodes"]) == 4 + 6


def _their_links(text: str) -> set:
    """Each cable once, as the set of its two ends (port GUID, port number, LID)."""
    links = set()
    for _, lid, port, guid, _, _, far in oracle.ports(text):
        if far is not None:
            links.add(frozenset({(guid, port, lid), (far[3], far[2], far[1])}))
    return links


def _our_links(ours: dict) -> set:
    return {
        frozenset({(lk[e]["port_guid"], lk[e]["port"], lk[e]["lid"]) for e in ("a", "b")})
        for lk in ours["links"]
    }


@pytest.mark.parametrize("fabric", ["small", "odd"])
def test_the_links_are_ibnetdiscovers_with_both_ends(fabric, request):
    sim = request.getfixturevalue(fabric)
    ours = scan(sim)
    text = diags(sim, "ibnetdiscover", "-p")
    assert _our_links(ours) == _their_links(text)
    widths = {(g, p): (w, s) for _, _, p, g, w, s, far in oracle.ports(text) if far}
    for lk in ours["links"]:
        w, s = widths[(lk["a"]["port_guid"], lk["a"]["port"])]
        assert (lk["width"].lower(), lk["speed"]) == (w.lower(), s)
        assert lk["state"] == "ACTIVE"


def test_the_text_names_both_ends_of_every_cable_and_escapes_what_is_not_printable(odd):
    r = ibtool(odd, "fabric")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("subnet through ibsim0/0 (Switch1): 2 switches, 4 channel adapters")
    assert "\x1b" not in r.stdout and "Hca4\\x1b[31m red" in r.stdout
    assert any(
        line.split()[:1] == ["Switch2/2"] and "Hca4\\x1b[31m red/1" in line for line in lines
    )
    assert sum(1 for line in lines if line.startswith(("Switch1/", "Switch2/"))) == 6


def test_an_uplink_unlinked_is_gone_from_both_answers_and_back_when_relinked(small):
    before = _our_links(scan(small))
    small.console('Unlink "spine02"[1]')
    try:
        deadline = time.monotonic() + 60
        while len(_our_links(scan(small))) == len(before):
            assert time.monotonic() < deadline, "the unlinked cable is still there after 60 s"
        ours = _our_links(scan(small))
        assert ours == _their_links(diags(small, "ibnetdiscover", "-p"))
        assert len(ours) == len(before) - 1
    finally:
        small.console('ReLink "spine02"[1]')  # ibsim's word for putting a cable back
        deadline = time.monotonic() + 60
        while _our_links(scan(small)) != before:
            assert time.monotonic() < deadline, "the cable did not come back"


@pytest.mark.parametrize("fabric", ["small", "narrow", "odd"])
def test_each_links_width_and_speed_are_iblinkinfos_at_both_ends(fabric, request):
    sim = request.getfixturevalue(fabric)
    r = ibtool(sim, "-j", "fabric", "links")
    assert r.returncode in (0, 1), r.stderr
    ours = json.loads(r.stdout)
    theirs = oracle.linkinfo(diags(sim, "iblinkinfo", "--line"))
    assert len(theirs) == 2 * len(ours["links"])
    for lk in ours["links"]:
        for near, far in (("a", "b"), ("b", "a")):
            width, speed, state, other = theirs[lk[near]["port_guid"], lk[near]["port"]]
            assert (lk["width"], lk["speed"], lk["state"]) == (width, speed, state)
            assert other == (lk[far]["port_guid"], lk[far]["port"])


def test_a_fabric_whose_links_all_run_at_their_norm_says_so_exit_0(small):
    r = ibtool(small, "fabric", "links")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == (
        "10 links through ibsim0/0; the norm: switch-to-CA 4X SDR (6 of 6), "
        "switch-to-switch 4X SDR (4 of 4)"
    )
    assert lines[-1] == "every link runs at what both its ends enable and its tier's norm"
    assert all(line.endswith(" ok") for line in lines[3:-2])


def test_a_cable_at_1x_and_an_end_set_narrow_are_named_both_ends_and_nothing_else(narrow):
    r = ibtool(narrow, "-j", "fabric", "links")
    assert r.returncode == 1, r.stderr  # Nagios' WARNING
    ours = json.loads(r.stdout)
    assert ours["status"] == "WARNING"
    assert ours["norms"]["switch-to-CA"] == {"width": "4X", "speed": "SDR", "links": 4, "of": 6}
    named = {
        (lk["a"]["node"], lk["a"]["port"], lk["b"]["node"], f["kind"], f["end"])
        for lk in ours["links"]
        for f in lk["findings"]
    }
    assert named == {
        ("leaf01", 1, "node001 mlx5_0", "below_norm", None),
        ("leaf01", 2, "node002 mlx5_0", "width_enabled_below", "a"),
    }
    text = ibtool(narrow, "fabric", "links")
    assert text.returncode == 1
    assert (
        "WARNING leaf01/2 <-> node002 mlx5_0/1: leaf01/2 enables at most 1X; it supports 4X "
        "and node002 mlx5_0/1 enables it"
    ) in text.stdout.splitlines()
    assert text.stdout.splitlines()[-1] == "2 of 10 links need attention"


@pytest.mark.parametrize(
    "source, dest, by",
    [
        ("2", "8", ["2", "8"]),  # CA to CA across a spine
        ("node001 mlx5_0", "leaf02", ["2", "6"]),  # to a switch, by name
        ("4", "node001 mlx5_0", ["4", "2"]),  # from a switch
        ("0x0000000000100001", "0x0000000000100007", ["-G", "0x100001", "0x100007"]),
    ],
)
def test_a_route_is_ibtracerts_hop_by_hop(narrow, source, dest, by):
    """On the tree whose counters no test moves (the small one's links are unlinked and
    relinked, which counts in LinkDownedCounter)."""
    r = ibtool(narrow, "-j", "fabric", "route", source, dest)
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)
    theirs = oracle.tracert(diags(narrow, "ibtracert", *by))
    assert [(h["out"]["port"], h["into"]["port"]) for h in ours["hops"]] == [
        (out, far) for out, _, far, _ in theirs
    ]
    assert [int(h["into"]["port_guid"], 16) for h in ours["hops"]] == [
        int(g, 16) for _, g, _, _ in theirs
    ]
    assert ours["status"] == "OK" and ours["broken"] is None


def test_a_route_names_errors_on_its_hops_and_the_text_escapes_names(odd):
    r = ibtool(odd, "fabric", "route", "Hca1", "Hca4\x1b[31m red")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "Hca4\\x1b[31m red/1" in r.stdout
    r = ibtool(odd, "fabric", "route", "Hca1", "nobody")
    assert r.returncode == 4
    assert said(r) == [
        "ibtool: error: no node of the subnet is described as 'nobody' (hint: give a LID, a "
        "GUID (0x...) or a node description)"
    ]
    r = ibtool(odd, "fabric", "route", "Hca1")
    assert r.returncode == 2 and "needs a source and a destination" in r.stderr


def test_an_unknown_port_to_scan_through_is_named_with_the_ports_there_are(small):
    r = ibtool(small, "fabric", "--via", "mlx5_9")
    assert (r.returncode, r.stdout) == (4, "")
    assert said(r) == ["ibtool: error: no port mlx5_9 among libibumad's: ibsim0/0"]


def test_an_unknown_action_is_a_usage_error(small):
    r = ibtool(small, "fabric", "frobnicate")
    assert r.returncode == 2 and "unknown fabric action 'frobnicate'" in r.stderr


def test_without_a_simulator_or_an_infiniband_hca_it_says_there_is_none_here(tmp_path):
    """This host's own libibumad: no CA here (the test hosts have none), one line, exit 6."""
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        pytest.skip("this host has RDMA devices: its fabric would be scanned")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "SIM_HOST")}
    env["PYTHONPATH"] = CHECKOUT
    r = subprocess.run([*IBTOOL, "fabric"], env=env, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (6, "")
    assert r.stderr.splitlines() == [
        "ibtool: error: no InfiniBand device here: libibumad sees no CA (hint: ibtool fabric "
        "runs on a node with an InfiniBand HCA (or under ibsim's umad2sim))"
    ]


def test_a_root_tree_has_no_fabric_to_ask(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "SIM_HOST")}
    env["PYTHONPATH"] = CHECKOUT
    r = subprocess.run([*IBTOOL, "--root", str(tmp_path), "fabric"], env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (r.returncode, r.stdout) == (2, "")
    assert "the fabric is asked with MADs" in r.stderr

"""Simulated fabrics, one per topology for the whole session (ibsim + opensm, on the host)."""

from __future__ import annotations

import os

import pytest

from tests.fabric.ibsim import SimFabric, fat_tree, missing

# Two leaves of three HCAs and two spines: the small tree most tests read.
SMALL = fat_tree(2, 3, 2)
# Four leaves of two HCAs under two spines: a leaf's uplink is crossed by its own hosts' routes
# through that spine only, not by every cross-leaf route as in a tree of two leaves (the mesh's
# cable analysis needs a cable that the others do not always come with).
TREE = fat_tree(4, 2, 2)
# The small tree with two cables at 1X: leaf01/1 <-> node001 (both ends enable only 1X, as a
# cable left at 1X by its ends' settings is) and leaf01/2 <-> node002 (the switch end enables
# only 1X, the HCA 1X and 4X). ibsim trains a link at what both ends enable.
NARROW = fat_tree(
    2, 3, 2,
    widths={("leaf01", 1): 1, ("node001 mlx5_0", 1): 1, ("leaf01", 2): 1, ("node002 mlx5_0", 1): 3},
)  # fmt: skip
# ibsim's own example (net-examples/net.2sw2path4hca, two-port HCAs with a port left dark,
# switches with ports down) in its format, with a node description a hostile capture would use.
ODD = """Switch\t8 "Switch1"
[1]\t"Hca1"[1]
[2]\t"Hca3"[1]
[3]\t"Switch2"[3]
[5]\t"Switch2"[5]

Switch\t8 "Switch2"
[1]\t"Hca2"[1]
[2]\t"Hca4\x1b[31m red"[1]
[3]\t"Switch1"[3]
[5]\t"Switch1"[5]

Hca\t2 "Hca1"
[1]\t"Switch1"[1]

Hca\t2 "Hca2"
[1]\t"Switch2"[1]

Hca\t2 "Hca3"
[1]\t"Switch1"[2]

Hca\t2 "Hca4\x1b[31m red"
[1]\t"Switch2"[2]
"""


def need_the_simulator() -> None:
    gone = missing()
    if gone:
        why = f"no simulated fabric here: {', '.join(gone)} missing (ibsim-utils, opensm)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="session")
def small(tmp_path_factory):
    need_the_simulator()
    with SimFabric(SMALL, tmp_path_factory.mktemp("small")) as fabric:
        yield fabric


@pytest.fixture(scope="session")
def tree(tmp_path_factory):
    need_the_simulator()
    with SimFabric(TREE, tmp_path_factory.mktemp("tree")) as fabric:
        yield fabric


@pytest.fixture(scope="session")
def counted(tmp_path_factory):
    """The small tree, its counters set by the tests (each puts them back)."""
    need_the_simulator()
    with SimFabric(SMALL, tmp_path_factory.mktemp("counted")) as fabric:
        yield fabric


@pytest.fixture(scope="session")
def narrow(tmp_path_factory):
    need_the_simulator()
    with SimFabric(NARROW, tmp_path_factory.mktemp("narrow")) as fabric:
        yield fabric


@pytest.fixture(scope="session")
def odd(tmp_path_factory):
    need_the_simulator()
    with SimFabric(ODD, tmp_path_factory.mktemp("odd")) as fabric:
        yield fabric

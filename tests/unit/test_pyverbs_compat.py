"""One pyverbs for every release from rdma-core 33 to 65: enum modules found whichever name they
have, constants through the enum classes only, features probed once, and an install hint
naming the package whenever something is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ibtool.errors import ExitCode, UnsupportedError
from ibtool.sources import verbs
from tests.unit.pyverbs_fakes import LAYOUTS

RELEASES = list(LAYOUTS)
ENUMS_MODULE = {
    "rdma-core-33": "pyverbs.enums",
    "rdma-core-44": "pyverbs.enums",
    "rdma-core-56": "pyverbs.libibverbs_enums",
    "rdma-core-65": "pyverbs.libibverbs_enums",
}


@pytest.mark.parametrize("release", RELEASES)
def test_every_constant_the_data_path_uses_resolves_through_the_enum_classes(release, fake_pyverbs):
    fake_pyverbs(release)
    pv = verbs.pyverbs()
    assert pv.enums_module == ENUMS_MODULE[release]
    e = pv.e
    assert (e.ibv_qp_type.IBV_QPT_RC, e.ibv_qp_type.IBV_QPT_UD) == (2, 4)
    assert (e.ibv_qp_state.IBV_QPS_RESET, e.ibv_qp_state.IBV_QPS_INIT) == (0, 1)
    op = e.ibv_wr_opcode
    assert [
        op.IBV_WR_RDMA_WRITE,
        op.IBV_WR_RDMA_WRITE_WITH_IMM,
        op.IBV_WR_SEND,
        op.IBV_WR_RDMA_READ,
        op.IBV_WR_ATOMIC_CMP_AND_SWP,
        op.IBV_WR_ATOMIC_FETCH_AND_ADD,
    ] == [0, 1, 2, 4, 5, 6]
    assert e.ibv_create_cq_wc_flags.IBV_WC_EX_WITH_IMM == 2
    assert pv.cqex
    assert pv.Error.__name__ == "PyverbsError" and pv.RDMAError.__name__ == "PyverbsRDMAError"


def test_the_namespace_offers_the_classes_not_the_flat_names(fake_pyverbs):
    # rdma-core 44 still has flat names: code that used them would pass here and break on 65.
    fake_pyverbs("rdma-core-44")
    e = verbs.pyverbs().e
    with pytest.raises(AttributeError):
        e.IBV_QPT_RC  # noqa: B018
    assert sorted(vars(e)) == sorted(verbs.VERBS_ENUMS)


@pytest.mark.parametrize("release", RELEASES)
def test_rdma_cm_enums_and_reject_are_probed(release, fake_pyverbs):
    fake_pyverbs(release)
    cm = verbs.rdmacm()
    old = release in ("rdma-core-33", "rdma-core-44")
    assert cm.enums_module == ("pyverbs.cm_enums" if old else "pyverbs.librdmacm_enums")
    assert cm.e.rdma_port_space.RDMA_PS_TCP == 0x0106
    assert cm.e.rdma_cm_event_type.RDMA_CM_EVENT_ESTABLISHED == 9
    assert cm.reject == (release != "rdma-core-33")  # CMID.reject came in rdma-core 38
    assert cm.cmid.CMID.__name__ == "CMID"


def test_without_pyverbs_the_error_says_what_to_install(fake_pyverbs):
    fake_pyverbs(None)
    with pytest.raises(UnsupportedError) as err:
        verbs.pyverbs()
    assert err.value.exit_code == ExitCode.UNSUPPORTED
    assert err.value.message.startswith("pyverbs is not available (")
    assert "apt install python3-pyverbs" in err.value.hint
    assert "--system-site-packages" in err.value.hint
    with pytest.raises(UnsupportedError) as err:
        verbs.rdmacm()
    assert err.value.message.startswith("pyverbs is not available (")
    assert "apt install python3-pyverbs" in err.value.hint


def test_without_librdmacm_verbs_work_and_rdma_cm_says_what_to_install(fake_pyverbs):
    fake_pyverbs("rdma-core-65", rdmacm=False)
    assert verbs.pyverbs().e.ibv_qp_type.IBV_QPT_RC == 2
    with pytest.raises(UnsupportedError) as err:
        verbs.rdmacm()
    assert err.value.message == (
        "librdmacm's part of pyverbs is not available "
        "(import of pyverbs.cmid halted; None in sys.modules)"
    )
    assert "apt install python3-pyverbs librdmacm1" in err.value.hint
    assert "dnf install python3-pyverbs librdmacm" in err.value.hint


class MissingLibrary:
    """A meta path finder: importing `module` fails as a missing shared library makes it fail."""

    def __init__(self, module: str, library: str):
        self.module, self.library = module, library

    def find_spec(self, name, path=None, target=None):
        if name == self.module:
            raise ImportError(f"{self.library}: cannot open shared object file: No such file")
        return None


@pytest.mark.parametrize(
    "library, package",
    [("libibverbs.so.1", "ibverbs-providers rdma-core"), ("librdmacm.so.1", "librdmacm1")],
)
def test_a_missing_library_names_its_package(library, package, fake_pyverbs, monkeypatch):
    fake_pyverbs("rdma-core-56")
    monkeypatch.delitem(sys.modules, "pyverbs.device")
    monkeypatch.setattr(
        sys, "meta_path", [MissingLibrary("pyverbs.device", library), *sys.meta_path]
    )
    with pytest.raises(UnsupportedError) as err:
        verbs.pyverbs()
    assert library in err.value.message
    assert package in err.value.hint
    with pytest.raises(UnsupportedError) as err:  # dev -d takes the same hint
        verbs.VerbsSource()
    assert package in err.value.hint


def test_a_libibverbs_enums_without_the_classes_falls_back_to_pyverbs_enums(fake_pyverbs):
    # Both modules exist from rdma-core 50 to 58; whichever has the classes is the one used.
    fake_pyverbs("rdma-core-56", drop=("libibverbs_enums.ibv_wr_opcode",))
    pv = verbs.pyverbs()
    assert pv.enums_module == "pyverbs.enums"
    assert pv.e.ibv_wr_opcode.IBV_WR_SEND == 2


@pytest.mark.parametrize(
    "drop, missing",
    [
        (("libibverbs_enums.ibv_create_cq_wc_flags",), "pyverbs.libibverbs_enums.ibv_create_cq"),
        (("addr.GlobalRoute",), "pyverbs.addr.GlobalRoute"),
    ],
)
def test_a_pyverbs_too_old_for_the_data_path_says_so(drop, missing, fake_pyverbs):
    fake_pyverbs("rdma-core-65", drop=drop)
    with pytest.raises(UnsupportedError) as err:
        verbs.pyverbs()
    assert err.value.message.startswith(f"this pyverbs has no {missing}")
    assert "rdma-core 33 or later" in err.value.hint and "python3-pyverbs" in err.value.hint


def test_no_enum_module_under_either_name(fake_pyverbs, monkeypatch):
    fake_pyverbs("rdma-core-65")
    monkeypatch.setitem(sys.modules, "pyverbs.libibverbs_enums", None)
    with pytest.raises(UnsupportedError) as err:
        verbs.pyverbs()
    assert err.value.message == (
        "pyverbs has none of the modules pyverbs.libibverbs_enums, pyverbs.enums"
    )


def test_a_feature_added_later_is_reported_with_its_release():
    err = verbs.too_old("CMID.reject", 38)
    assert err.message == "this pyverbs has no CMID.reject (rdma-core 38 and later have it)"
    assert err.exit_code == ExitCode.UNSUPPORTED


def test_without_extended_cqs_the_probe_says_so(fake_pyverbs):
    fake_pyverbs("rdma-core-33", cqex=False)
    assert verbs.pyverbs().cqex is False


def test_probed_once(fake_pyverbs, monkeypatch):
    fake_pyverbs("rdma-core-65")
    first = verbs.pyverbs()
    monkeypatch.setitem(sys.modules, "pyverbs.libibverbs_enums", None)
    assert verbs.pyverbs() is first


IMPORTS = """
import sys, json
import ibtool.sources.verbs, ibtool.rdma.ladder
import ibtool.rdma.loopback.selftest, ibtool.rdma.ping.server
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'pyverbs')))
"""


def test_importing_the_data_path_does_not_import_pyverbs():
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"

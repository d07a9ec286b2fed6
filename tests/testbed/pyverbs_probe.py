"""What ibtool finds in this host's pyverbs: enum modules, every constant the data path uses,
the classes it builds, the probed features, and ibtool's own libibverbs numbers checked
against pyverbs' enums. No RDMA device is needed: nothing is opened.

    python3 tests/testbed/pyverbs_probe.py    # exit 0 when everything is there

Stdlib and ibtool only, so it runs with each release's system python3 and python3-pyverbs
(Debian's rdma-core 33, 44, 56 and 65 at the time of writing).
"""

from __future__ import annotations

import importlib
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ibtool.errors import IbtoolError  # noqa: E402
from ibtool.rdma import completions, ladder  # noqa: E402
from ibtool.rdma.loopback import apm, mcast, operations  # noqa: E402
from ibtool.rdma.ping import session  # noqa: E402
from ibtool.sources import verbs  # noqa: E402

# ibtool's plain numbers where it reads or sets libibverbs values itself, with the pyverbs
# enum member each must equal.
OWN_NUMBERS = [
    (ladder.ACCESS_LOCAL_WRITE, "ibv_access_flags", "IBV_ACCESS_LOCAL_WRITE"),
    (ladder.ACCESS_REMOTE_WRITE, "ibv_access_flags", "IBV_ACCESS_REMOTE_WRITE"),
    (ladder.ACCESS_REMOTE_READ, "ibv_access_flags", "IBV_ACCESS_REMOTE_READ"),
    (ladder.ACCESS_REMOTE_ATOMIC, "ibv_access_flags", "IBV_ACCESS_REMOTE_ATOMIC"),
    (operations.IBV_WC_RECV, "ibv_wc_opcode", "IBV_WC_RECV"),
    (operations.IBV_WC_RECV_RDMA_WITH_IMM, "ibv_wc_opcode", "IBV_WC_RECV_RDMA_WITH_IMM"),
    (operations.IBV_WC_WITH_IMM, "ibv_wc_flags", "IBV_WC_WITH_IMM"),
    (session.IBV_SEND_SIGNALED, "ibv_send_flags", "IBV_SEND_SIGNALED"),
    (apm.IBV_QP_ALT_PATH, "ibv_qp_attr_mask", "IBV_QP_ALT_PATH"),
    (apm.IBV_QP_PATH_MIG_STATE, "ibv_qp_attr_mask", "IBV_QP_PATH_MIG_STATE"),
    (mcast.IBV_QP_QKEY, "ibv_qp_attr_mask", "IBV_QP_QKEY"),
    (mcast.IBV_QP_PKEY_INDEX, "ibv_qp_attr_mask", "IBV_QP_PKEY_INDEX"),
    (apm.IBV_MIG_MIGRATED, "ibv_mig_state", "IBV_MIG_MIGRATED"),
    (apm.IBV_MIG_REARM, "ibv_mig_state", "IBV_MIG_REARM"),
    (apm.IBV_MIG_ARMED, "ibv_mig_state", "IBV_MIG_ARMED"),
    (apm.IB_DEVICE_AUTO_PATH_MIG, "ibv_device_cap_flags", "IBV_DEVICE_AUTO_PATH_MIG"),
] + [
    (status, "ibv_wc_status", f"IBV_WC_{name}")
    for status, (name, _) in sorted(completions.WC_STATUS.items())
]


class Probe:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def check(self, ok: bool, problem: str) -> str:
        if not ok:
            self.problems.append(problem)
        return "ok" if ok else "MISSING"

    def verbs(self) -> None:
        pv = verbs.pyverbs()
        enums = importlib.import_module(pv.enums_module)
        flat = "yes" if hasattr(enums, "IBV_QPT_RC") else "no"
        print(f"enums: {pv.enums_module} (flat names: {flat})")
        for cls, members in verbs.VERBS_ENUMS.items():
            values = ", ".join(f"{m}={int(getattr(getattr(pv.e, cls), m))}" for m in members)
            print(f"  {cls}: {values}")
        for module, classes in verbs.VERBS_CLASSES.items():
            found = [c for c in classes if hasattr(getattr(pv, module), c)]
            self.check(found == list(classes), f"pyverbs.{module} lacks some of {classes}")
            print(f"  pyverbs.{module}: {' '.join(found)}")
        print(f"  errors: {pv.Error.__name__}, {pv.RDMAError.__name__}")
        cqex = "CQEX, CqInitAttrEx, PollCqAttr, " + " ".join(verbs.CQEX_READS)
        print(f"extended CQ: {'yes' if pv.cqex else 'no (ping polls a plain CQ)'} ({cqex})")
        same, unknown, wrong = 0, [], []
        for number, cls, member in OWN_NUMBERS:
            theirs = getattr(getattr(enums, cls, None), member, None)
            if theirs is None:  # a name newer than this libibverbs: nothing to compare
                unknown.append(f"{cls}.{member}")
            elif int(theirs) != number:
                wrong.append(f"{cls}.{member}={int(theirs)}, ibtool says {number}")
            else:
                same += 1
        self.check(not wrong, "; ".join(wrong))
        print(f"ibtool's own numbers: {same}/{len(OWN_NUMBERS)} agree with pyverbs")
        for line in wrong:
            print(f"  DIFFERS: {line}")
        if unknown:
            print(f"  not in this pyverbs: {', '.join(unknown)}")

    def objects(self) -> None:
        """The attributes and work requests the data path builds, with its constants, built and
        read back: pyverbs' typed arguments take the enum members. No device needed."""
        pv = verbs.pyverbs()
        e, opcodes = pv.e, verbs.VERBS_ENUMS["ibv_wr_opcode"]
        cap = pv.qp.QPCap(max_send_wr=2, max_recv_wr=2, max_send_sge=1, max_recv_sge=1)
        init = pv.qp.QPInitAttr(qp_type=e.ibv_qp_type.IBV_QPT_UD, cap=cap, sq_sig_all=1)
        attr = pv.qp.QPAttr(
            qp_state=e.ibv_qp_state.IBV_QPS_INIT,
            cur_qp_state=e.ibv_qp_state.IBV_QPS_RESET,
            port_num=1,
        )
        sge = pv.wr.SGE(0x1000, 64, 0)
        wrs = [
            pv.wr.SendWR(wr_id=2, opcode=getattr(e.ibv_wr_opcode, name), num_sge=1, sg=[sge])
            for name in opcodes
        ]
        wrs[0].send_flags = session.IBV_SEND_SIGNALED
        wrs[1].set_wr_rdma(0x1234, 0x2000)
        wrs[-1].set_wr_atomic(0x1234, 0x2000, 1, 0)
        cq_attr = pv.cq.CqInitAttrEx(cqe=8, wc_flags=e.ibv_create_cq_wc_flags.IBV_WC_EX_WITH_IMM)
        pv.cq.PollCqAttr()
        gr = pv.addr.GlobalRoute(dgid=pv.addr.GID("fe80:0000:0000:0000:0000:0000:0000:0001"))
        gr.hop_limit = 64
        pv.addr.AHAttr(gr=gr, is_global=1, port_num=1, sl=0)
        pv.addr.AHAttr(dlid=1, is_global=0, port_num=1, sl=0)
        got = (
            init.qp_type,
            attr.qp_state,
            [wr.opcode for wr in wrs],
            cq_attr.wc_flags,
            gr.hop_limit,
        )
        want = (4, 1, [int(getattr(e.ibv_wr_opcode, name)) for name in opcodes], 2, 64)
        ok = self.check(got == want, f"objects read back {got}, want {want}")
        print(f"objects (QPInitAttr, QPAttr, SendWR x{len(wrs)}, CqInitAttrEx, AHAttr): {ok}")

    def rdmacm(self) -> None:
        cm = verbs.rdmacm()
        print(f"rdma_cm enums: {cm.enums_module}")
        for cls, members in verbs.CM_ENUMS.items():
            values = ", ".join(f"{m}={int(getattr(getattr(cm.e, cls), m))}" for m in members)
            print(f"  {cls}: {values}")
        print(f"  pyverbs.cmid: {' '.join(c for c in verbs.CM_CLASSES if hasattr(cm.cmid, c))}")
        print(f"  CMID.reject: {'yes' if cm.reject else 'no (rdma-core 38 and later)'}")
        multicast = ("join_multicast", "leave_multicast", "query_qp", "qpn")
        found = [m for m in multicast if hasattr(cm.cmid.CMID, m)]
        joined = getattr(cm.e.rdma_cm_event_type, "RDMA_CM_EVENT_MULTICAST_JOIN", None)
        self.check(
            found == list(multicast) and hasattr(cm.cmid, "UDParam") and joined is not None,
            "multicast (loopback --ops mcast) lacks some of CMID."
            f"{'/'.join(multicast)}, UDParam, RDMA_CM_EVENT_MULTICAST_JOIN",
        )
        print(f"  multicast: CMID.{' '.join(found)}, UDParam, MULTICAST_JOIN={joined}")


def main() -> int:
    probe = Probe()
    print(f"Python {platform.python_version()}, {platform.platform(terse=True)}")
    try:
        import pyverbs

        where = Path(pyverbs.__file__).parent
        version = getattr(pyverbs, "__version__", None)
        print(f"pyverbs: {where}" + (f", __version__ {version}" if version else ""))
    except ImportError as e:
        print(f"pyverbs: not importable ({e})")
    for part in (probe.verbs, probe.objects, probe.rdmacm):
        try:
            part()
        except IbtoolError as e:
            probe.problems.append(e.message)
            print(f"{part.__name__}: {e.message}\n  hint: {e.hint}")
    print("result: " + ("ok" if not probe.problems else "; ".join(probe.problems)))
    return 1 if probe.problems else 0


if __name__ == "__main__":
    sys.exit(main())

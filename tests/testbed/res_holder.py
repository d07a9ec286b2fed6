"""Create verbs objects on one RDMA device and hold them until stdin closes.

    /usr/bin/python3 tests/testbed/res_holder.py DEVICE [--rc N]

Stdlib and pyverbs only (Debian's python3-pyverbs, rdma-core 44: `pyverbs.enums`), so the
capture (system python) and the integration tests and benchmark (.venv) can all run it. It
opens a context, a PD, a CQ, a 4 KiB MR, an SRQ, a UD QP moved to RTS, an RC QP moved to INIT
(both have a port then), an RC QP on the SRQ, and N more RC QPs left in RESET (no port yet),
then prints one JSON line {"pid", "device", "lqpns": {...}} and waits. EOF on stdin, SIGTERM or
SIGINT destroys everything (QPs before the SRQ, CQ and PD, the context last) and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys


def _stop(signum, frame):
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("device")
    parser.add_argument("--rc", type=int, default=1, help="RC QPs left in RESET (default 1)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop)

    try:  # rdma-core 50 and later; 59 dropped pyverbs.enums, and 65 (Cython 3.1) flat names
        from pyverbs.libibverbs_enums import ibv_access_flags, ibv_qp_type
    except ImportError:  # rdma-core 33 to 49: the same classes in pyverbs.enums
        from pyverbs.enums import ibv_access_flags, ibv_qp_type
    from pyverbs.cq import CQ
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr

    owned = []  # destroyed in reverse order of creation

    def keep(obj):
        owned.append(obj)
        return obj

    try:
        ctx = keep(Context(name=args.device))
        pd = keep(PD(ctx))
        cq = keep(CQ(ctx, 64))
        keep(
            MR(
                pd,
                4096,
                ibv_access_flags.IBV_ACCESS_LOCAL_WRITE | ibv_access_flags.IBV_ACCESS_REMOTE_WRITE,
            )
        )
        srq = keep(SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=1))))

        def qp(kind, attr=None, with_srq=False):
            cap = QPCap(
                max_send_wr=2, max_recv_wr=0 if with_srq else 2, max_send_sge=1, max_recv_sge=1
            )
            init = QPInitAttr(qp_type=kind, scq=cq, rcq=cq, cap=cap, srq=srq if with_srq else None)
            # With a QPAttr pyverbs moves a UD QP to RTS and an RC QP to INIT.
            return keep(QP(pd, init, attr) if attr is not None else QP(pd, init))

        lqpns = {
            "ud_rts": qp(ibv_qp_type.IBV_QPT_UD, QPAttr(port_num=1)).qp_num,
            "rc_init": qp(ibv_qp_type.IBV_QPT_RC, QPAttr(port_num=1)).qp_num,
            "rc_srq": qp(ibv_qp_type.IBV_QPT_RC, with_srq=True).qp_num,
            "rc_reset": [qp(ibv_qp_type.IBV_QPT_RC).qp_num for _ in range(args.rc)],
        }
        print(json.dumps({"pid": os.getpid(), "device": args.device, "lqpns": lqpns}), flush=True)
        sys.stdin.read()
    except KeyboardInterrupt:
        pass
    finally:
        for obj in reversed(owned):
            obj.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""doctor's GPUDirect RDMA line: on a host with GPUs, whether the GPUs this end's RDMA device
is closest to can use it for GPUDirect RDMA (ibtool.model.topo's judgement, as `ibtool topo`
shows it whole). This end's side only: a peer tells none of it."""

from __future__ import annotations

from ibtool.model.doctor import Finding, Verdict
from ibtool.model.topo import FAIL, OK, UNKNOWN, WARN, judge_gpudirect

_VERDICT = {OK: Verdict.PASS, WARN: Verdict.WARN, UNKNOWN: Verdict.WARN, FAIL: Verdict.FAIL}


def gpudirect(host, device: str) -> Finding | None:
    """The finding, or None on a host without GPUs (the checklist stays as it was there)."""
    topo = host.topology(gid_indexes=False)
    if not topo.gpus:
        return None
    served = [g for g in topo.gpus if any(n.name == device for n in topo.closest(g)[1])]
    if not served:
        closest = sorted({n.name for g in topo.gpus for n in topo.closest(g)[1]})
        said = f"{device} is no GPU's closest RDMA device"
        said += f" (theirs: {', '.join(closest)})" if closest else ""
        return Finding("gpudirect", Verdict.SKIP, said)
    found = judge_gpudirect(topo, host.gpudirect(topo), only=device)
    verdict = Verdict.worst(_VERDICT[f.status] for f in found)
    gpus = ", ".join(f"{g.name} {topo.closest(g)[0]}" for g in served)
    wrong = [f for f in found if f.status != OK]
    if not wrong:
        registered = next((f.said for f in found if f.subject == "registration"), None)
        said = f"{gpus}: ready" + (f", {registered}" if registered else "")
        return Finding("gpudirect", verdict, said)
    said = "; ".join(dict.fromkeys(f.said for f in wrong))  # each thing once, for every GPU
    return Finding(
        "gpudirect", verdict, f"{gpus}: {said}", next((f.fix for f in wrong if f.fix), None)
    )

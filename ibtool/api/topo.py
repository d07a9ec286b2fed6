"""GPUs and RDMA devices: the PCIe between them (distances in `nvidia-smi topo -m`'s terms),
each GPU's closest RDMA device, NCCL's environment, and their text and JSON (view). The facts
are the Host's: ``host.topology()``."""

from __future__ import annotations

from ibtool.model.topo import (
    DEFAULT_ROUTE_PROBE,
    DISTANCES,
    GdrFinding,
    Gpu,
    GpuDirectFacts,
    NcclEnvironment,
    Nic,
    NicPort,
    PciFunction,
    Topology,
    distance,
    judge_gpudirect,
    nccl_environment,
)
from ibtool.views import topo as view

__all__ = [
    "DEFAULT_ROUTE_PROBE",
    "DISTANCES",
    "Gpu",
    "NcclEnvironment",
    "Nic",
    "NicPort",
    "PciFunction",
    "Topology",
    "GdrFinding",
    "GpuDirectFacts",
    "distance",
    "judge_gpudirect",
    "nccl_environment",
    "view",
]

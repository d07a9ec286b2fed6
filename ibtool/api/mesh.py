"""`ibtool mesh`: the run (Options, mesh), its engines (ClusterShell, srun, local), the agent a
node runs (agent_main, PortChoice), the rails' map and the listener's address, the cable the
failing pairs have in common on InfiniBand (name_cables), the last mesh saved (last_path,
save_last), its text and heat map (view) and plot."""

from __future__ import annotations

from ibtool.mesh.agent import PortChoice
from ibtool.mesh.agent import main as agent_main
from ibtool.mesh.cables import name_cables
from ibtool.mesh.channel import parse_listen
from ibtool.mesh.engines import ClusterShellEngine, LocalEngine, SrunEngine, slurm_overlap
from ibtool.mesh.last import default_path as last_path
from ibtool.mesh.last import save as save_last
from ibtool.mesh.rails import parse_map
from ibtool.mesh.run import Options, mesh
from ibtool.views import mesh as view
from ibtool.views.mesh_plot import plot
from ibtool.views.mesh_plot import require as require_plot

__all__ = [
    "ClusterShellEngine",
    "LocalEngine",
    "Options",
    "PortChoice",
    "SrunEngine",
    "agent_main",
    "last_path",
    "mesh",
    "name_cables",
    "parse_listen",
    "parse_map",
    "plot",
    "require_plot",
    "save_last",
    "slurm_overlap",
    "view",
]

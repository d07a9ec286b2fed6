"""`ibtool mesh`: an RDMA ping mesh over many nodes and rails, fanned out through an engine the
cluster already runs (ClusterShell, Slurm), and the analysis that names the bad one.

- schedule: who pings whom, round by round (shifted rounds)
- protocol: the lines the coordinator and its agents exchange, checked
- agent: what runs on each node for the length of one mesh
- engines: ClusterShell, srun, local: start the agents with their joins, what each says
  before it joins, close
- channel: the agents' way back: the coordinator's listener, their joins, their connections
- run: the coordinator (rounds as a barrier, every node's faults its own)
- analysis: baselines, each pair's health, the verdicts
- cables: on InfiniBand, the cable the failing pairs' routes have in common (the subnet
  walked through the Host)
- last: the last mesh that ran on this node, kept for the dashboard

May import ibtool.rdma, ibtool.host, ibtool.views, ibtool.model, ibtool.errors and
ibtool.argtypes (and ClusterShell, inside the engine that uses it); never ibtool.sources (the
Host reads them), nor ibtool.doctor, its sibling.
"""

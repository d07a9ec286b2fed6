"""`ibtool doctor [PEER]`: why two hosts do not talk over RDMA, or are slow.

    facts    this end's Facts, read through the Host (and what a ping server tells a doctor;
             with --pid, the job's process, Host.read_process)
    link     an Ethernet netdev's speed and supported link modes (the ethtool ioctl)
    checks   the checklist: each check a Finding from this end's facts and the peer's
    ib       InfiniBand: the SM, both ends' cables and the LID route, asked with MADs through
             the Host, and their checks
    probe    the active probe at the end: a ping of each RDMA operation along the path
    run      a doctor run: the port, both ends' facts, the checks, the probe

May import ibtool.rdma, ibtool.host, ibtool.views, ibtool.model, ibtool.errors and
ibtool.argtypes; never ibtool.sources (the Host reads them), nor ibtool.mesh, its sibling.
"""

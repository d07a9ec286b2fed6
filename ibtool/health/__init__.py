"""Health: the checks' runs and their Nagios/JSON output, the config file (health.toml), the
state a check keeps between runs, the node_exporter textfile, Slurm's node drain.

    run       run the registered checks, the verdict, Nagios and JSON output
    config    health.toml, parsed strictly: thresholds, the checks' own tables
    state     the state file: what each check kept, by boot
    textfile  the metric families of the collectors, written atomically as a .prom file
    files     health.toml and the state read only as regular files, within a bound
    slurm     drain and resume this node in Slurm, with the reason

May import ibtool.plugin (to run what the plugins registered), ibtool.snapshot, ibtool.host,
ibtool.views, ibtool.model and ibtool.errors; never ibtool.live, ibtool.tui, ibtool.api, the
data path (ibtool.rdma) or ibtool.sources (the Host reads them).
"""

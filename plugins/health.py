"""`ibtool health`: the node check cron, Nagios/Icinga, Prometheus and Slurm run on every node.

The checks are every plugin's (ibtool_health_checks); this command gives them the
configuration and what they kept at the last run, and writes the report for the engine: a
Nagios plugin's output and exit code, JSON, a node_exporter textfile.
"""

from __future__ import annotations

import time

from ibtool.api import IbtoolError, Invocation, Status, UsageError, hookimpl, number

LOCK_WAIT = 30.0
# An hour bounds both: a lock held longer is a run that hangs (cron has started 60 more), and
# a poll once an hour is as slow as a Prometheus scrape that still means something. Below a
# second the exporter would spend its core polling sysfs for scrapes that come every 15 s.
LOCK_WAIT_MAX = 3600.0
INTERVAL_MIN, INTERVAL_MAX = 1.0, 3600.0


def configure(parser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="what this node should look like (default /etc/ibtool/health.toml, if it exists)",
    )
    state = parser.add_mutually_exclusive_group()
    state.add_argument(
        "--state",
        metavar="FILE",
        help="the counter baselines between runs (default /var/lib/ibtool/health.json for root, "
        "$XDG_STATE_HOME/ibtool/health.json otherwise; none under --root or --snapshot)",
    )
    state.add_argument(
        "--no-state", action="store_true", help="keep no state: no counter deltas, no flaps"
    )
    parser.add_argument(
        "--lock-wait",
        type=number(float, 0, LOCK_WAIT_MAX, unit="seconds"),
        default=LOCK_WAIT,
        metavar="SECONDS",
        help=f"how long to wait for another run holding the state (default {LOCK_WAIT:g}, "
        f"at most {LOCK_WAIT_MAX:g})",
    )
    parser.add_argument(
        "--check",
        action="append",
        default=[],
        metavar="NAME[,NAME]",
        help="run only these checks (see --list)",
    )
    _add_skip(parser)
    parser.add_argument(
        "--datapath",
        action="store_true",
        help="also move data: the checks that run RDMA operations (loopback, ping to peers)",
    )
    parser.add_argument(
        "--textfile",
        metavar="PATH.prom",
        help="also write the results and every metric for node_exporter's textfile collector",
    )
    parser.add_argument(
        "--slurm-drain",
        action="store_true",
        help="drain this Slurm node when CRITICAL; resume it when OK again if ibtool drained it",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="list every result: above 50, the OK ones are otherwise counted, not listed",
    )
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument(
        "--print-nhc",
        action="store_true",
        help="print the LBNL NHC check file (check_ibtool) and exit",
    )


def _add_skip(parser) -> None:
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="NAME[,NAME]",
        help="health checks not to run; may be repeated",
    )


def _names(values: list[str]) -> list[str]:
    return [n for v in values for n in v.split(",") if n]


def _state_path(inv: Invocation) -> str | None:
    from ibtool.api import health as healthstate

    if inv.args.no_state:
        return None
    if inv.args.state:
        return inv.args.state
    if inv.root != "/" or inv.snapshot is not None:
        return None  # a capture has no last run
    return healthstate.state_path()


def _report(inv: Invocation, checks: dict, config):
    """One poll of the Engine on the invocation's host: the checks, with their state file."""
    from ibtool.api import health as healthstate
    from ibtool.api.live import Engine, Hosts

    path = _state_path(inv)
    engine = Engine(
        Hosts(lambda: inv.host, live=False),
        checks=checks,
        config=config,
        state=None if path is None else healthstate.StateFile(path),
        lock_wait=inv.args.lock_wait,
        datapath=inv.args.datapath,
        ports=False,
        counters=False,
        warn=inv.warn,
    )
    return engine.poll().report


def _capture(inv: Invocation) -> str | None:
    """What the run reads instead of this host (--root DIR, --snapshot FILE), or None."""
    if inv.snapshot is not None:
        return f"--snapshot {inv.snapshot}"
    return f"--root {inv.root}" if inv.root != "/" else None


def _counter_names(inv: Invocation):
    """The host's counter names, for a threshold naming a driver counter ibtool does not know."""
    return lambda: {s.name for s in inv.host.counters()}


def _load_config(inv: Invocation, checks: dict | None = None):
    from ibtool.api.health import load_config

    return load_config(inv.args.config, _counter_names(inv), checks)


def _list(inv: Invocation, checks: dict) -> None:
    described = {
        name: " ".join((check.__doc__ or "").strip().split("\n\n")[0].split())
        for name, check in checks.items()
    }
    if inv.json:
        inv.emit_json([{"name": n, "description": d} for n, d in described.items()])
        return
    for name, doc in described.items():
        inv.print(f"{name}: {doc}")


def run(inv: Invocation) -> int:
    from ibtool.api import health, health_checks
    from ibtool.api.health import select_checks

    if inv.args.print_nhc:
        from importlib import resources

        inv.out.write(resources.files("ibtool").joinpath("data/ibtool.nhc").read_text())
        return 0
    capture = _capture(inv)
    if inv.args.slurm_drain and capture is not None:
        # The results describe the host the capture came from; draining this node (the one
        # running ibtool) because of them would act on another host's data.
        raise UsageError(
            f"--slurm-drain drains this host's Slurm node; {capture} is not this host",
            "drop --slurm-drain, or run on the node itself",
        )
    try:
        checks = health_checks(inv.plugins, inv.warn)
        if inv.args.list:
            _list(inv, checks)
            return 0
        config = _load_config(inv, checks)
        wanted, skipped = _names(inv.args.check), _names(inv.args.skip)
        report = _report(inv, select_checks(checks, wanted, skipped, config, inv.warn), config)
    except IbtoolError as e:
        hint = f" (hint: {e.hint})" if e.hint else ""
        report = health.failed(e.message + hint, time.time())
        if inv.args.textfile:
            _textfile(inv, report, collect=False)
        if inv.json:
            inv.emit_json(health.as_json(report))
        else:
            inv.out.write(health.unknown(e.message + hint))
        return int(Status.UNKNOWN)
    except Exception as e:
        # A bug is still the CLI's internal error (exit 70, --debug for the traceback), but
        # node_exporter must not go on serving the last run's OK as this run's: the textfile
        # says UNKNOWN, and the exception's type (its message may quote anything).
        if inv.args.textfile:
            failure = health.failed(f"internal error: {type(e).__name__}", time.time())
            _textfile(inv, failure, collect=False)
        raise
    if inv.args.textfile:
        _textfile(inv, report)
    if inv.args.slurm_drain:
        _slurm(report)
    if inv.json:
        inv.emit_json(health.as_json(report))
    else:
        inv.out.write(health.nagios(report, inv.warn, verbose=inv.args.verbose))
    return int(report.status)


def _slurm(report) -> None:
    """Drains this node when CRITICAL, resumes it when OK or WARNING if ibtool drained it;
    what it did is a note, a failure a fault of the run."""
    from ibtool.api.health import apply_slurm

    if report.status == Status.UNKNOWN:
        return  # a run that could not decide neither drains nor resumes
    try:
        done = apply_slurm(report.status == Status.CRITICAL, report.summary)
    except IbtoolError as e:
        hint = f" (hint: {e.hint})" if e.hint else ""
        report.fault(f"slurm: {e.message}{hint}")
        return
    if done:
        report.notes.append(done)


def _textfile(inv: Invocation, report, collect: bool = True) -> None:
    """The report and every metric in the textfile; a textfile that cannot be written is an
    UNKNOWN note of the report, whose results are still printed. A run that failed before its
    checks (`collect` false) writes its UNKNOWN status and why, without the host's metrics:
    node_exporter would otherwise serve the last good run's status as this run's."""
    from ibtool.api import health

    try:
        families = health.status_families(report)
        if collect:
            families += health.collected(inv.plugins, inv.host, inv.warn)
        health.write_textfile(inv.args.textfile, families)
    except IbtoolError as e:
        hint = f" (hint: {e.hint})" if e.hint else ""
        if collect:
            report.fault(f"{e.message}{hint}")
        else:
            inv.warn(f"{e.message}{hint}")


# -- the exporter ---------------------------------------------------------------------------------


def configure_exporter(parser) -> None:
    from ibtool.api.exporter import DEFAULT_PORT, MAX_REQUESTS, MAX_REQUESTS_MAX

    parser.add_argument(
        "--listen",
        default=f":{DEFAULT_PORT}",
        metavar="ADDR:PORT",
        help=f"where to serve /metrics (default :{DEFAULT_PORT}, every address)",
    )
    parser.add_argument(
        "--interval",
        type=number(float, INTERVAL_MIN, INTERVAL_MAX, unit="seconds"),
        default=15.0,
        metavar="SECONDS",
        help=f"time between two polls of the host (default 15, {INTERVAL_MIN:g} to "
        f"{INTERVAL_MAX:g}); scrapes get the latest",
    )
    parser.add_argument("--config", metavar="FILE", help="as for ibtool health")
    _add_skip(parser)
    parser.add_argument(
        "--web.max-requests",
        dest="web_max_requests",
        type=number(int, 1, MAX_REQUESTS_MAX),
        default=MAX_REQUESTS,
        metavar="N",
        help=f"requests answered at once; over it, 503 (default {MAX_REQUESTS}, "
        f"at most {MAX_REQUESTS_MAX})",
    )
    parser.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS and basic auth, in the Prometheus exporter-toolkit's format (YAML)",
    )


def run_exporter(inv: Invocation) -> None:
    from ibtool.api import exporter, health_checks
    from ibtool.api.health import select_checks

    listen = exporter.parse_listen(inv.args.listen)
    web = None
    if inv.args.web_config_file is not None:
        from ibtool.api.exporter import WebConfigWatcher

        web = WebConfigWatcher(inv.args.web_config_file, inv.warn)
    config = _load_config(inv)
    checks = health_checks(inv.plugins, inv.warn)
    config.check_names(checks)
    checks = select_checks(checks, [], _names(inv.args.skip), config, inv.warn)
    scheme = "https" if web is not None and web.current().tls else "http"
    faults = exporter.Faults(inv.warn)

    def ready(bound) -> None:
        host, port = bound[0], bound[1]
        inv.print(f"serving {scheme}://{'[' + host + ']' if ':' in host else host}:{port}/metrics")
        inv.out.flush()

    exporter.serve(
        listen,
        exporter.poller(inv, checks, config, faults.warn),
        inv.args.interval,
        inv.warn,
        ready=ready,
        max_requests=inv.args.web_max_requests,
        web=web,
        faults=faults,
    )


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "health",
        run,
        help="check this node's RDMA health (Nagios output and exit codes, JSON, textfile)",
        configure=configure,
    )
    cli.add(
        "exporter",
        run_exporter,
        help="serve the health results and every counter to Prometheus over HTTP",
        configure=configure_exporter,
    )

"""`ibtool health`: the node check cron, Nagios/Icinga, Prometheus and Slurm run on every node.

The checks are every plugin's (ibtool_health_checks); this command gives them the
configuration and what they kept at the last run, and writes the report for the engine: a
Nagios plugin's output and exit code, JSON, a node_exporter textfile.
"""

from __future__ import annotations

import time

from ibtool.api import IbtoolError, Invocation, UsageError, hookimpl, number

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
    from ibtool.api import Status, health, health_checks
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
    from ibtool.api import Status
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
    from ibtool.api.exporter import (
        DEFAULT_PORT,
        FABRIC_INTERVAL,
        FABRIC_INTERVAL_MAX,
        FABRIC_INTERVAL_MIN,
        FABRIC_MADS,
        FABRIC_MADS_MAX,
        FABRIC_MADS_MIN,
        MAX_REQUESTS,
        MAX_REQUESTS_MAX,
    )

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
    parser.add_argument(
        "--fabric",
        action="store_true",
        help="also scan the InfiniBand fabric on its own interval and serve every port's "
        "state, width, speed and PMA counters (ibtool_fabric_*)",
    )
    parser.add_argument(
        "--fabric-interval",
        type=number(float, FABRIC_INTERVAL_MIN, FABRIC_INTERVAL_MAX, unit="seconds"),
        metavar="SECONDS",
        help=f"time between two scans of the fabric (default {FABRIC_INTERVAL:g}, "
        f"{FABRIC_INTERVAL_MIN:g} to {FABRIC_INTERVAL_MAX:g})",
    )
    parser.add_argument(
        "--fabric-via",
        metavar="DEV[/PORT]",
        help="the local InfiniBand port to scan through (default: the first active one)",
    )
    parser.add_argument(
        "--fabric-mads",
        type=number(int, FABRIC_MADS_MIN, FABRIC_MADS_MAX),
        metavar="N",
        help=f"PMA queries a second the scan may send (default {FABRIC_MADS}, "
        f"{FABRIC_MADS_MIN} to {FABRIC_MADS_MAX})",
    )
    parser.add_argument(
        "--fabric-timeout",
        type=number(int, 1, 60000),
        metavar="MS",
        help="each MAD's timeout in milliseconds (default 200)",
    )
    parser.add_argument(
        "--fabric-retries",
        type=number(int, 0, 20),
        metavar="N",
        help="retries of a MAD that timed out (default 3)",
    )


FABRIC_OPTIONS = ("interval", "via", "mads", "timeout", "retries")


def _fabric_watch(inv: Invocation):
    """The FabricWatch --fabric asks for (None without it; a --fabric-* option without it is a
    usage error)."""
    from ibtool.api.exporter import FABRIC_INTERVAL, FABRIC_MADS, fabric_watch
    from ibtool.api.fabric import Bounds

    given = [n for n in FABRIC_OPTIONS if getattr(inv.args, f"fabric_{n}") is not None]
    if not inv.args.fabric:
        if given:
            raise UsageError(f"--fabric-{given[0]} needs --fabric")
        return None
    a = inv.args
    bounds = Bounds(
        timeout_ms=a.fabric_timeout if a.fabric_timeout is not None else Bounds.timeout_ms,
        retries=a.fabric_retries if a.fabric_retries is not None else Bounds.retries,
    )
    return fabric_watch(
        inv,
        inv.warn,
        interval=a.fabric_interval if a.fabric_interval is not None else FABRIC_INTERVAL,
        bounds=bounds,
        via=a.fabric_via,
        mads_per_second=a.fabric_mads if a.fabric_mads is not None else FABRIC_MADS,
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
    watch = _fabric_watch(inv)

    def ready(bound) -> None:
        host, port = bound[0], bound[1]
        inv.print(f"serving {scheme}://{'[' + host + ']' if ':' in host else host}:{port}/metrics")
        inv.out.flush()

    try:
        exporter.serve(
            listen,
            exporter.poller(inv, checks, config, faults.warn),
            inv.args.interval,
            inv.warn,
            ready=ready,
            max_requests=inv.args.web_max_requests,
            web=web,
            faults=faults,
            fabric=exporter.FabricSeries(watch, inv.warn) if watch is not None else None,
        )  # the FabricSeries starts the watch after the first poll
    finally:
        if watch is not None:
            watch.stop()


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

# The systemd units of systemd/ checked under systemd as init: `testbed --release NAME units`.
# Sourced by tests/testbed/testbed (cmd_units, on the host) and by the guest's command
# (units_guest, in the VM; guest.sh has brought rxe0 up on veth0 by then). Defines functions
# only.
#
# The guest boots the release's root with virtme-ng's --systemd (systemd as PID 1; guest.sh runs
# from virtme-ng's serial-getty@ service, so systemctl there talks to the real manager), then:
# the units as they are in this checkout go to /run/systemd/system (ahead of the package's in
# /usr/lib/systemd/system: the package may be older), `systemd-analyze verify` with the release's
# systemd, the exporter started and scraped, its process' uid, capabilities, seccomp and private
# /dev read from /proc, its series compared with a root run's of the same host (a privilege the
# unit lacks shows as a series missing), the health check's condition, sandbox, textfile and
# state, the timer listed and seen to fire, both enabled (--runtime: the root is read-only),
# and the exporter through TLS with its key handed over as a credential (ibtool-exporter(8)).
# The host then runs promtool on what the guest saved. Output: one "ok"/"FAIL" line per check.

cmd_units() {
    [ $# -eq 0 ] || die "usage: testbed --release NAME units"
    [ -n "$RELEASE" ] || die "units needs --release NAME: a Debian root with systemd (e.g. sid)"
    # The VM runs about 4 minutes under TCG (systemd's boot ~25 s, the guest script from ~55 s
    # of uptime, the timer's wait up to 80 s); the default 1800 s bound is the suites'.
    RUN_TIMEOUT=${IBTOOL_TESTBED_TIMEOUT:-900}
    # testbed's boot() as it is, with one change to the VM's arguments: systemd as init.
    eval "units_vm_args_for_plain() $(declare -f vm_args_for | tail -n +2)"
    vm_args_for() {
        units_vm_args_for_plain "$@"
        VM_ARGS=(--systemd "${VM_ARGS[@]}")
    }
    local rc=0
    boot bash -c '. tests/testbed/units.sh && units_guest' || rc=$?
    # The textfile and the scrape, as the guest saved them: checked with this host's promtool.
    local f
    if command -v promtool >/dev/null; then
        for f in ibtool.prom exporter.metrics; do
            if [ ! -s "$OUT/$f" ]; then
                echo "FAIL: promtool: the guest saved no $f"; rc=1
            elif promtool check metrics < "$OUT/$f" > "$OUT/$f.promtool" 2>&1; then
                echo "ok: promtool check metrics $f ($(grep -c '^ibtool_' "$OUT/$f") ibtool_ samples)"
            else
                echo "FAIL: promtool check metrics $f:"; sed 's/^/    /' "$OUT/$f.promtool"; rc=1
            fi
        done
    else
        echo "skip: promtool (no promtool on this host: apt-get install prometheus)"
    fi
    if [ "$rc" -eq 0 ]; then
        say "units: every check passed (results in $OUT)"
    else
        say "units: FAILED (exit $rc; results in $OUT)"
    fi
    return "$rc"
}

# -- in the guest ---------------------------------------------------------------------------

UNITS_FAILS=0
units_ok() { echo "ok: $*"; }
units_fail() { echo "FAIL: $*"; UNITS_FAILS=$((UNITS_FAILS + 1)); }
# units_check DESCRIPTION CMD...: ok when CMD succeeds.
units_check() {
    local what=$1; shift
    if "$@"; then units_ok "$what"; else units_fail "$what"; fi
}
units_fatal() { echo "FAIL: $*"; echo "units: stopped at the first fatal failure" >&2; exit 1; }

# units_scrape URL FILE [POLLS]: the metrics at URL into FILE once the exporter has polled the
# host (POLLS times, default 1: it answers at once, with no host series before its first
# poll), retried for up to 120 s.
UNITS_CURL=()   # more curl options (TLS)
units_scrape() {
    local i
    for i in $(seq 120); do
        if curl -fsS --max-time 10 "${UNITS_CURL[@]}" "$1" -o "$2" 2>/dev/null \
            && units_is "$(units_value "$2" ibtool_exporter_polls_total)" "${3:-1}" -ge; then
            return 0
        fi
        sleep 1
    done
    return 1
}

# units_series FILE: the ibtool_ series (name and labels, no value) of a scrape, sorted; not the
# exporter's own (its polls, HTTP server) nor the health run's time, which differ between two
# processes.
units_series() {
    grep '^ibtool_' "$1" | sed 's/ [^ ]*$//' \
        | grep -v -e '^ibtool_exporter_' -e '^ibtool_build_info' -e '_timestamp_seconds' | sort -u
}

# units_value FILE SERIES: the value of the series whose name and labels are SERIES.
units_value() { awk -v s="$2" '$1 == s {print $2}' "$1"; }

# units_is VALUE N [-ge]: VALUE is the number N ("4", "4.0"), or at least N.
units_is() {
    [ -n "$1" ] && awk -v v="$1" -v n="$2" -v ge="${3:-}" \
        'BEGIN {exit !(ge == "-ge" ? v + 0 >= n + 0 : v + 0 == n + 0)}'
}

units_proc_status() { grep -E "^($2):" "/proc/$1/status" | awk '{print $2}'; }

# units_bisect UNIT CMD...: when UNIT's run failed, CMD run in transient units with UNIT's
# sandbox (its [Service] settings from CapabilityBoundingSet= on), whole, then without one
# setting at a time: which setting its failure needs, and what CMD says under the whole sandbox.
units_bisect() {
    local unit=$1; shift
    local props=() args=() p i line skip
    while IFS= read -r line; do
        props+=("$line")
    done < <(sed -n '/^CapabilityBoundingSet=/,$p' "/run/systemd/system/$unit" \
        | grep -E '^[A-Z][A-Za-z]+=' | grep -v -e '^StateDirectory' -e '^ReadWritePaths' -e '^User=' \
            -e '^StateDirectoryMode' -e '^UMask' -e '^CacheDirectory')
    echo "info: for comparison, root without a sandbox (no systemd-run): ${*: -4}"
    timeout 120 "${@: -4}" 2>&1 | head -n 30 | sed 's/^/    /'
    echo "info: $unit under its sandbox in a transient unit: $*"
    args=(); for p in "${props[@]}"; do args+=(-p "$p"); done
    timeout 120 systemd-run --wait --pipe --quiet "${args[@]}" "$@" 2>&1 | head -n 30 | sed 's/^/    /'
    echo "info: exit ${PIPESTATUS[0]}"
    for i in "${!props[@]}"; do
        args=()
        for skip in "${!props[@]}"; do
            [ "$skip" = "$i" ] || args+=(-p "${props[$skip]}")
        done
        if timeout 120 systemd-run --wait --pipe --quiet "${args[@]}" "$@" >/dev/null 2>&1; then
            echo "info: without ${props[$i]}: exit 0"
        fi
    done
}

# units_tls SRC OUT: the exporter through TLS as ibtool-exporter(8) says to set it up for the
# unit's dynamic user: the key root's (0600), handed over with LoadCredential= (a drop-in), and
# ARGS in the defaults file naming the web configuration in the credentials directory.
units_tls() {
    local src=$1 out=$2 d=/run/units-tls n
    if ! /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
        echo "skip: the exporter through TLS (no python3-yaml in this root)"
        return 0
    fi
    if [ ! -f /etc/default/ibtool-exporter ]; then
        echo "skip: the exporter through TLS (no /etc/default/ibtool-exporter to bind over)"
        return 0
    fi
    mkdir -p "$d" && chmod 700 "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout "$d/exporter.key" \
        -out "$d/exporter.crt" -subj /CN=localhost -addext subjectAltName=DNS:localhost >/dev/null 2>&1 \
        || { units_fail "openssl could not make a test certificate"; return 0; }
    chmod 600 "$d/exporter.key"
    printf 'tls_server_config:\n  cert_file: exporter.crt\n  key_file: exporter.key\n' > "$d/web-config.yml"
    sed 's|^ARGS=""$|ARGS="--web.config.file=/run/credentials/ibtool-exporter.service/web-config.yml"|' \
        "$src/ibtool-exporter.default" > "$d/default"
    grep -q '^ARGS="--web.config.file' "$d/default" || { units_fail "no ARGS=\"\" line in the defaults file"; return 0; }
    umount /etc/default/ibtool-exporter 2>/dev/null
    mount --bind "$d/default" /etc/default/ibtool-exporter
    mkdir -p /run/systemd/system/ibtool-exporter.service.d
    printf '[Service]\nLoadCredential=web-config.yml:%s\nLoadCredential=exporter.crt:%s\nLoadCredential=exporter.key:%s\n' \
        "$d/web-config.yml" "$d/exporter.crt" "$d/exporter.key" \
        > /run/systemd/system/ibtool-exporter.service.d/zz-units-tls.conf
    systemctl daemon-reload
    systemctl restart ibtool-exporter.service
    UNITS_CURL=(--cacert "$d/exporter.crt")
    if units_scrape https://localhost:9877/metrics "$out/exporter-tls.metrics"; then
        n=$(grep -c "^ibtool_port_state_id{device=" "$out/exporter-tls.metrics")
        units_check "TLS: the unit serves https://localhost:9877/metrics with its key from a credential ($n ports)" test "$n" -gt 0
    else
        units_fail "TLS: no answer on https://localhost:9877/metrics"
        journalctl -u ibtool-exporter.service --no-pager -o cat | tail -n 8 | sed 's/^/    /'
    fi
    UNITS_CURL=()
    units_check "TLS: plain http is refused" sh -c '! curl -fsS --max-time 10 -o /dev/null http://127.0.0.1:9877/metrics 2>/dev/null'
    n=$(stat -c '%U %a' "$d/exporter.key")
    units_check "TLS: the key on disk stays root's, mode 600 ($n)" test "$n" = "root 600"
    rm -f /run/systemd/system/ibtool-exporter.service.d/zz-units-tls.conf
    umount /etc/default/ibtool-exporter
    mount --bind "$src/ibtool-exporter.default" /etc/default/ibtool-exporter
    systemctl daemon-reload
}

units_guest() {
    local out=$IBTOOL_TB_OUT src=$PWD/systemd dev=$IBTOOL_TB_DEVICE
    local unit t0 pid uid n rc
    [ "$(cat /proc/1/comm)" = systemd ] || units_fatal "PID 1 is $(cat /proc/1/comm), not systemd"
    units_ok "PID 1 is systemd: $(systemctl --version | head -n 1)"
    # The manager's boot as systemd measured it (kernel to default target).
    state=$(timeout 120 systemctl is-system-running --wait 2>/dev/null)
    echo "info: system state: $state; $(systemd-analyze time 2>&1 | head -n 1)"
    systemctl --failed --no-legend --plain 2>/dev/null | sed 's/^/info: failed unit: /'

    # -- the units as this checkout has them ---------------------------------------------------
    for unit in ibtool-exporter.service ibtool-health.service ibtool-health.timer; do
        [ -f "$src/$unit" ] || units_fatal "no $src/$unit"
        cp "$src/$unit" /run/systemd/system/ || units_fatal "cannot install $unit in /run/systemd/system"
        if cmp -s "$src/$unit" "/usr/lib/systemd/system/$unit"; then
            echo "info: the package's $unit is this checkout's"
        else
            echo "info: the package's $unit differs from this checkout's (or is missing): testing the checkout's"
        fi
    done
    # The defaults file: the checkout's, over the package's (the root is read-only: a bind mount).
    if [ -f /etc/default/ibtool-exporter ]; then
        mount --bind "$src/ibtool-exporter.default" /etc/default/ibtool-exporter \
            || units_fatal "cannot bind the defaults file over /etc/default/ibtool-exporter"
        echo "info: /etc/default/ibtool-exporter is the checkout's"
    else
        echo "info: no /etc/default/ibtool-exporter (the service runs without it: EnvironmentFile=-)"
    fi
    if [ ! -x /usr/bin/ibtool ]; then
        # Not the package's root: the venv's ibtool through a drop-in, in this guest only.
        for unit in ibtool-exporter ibtool-health; do
            mkdir -p "/run/systemd/system/$unit.service.d"
            sed -n 's#^ExecStart=/usr/bin/ibtool#ExecStart=/opt/ibtool/venv/bin/ibtool#p' \
                "$src/$unit.service" | { echo "[Service]"; echo "ExecStart="; cat; } \
                > "/run/systemd/system/$unit.service.d/zz-testbed-venv.conf"
        done
        echo "info: no /usr/bin/ibtool: ExecStart through /opt/ibtool/venv/bin/ibtool (drop-in)"
    fi
    # State and the textfile directory need a writable /var/lib: a tmpfs overlay on the
    # read-only root.
    if ! touch /var/lib/.units-probe 2>/dev/null; then
        mkdir -p /run/units-var/upper /run/units-var/work
        mount -t overlay units-var -o lowerdir=/var/lib,upperdir=/run/units-var/upper,workdir=/run/units-var/work /var/lib \
            || units_fatal "cannot make /var/lib writable"
    fi
    rm -f /var/lib/.units-probe
    systemctl daemon-reload || units_fatal "systemctl daemon-reload failed"

    t0=$(systemd-analyze verify /run/systemd/system/ibtool-exporter.service \
        /run/systemd/system/ibtool-health.service /run/systemd/system/ibtool-health.timer 2>&1)
    rc=$?
    if [ "$rc" -eq 0 ] && [ -z "$t0" ]; then
        units_ok "systemd-analyze verify (the release's systemd): no error, no warning"
    else
        units_fail "systemd-analyze verify exit $rc:"; echo "$t0" | sed 's/^/    /'
    fi
    systemd-analyze security ibtool-exporter.service > "$out/security-exporter.txt" 2>&1
    systemd-analyze security ibtool-health.service > "$out/security-health.txt" 2>&1
    echo "info: $(grep 'Overall exposure' "$out/security-exporter.txt")"
    echo "info: $(grep 'Overall exposure' "$out/security-health.txt")"

    # -- the exporter --------------------------------------------------------------------------
    t0=$(cut -d' ' -f1 /proc/uptime)
    systemctl start ibtool-exporter.service || units_fail "systemctl start ibtool-exporter.service"
    if units_scrape http://127.0.0.1:9877/metrics "$out/exporter.metrics"; then
        units_ok "ibtool-exporter.service serves :9877/metrics ($(awk -v a="$t0" '{printf "%.0f", $1 - a}' /proc/uptime) s after its start)"
    else
        journalctl -u ibtool-exporter.service --no-pager | tail -n 20 | sed 's/^/    /'
        units_fatal "ibtool-exporter.service does not serve :9877/metrics"
    fi
    units_check "ibtool-exporter.service is active" systemctl is-active -q ibtool-exporter.service
    n=$(units_value "$out/exporter.metrics" "ibtool_port_state_id{device=\"$dev\",port=\"1\"}")
    units_check "the unit's scrape: $dev/1 port state 4 (ACTIVE), got '${n}'" units_is "$n" 4
    n=$(grep -c "^ibtool_hw_statistic_total{device=\"$dev\"" "$out/exporter.metrics")
    units_check "the unit's scrape: $n driver counters of $dev (ibtool_hw_statistic_total)" [ "$n" -gt 0 ]
    n=$(grep -c "^ibtool_port_[a-z_]*_total{device=\"$dev\"" "$out/exporter.metrics")
    units_check "the unit's scrape: $n port counters of $dev" [ "$n" -gt 0 ]
    n=$(units_value "$out/exporter.metrics" ibtool_health_status)
    units_check "the unit's scrape: ibtool_health_status 0 (OK), got '${n}'" units_is "$n" 0
    # What the unit's poller could not read: a warning each, in the journal. None may be left:
    # the VLANs of RoCE netdevs (the testbed has veth0.100), whose /proc/net/vlan/config 8021q
    # makes root's, mode 0600, come from rtnetlink's RTM_GETLINK under the dynamic user.
    n=$(units_value "$out/exporter.metrics" ibtool_exporter_poll_faults_total)
    journalctl -u ibtool-exporter.service --no-pager -o cat | grep 'warning:' | sort -u > "$out/exporter-warnings.txt"
    units_check "the unit's poller could read everything, VLANs included (no warning; poll faults ${n:-missing})" \
        test -n "$n" -a ! -s "$out/exporter-warnings.txt"
    sed 's/^/    /' "$out/exporter-warnings.txt"
    units_check "ibtool_exporter_poll_faults_total 0, got '${n}'" units_is "$n" 0
    if units_scrape http://127.0.0.1:9877/metrics "$out/exporter-2.metrics" 2; then
        n=$(units_value "$out/exporter-2.metrics" ibtool_exporter_poll_errors_total)
        units_check "after $(units_value "$out/exporter-2.metrics" ibtool_exporter_polls_total) polls: ibtool_exporter_poll_errors_total 0, got '${n}'" units_is "$n" 0
    fi
    # The same host read by root without any sandbox: what the unit's restrictions hide from
    # it would be missing from its series (its checks, their subjects, the counters).
    local ibtool=/usr/bin/ibtool
    [ -x "$ibtool" ] || ibtool=/opt/ibtool/venv/bin/ibtool
    "$ibtool" exporter --listen 127.0.0.1:9878 > "$out/root-exporter.log" 2>&1 &
    pid=$!
    units_scrape http://127.0.0.1:9878/metrics "$out/root.metrics" \
        || units_fail "the root exporter did not answer on :9878"
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    units_series "$out/exporter.metrics" > "$out/exporter.series"
    units_series "$out/root.metrics" > "$out/root.series"
    if [ -s "$out/root.series" ] && cmp -s "$out/exporter.series" "$out/root.series"; then
        units_ok "the unit serves the same $(wc -l < "$out/root.series") ibtool series as root unsandboxed"
    else
        units_fail "the unit's series differ from root's (< unit, > root):"
        diff "$out/exporter.series" "$out/root.series" | grep '^[<>]' | head -n 20 | sed 's/^/    /'
        journalctl -u ibtool-exporter.service --no-pager -o cat | tail -n 15 | sed 's/^/    /'
        units_bisect ibtool-exporter.service -p DynamicUser=yes /usr/bin/ibtool health --no-state -v
    fi
    n=$(grep -c '^ibtool_health_subject_status' "$out/exporter.metrics")
    if [ "$n" -eq 0 ]; then
        units_fail "the unit's scrape has no health subject"
    elif grep '^ibtool_health_subject_status' "$out/exporter.metrics" | grep -qv ' 0\(\.0\)\?$'; then
        units_fail "a health subject is not OK under the unit:"
        grep '^ibtool_health_subject_status' "$out/exporter.metrics" | grep -v ' 0\(\.0\)\?$' | sed 's/^/    /'
    else
        units_ok "every health subject is OK under the unit ($n, the system check's uverbs nodes included)"
    fi
    # What the process really runs with.
    pid=$(systemctl show -p MainPID --value ibtool-exporter.service)
    if [ -n "$pid" ] && [ "$pid" != 0 ] && [ -d "/proc/$pid" ]; then
        uid=$(units_proc_status "$pid" Uid)
        units_check "the exporter runs as uid $uid ($(systemctl show -p User --value ibtool-exporter.service), dynamic), not root" \
            test "${uid:-0}" != 0
        n=$(units_proc_status "$pid" CapEff)
        units_check "the exporter's effective capabilities: $n (none)" [ "$n" = 0000000000000000 ]
        n=$(units_proc_status "$pid" CapBnd)
        units_check "the exporter's bounding set: $n (empty)" [ "$n" = 0000000000000000 ]
        n=$(units_proc_status "$pid" NoNewPrivs)
        units_check "the exporter's NoNewPrivs: $n" [ "$n" = 1 ]
        n=$(units_proc_status "$pid" Seccomp)
        units_check "the exporter's seccomp mode: $n (2: filter)" [ "$n" = 2 ]
        units_check "the exporter's /dev is private (no /dev/vda in it)" [ ! -e "/proc/$pid/root/dev/vda" ]
        units_check "the exporter sees /dev/infiniband/$(ls /dev/infiniband | grep uverbs | head -n 1) (bound read-only)" \
            test -e "/proc/$pid/root/dev/infiniband/$(ls /dev/infiniband | grep uverbs | head -n 1)"
        units_check "the exporter's / is read-only (ProtectSystem=strict)" \
            awk '$5 == "/var/lib" || $5 == "/" {if ($6 !~ /^ro/) bad = 1; seen = 1} END {exit bad || !seen}' \
            "/proc/$pid/mountinfo"
    else
        units_fail "ibtool-exporter.service has no main process"
    fi
    systemctl enable --runtime -q ibtool-exporter.service 2>/dev/null
    n=$(systemctl is-enabled ibtool-exporter.service 2>&1)
    units_check "systemctl enable --runtime ibtool-exporter.service: $n" [ "$n" = enabled-runtime ]
    units_tls "$src" "$out"
    systemctl stop ibtool-exporter.service
    n=$(systemctl show -p Result --value ibtool-exporter.service)
    units_check "the exporter stops cleanly (Result=$n)" [ "$n" = success ]

    # -- the health check ----------------------------------------------------------------------
    local prom=/var/lib/prometheus/node-exporter/ibtool.prom
    rm -rf /var/lib/prometheus
    systemctl start ibtool-health.service
    n=$(systemctl show -p ConditionResult --value ibtool-health.service)
    units_check "without node_exporter's textfile directory the run is skipped (ConditionResult=$n), not failed" \
        test "$n" = no
    units_check "and the skipped run is not a failed unit" sh -c '! systemctl is-failed -q ibtool-health.service'
    # What Debian's prometheus-node-exporter makes: root:root 0755.
    install -d -m 0755 -o root -g root /var/lib/prometheus /var/lib/prometheus/node-exporter
    # One run with a probe after it, in the unit's sandbox (a drop-in, removed afterwards): what
    # its processes run with.
    mkdir -p /run/systemd/system/ibtool-health.service.d
    cat > /run/systemd/system/ibtool-health.service.d/zz-units-probe.conf <<'EOF'
[Service]
StandardError=journal
ExecStartPost=/bin/sh -c 'grep -E "^(Uid|CapEff|CapBnd|NoNewPrivs|Seccomp):" /proc/self/status | tr -s "\\t " " " | sed "s/^/probe: /" >&2; for p in /var/lib/ibtool /var/lib/prometheus/node-exporter /var/lib /etc /var/log /opt; do if touch $$p/.units-probe 2>/dev/null; then rm -f $$p/.units-probe; echo "probe: writable $$p" >&2; else echo "probe: read-only $$p" >&2; fi; done; ls /dev/infiniband >/dev/null 2>&1 && echo "probe: sees /dev/infiniband" >&2; test -e /dev/vda || echo "probe: private /dev" >&2'
EOF
    systemctl daemon-reload
    t0=$(date +%s)
    systemctl start ibtool-health.service
    n=$(systemctl show -p Result --value ibtool-health.service)
    units_check "ibtool-health.service runs (Result=$n, exit $(systemctl show -p ExecMainStatus --value ibtool-health.service))" [ "$n" = success ]
    units_check "the health run keeps the plugins' cache in /var/cache/ibtool" \
        sh -c 'ls /var/cache/ibtool/plugins-*.json'
    if [ "$n" != success ]; then
        journalctl -u ibtool-health.service --no-pager -o cat | tail -n 15 | sed 's/^/    /'
        units_bisect ibtool-health.service /usr/bin/ibtool health --no-state -v
    fi
    journalctl -u ibtool-health.service --no-pager -o cat --since "@$t0" | grep '^probe: ' > "$out/health-probe.txt"
    sed 's/^/info: /' "$out/health-probe.txt"
    units_check "the health run is uid 0 without capabilities" \
        grep -qx 'probe: CapEff: 0000000000000000' "$out/health-probe.txt"
    units_check "the health run's bounding set is empty" grep -qx 'probe: CapBnd: 0000000000000000' "$out/health-probe.txt"
    n=$(grep '^probe: writable' "$out/health-probe.txt" | sort | tr '\n' ' ')
    units_check "the health run writes the textfile directory and its state only: $n" \
        test "$n" = "probe: writable /var/lib/ibtool probe: writable /var/lib/prometheus/node-exporter "
    units_check "the health run has a private /dev" grep -qx 'probe: private /dev' "$out/health-probe.txt"
    units_check "the health run sees /dev/infiniband" grep -qx 'probe: sees /dev/infiniband' "$out/health-probe.txt"
    rm -rf /run/systemd/system/ibtool-health.service.d/zz-units-probe.conf
    systemctl daemon-reload
    # The unit as shipped, once more: the second run compares the counters with the first's.
    systemctl start ibtool-health.service
    n=$(systemctl show -p Result --value ibtool-health.service)
    units_check "ibtool-health.service runs again (Result=$n)" [ "$n" = success ]
    units_check "the textfile $prom is there" [ -s "$prom" ]
    cp "$prom" "$out/ibtool.prom" 2>/dev/null
    n=$(stat -c '%U:%G %a' "$prom" 2>/dev/null)
    units_check "the textfile is root's, mode 644 ($n): node_exporter reads it" [ "$n" = "root:root 644" ]
    n=$(ls -a /var/lib/prometheus/node-exporter | grep -c '\.tmp$')
    units_check "no temporary file left in the textfile directory" [ "$n" = 0 ]
    n=$(units_value "$prom" ibtool_health_status)
    units_check "the textfile: ibtool_health_status 0 (OK), got '${n}'" units_is "$n" 0
    n=$(units_value "$prom" "ibtool_port_state_id{device=\"$dev\",port=\"1\"}")
    units_check "the textfile: $dev/1 port state 4 (ACTIVE), got '${n}'" units_is "$n" 4
    units_check "the state /var/lib/ibtool/health.json is kept" [ -s /var/lib/ibtool/health.json ]
    units_check "the health service's stdout is not journaled (StandardOutput=null)" \
        sh -c '! journalctl -u ibtool-health.service --no-pager -o cat | grep -q "^IBTOOL "'

    # -- the timer -----------------------------------------------------------------------------
    systemctl enable --runtime -q ibtool-health.timer 2>/dev/null
    n=$(systemctl is-enabled ibtool-health.timer 2>&1)
    units_check "systemctl enable --runtime ibtool-health.timer: $n" [ "$n" = enabled-runtime ]
    systemctl start ibtool-health.timer
    systemctl list-timers --all --no-pager ibtool-health.timer > "$out/list-timers.txt" 2>&1
    sed 's/^/    /' "$out/list-timers.txt"
    units_check "systemctl list-timers lists ibtool-health.timer activating ibtool-health.service" \
        grep -q 'ibtool-health\.timer *ibtool-health\.service' "$out/list-timers.txt"
    # It fires within a minute and 15 s (OnCalendar=minutely, RandomizedDelaySec=10s, AccuracySec=5s).
    local before after
    before=$(systemctl show -p InvocationID --value ibtool-health.service)
    for _ in $(seq 80); do
        after=$(systemctl show -p InvocationID --value ibtool-health.service)
        [ "$after" != "$before" ] && [ "$(systemctl show -p ActiveState --value ibtool-health.service)" != activating ] && break
        sleep 1
    done
    n=$(systemctl show -p Result --value ibtool-health.service)
    units_check "the timer started ibtool-health.service within 80 s (Result=$n)" \
        test "$after" != "$before" -a "$n" = success
    cp "$prom" "$out/ibtool.prom" 2>/dev/null

    journalctl --no-pager -u ibtool-exporter.service -u ibtool-health.service > "$out/journal.txt" 2>&1
    if [ "$UNITS_FAILS" -eq 0 ]; then
        echo "units: every check in the guest passed"
        return 0
    fi
    echo "units: $UNITS_FAILS check(s) failed in the guest"
    return 1
}

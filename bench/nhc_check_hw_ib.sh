#!/bin/bash
# Reference for bench_health.py: LBNL NHC's check_hw_ib logic as a shell loop: for every port,
# state ACTIVE, phys_state LinkUp, and the rate; read with bash's own `read` (no fork per file),
# as NHC does. Usage: nhc_check_hw_ib.sh ROOT [RATE]; exit 1 and one line per bad port.
root=${1:-/}
want=${2:-}
bad=0
for p in "$root"/sys/class/infiniband/*/ports/*; do
    read -r _ state < "$p/state" || { echo "$p: state unreadable"; bad=1; continue; }
    read -r _ phys < "$p/phys_state" || { echo "$p: phys_state unreadable"; bad=1; continue; }
    read -r rate _ < "$p/rate" || { echo "$p: rate unreadable"; bad=1; continue; }
    if [ "$state" != ACTIVE ] || [ "$phys" != LinkUp ]; then
        echo "$p: $state $phys"; bad=1
    elif [ -n "$want" ] && [ "$rate" != "$want" ]; then
        echo "$p: rate $rate, want $want"; bad=1
    fi
done
exit $bad

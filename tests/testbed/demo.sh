#!/usr/bin/env bash
# ibtool's overview: what `make demo` shows (on the host with RDMA devices, or in the testbed).
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
IB=".venv/bin/ibtool"
for args in "dev" "port" "gids" "gids --best" "loopback --iters 20"; do
    echo "\$ ibtool $args"
    # shellcheck disable=SC2086
    $IB $args
    echo
done

#!/bin/bash
# Reference for bench_sysfs.py: reads the GID table the way show_gids(8) does, one `cat` per
# file in a command substitution. Usage: show_gids_loop.sh ROOT
root=${1:-/}
zero=0000:0000:0000:0000:0000:0000:0000:0000
for d in "$root"/sys/class/infiniband/*; do
    for p in "$d"/ports/*; do
        for g in "$p"/gids/*; do
            i=${g##*/}
            gid=$(cat "$g" 2>/dev/null) || continue
            [ "$gid" = "$zero" ] && continue
            ndev=$(cat "$p/gid_attrs/ndevs/$i" 2>/dev/null)
            type=$(cat "$p/gid_attrs/types/$i" 2>/dev/null)
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "${d##*/}" "${p##*/}" "$i" "$gid" "$type" "$ndev"
        done
    done
done

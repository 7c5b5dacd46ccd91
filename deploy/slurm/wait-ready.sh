#!/usr/bin/env bash
# wait-ready.sh DIR N [TIMEOUT_S]: wait until N servers wrote their ready files in DIR (each writes
# one once all its workers serve); exit 1 naming what is missing after TIMEOUT_S (default 300).
set -euo pipefail
dir=$1 want=$2 timeout_s=${3:-300}
deadline=$((SECONDS + timeout_s))
while true; do
    have=$(find "$dir" -maxdepth 1 -name 'ready-*.json' | wc -l)
    if (( have >= want )); then
        exit 0
    fi
    if (( SECONDS >= deadline )); then
        echo "wait-ready: $have of $want servers ready after ${timeout_s}s (see the server step's output)" >&2
        exit 1
    fi
    sleep 2
done

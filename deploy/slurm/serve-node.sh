#!/usr/bin/env bash
# One shard server on this node, run by `srun` (one task per node) from train*.sbatch. It writes
# $SHARDSTREAM_RUN_DIR/ready-HOST.json once every worker serves; SIGTERM (srun forwards it when the
# step is cancelled) drains it: health NOT_SERVING, in-flight streams get --grace seconds, exit 0.
#
# Environment: SHARDSTREAM_ROOT (the registry: s3://BUCKET/PREFIX or a directory every node sees),
# SHARDSTREAM_RUN_DIR (a shared directory), and optionally SHARDSTREAM_HOST (0.0.0.0), SHARDSTREAM_PORT (7070:
# the control plane, which trainers are given), SHARDSTREAM_DATA_PORT (SHARDSTREAM_PORT + 1: the Arrow Flight
# data plane, where Read streams flow; worker i serves it + i, so ranks must reach DATA_PORT..DATA_PORT+workers-1
# on every server node too), SHARDSTREAM_METRICS_PORT (9090), SHARDSTREAM_CACHE_MIB (4096),
# SHARDSTREAM_CACHE_DIR (node-local disk, e.g. /local/scratch; flock over NFS is not reliable),
# AWS_* for S3 (see deploy/RUNBOOK.md).
set -euo pipefail

: "${SHARDSTREAM_ROOT:?set SHARDSTREAM_ROOT to the registry (s3://BUCKET/PREFIX or a shared directory)}"
: "${SHARDSTREAM_RUN_DIR:?set SHARDSTREAM_RUN_DIR to a directory every node sees}"
port=${SHARDSTREAM_PORT:-7070}
data_port=${SHARDSTREAM_DATA_PORT:-$((port + 1))}
# One worker per CPU of this step (the server's own default: its affinity mask, which srun sets).
workers=${SLURM_CPUS_PER_TASK:-1}
# The row-group cache, split between the workers (RUNBOOK "Cache sizing": per worker at least 2
# shuffle windows per concurrent stream, plus a quarter for read-ahead).
cache_mib=${SHARDSTREAM_CACHE_MIB:-4096}
args=(
    serve
    --root "$SHARDSTREAM_ROOT"
    --host "${SHARDSTREAM_HOST:-0.0.0.0}"
    --port "$port"
    --data-port "$data_port"
    --metrics-port "${SHARDSTREAM_METRICS_PORT:-9090}"
    --workers "$workers"
    --cache-mib "$cache_mib"
    --grace 10
    --ready-file "$SHARDSTREAM_RUN_DIR/ready-$(hostname).json"
)
if [[ -n "${SHARDSTREAM_CACHE_DIR:-}" ]]; then
    mkdir -p "$SHARDSTREAM_CACHE_DIR"
    args+=(--cache-dir "$SHARDSTREAM_CACHE_DIR")
fi
exec shardstream "${args[@]}"

#!/usr/bin/env bash
# Issue #17 on a lent many-core machine (the `run` tool's device: 16 cores, no network, no registry),
# in one call: the scaling curve of `serve --workers W` for W = 1, 2, 4, 8, then, if time remains,
# the data-plane A/B (shardstream's Flight data plane vs Flight DoGet from memory). Documented in
# loadtest/README.md ("Scaling with cores").
#
#   bash loadtest/device_run.sh                     # on the device: OUT=$OUT is set there
#   OUT=/tmp/dev PY=/tmp/devsim/bin/python3 SMALL=1 bash loadtest/device_run.sh   # a dry run here
#
# The code measured is the folder this script lies in. The checkout is shared with work in progress,
# so the device run measured a commit, not the working tree: here,
#   echo /.devsrc/ >> .git/info/exclude; rm -rf .devsrc; mkdir .devsrc; git archive HEAD | tar -x -C .devsrc
# then run(command="WHEELS=$PWD/.devwheels bash .devsrc/loadtest/device_run.sh", carry=[".devwheels",
# ".devsrc"], timeout_s=420).
#
# The device's python3 has grpcio, protobuf, pyarrow, pillow, psutil, numpy, prometheus-client, but
# not in our versions (the stubs in shardstream/v1 need protobuf >= the generator's 7.35.1) and no
# grpcio-health-checking, grpcio-reflection, uvloop or tqdm where we rely on them: those travel as wheels in .devwheels/
# (git-ignored, named in `carry`), installed into a private --target and put first on PYTHONPATH.
# pyarrow, pillow, numpy, psutil are the device's own. The package is laid out as the editable
# install does (shardstream/, with client/ and server/ as shardstream.client and shardstream.server)
# in a private folder of links, the working directory of every stage, so that `python -m shardstream
# serve` (started by loadtest/scaling.py through LocalServer: sys.executable, inherited environment
# and cwd) resolves the same way. Each stage runs under `timeout`, so what finished comes back.
#
# Environment (defaults in brackets): OUT [loadtest/results/device], PY [python3],
# WHEELS [.devwheels], SCALING_ARGS, SCALING_TIMEOUT [260], FLIGHT_ARGS, FLIGHT_TIMEOUT [110],
# FLIGHT=0 (skip the Flight A/B), SMALL=1 (tiny sizes, for a dry run on 2 cores). The second device
# run of 2026-11-26 (scaling with cores, servers pinned):
#   SCALING_ARGS="--workers 1 2 4 8 --images 4096 --unique-images 480 --streams 32 --pairs 3
#   --client-procs 4 --pin" FLIGHT=0 WHEELS=$PWD/.devwheels bash .devsrc/loadtest/device_run.sh
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/loadtest/results/device}
PY=${PY:-python3}
WHEELS=${WHEELS:-$REPO/.devwheels}
SITE=/tmp/shardstream-site
PKG=/tmp/shardstream-pkg
if [ "${SMALL:-0}" = 1 ]; then
    SCALING_ARGS=${SCALING_ARGS:---workers 1 2 --images 256 --unique-images 16 --streams 8 --pairs 1 --client-procs 2}
    FLIGHT_ARGS=${FLIGHT_ARGS:---mib 32 --epochs 1 --pairs 1}
else
    SCALING_ARGS=${SCALING_ARGS:---workers 1 2 4 8 --images 8192 --unique-images 480 --streams 32 --pairs 3 --client-procs 4}
    FLIGHT_ARGS=${FLIGHT_ARGS:---pairs 5}
fi
SCALING_TIMEOUT=${SCALING_TIMEOUT:-260}
FLIGHT_TIMEOUT=${FLIGHT_TIMEOUT:-110}
mkdir -p "$OUT"
T0=$(date +%s)
stage() { echo; echo "=== $* ($(($(date +%s) - T0)) s)"; }

stage "setup"
rm -rf "$SITE" "$PKG"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl ||
        { echo "pip failed: unpacking the wheels instead"; "$PY" -c 'import sys, zipfile
for w in sys.argv[2:]: zipfile.ZipFile(w).extractall(sys.argv[1])' "$SITE" "$WHEELS"/*.whl || exit 1; }
fi
mkdir -p "$PKG"
cp -r "$REPO/shardstream" "$PKG/shardstream"
rm -rf "$PKG/shardstream/client" "$PKG/shardstream/server"
ln -s "$REPO/client" "$PKG/shardstream/client"
ln -s "$REPO/server" "$PKG/shardstream/server"
ln -s "$REPO/loadtest" "$PKG/loadtest"
export PYTHONPATH="$PKG:$SITE" PYTHONUNBUFFERED=1
cd "$PKG" || exit 1

stage "machine and versions"
{
    echo "nproc: $(nproc)"
    grep -m1 "model name" /proc/cpuinfo
    lscpu 2>/dev/null | grep -iE "^(Thread|Core|Socket|NUMA node|CPU\(s\)|L[23])" || true
    echo "cpu0 siblings: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null)"
    free -g | head -2
    uptime
    uname -r
    nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
    "$PY" - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for mod in ("grpc", "google.protobuf", "pyarrow", "pyarrow.flight", "PIL", "psutil", "numpy", "uvloop",
            "prometheus_client", "tqdm", "yaml", "grpc_health.v1.health", "grpc_reflection.v1alpha.reflection"):
    try:
        m = importlib.import_module(mod)
        print(f"{mod:38} {getattr(m, '__version__', '-'):10} {m.__file__}")
    except Exception as exc:  # noqa: BLE001 — a report
        print(f"{mod:38} MISSING: {exc!r}")
import shardstream.server.serving.control_plane, shardstream.client, shardstream.cli, loadtest.scaling, loadtest.flight_bench  # noqa: E401,F401
print("imports ok:", shardstream.server.serving.control_plane.__file__)
EOF
} 2>&1 | tee "$OUT/env.txt"

stage "server smoke test (serve --workers 2, its log on failure)"
timeout -k 5 60 "$PY" - <<'EOF' 2>&1 | tee -a "$OUT/env.txt"
import sys, tempfile
from pathlib import Path
from shardstream.server.local_fleet import LocalServer
with tempfile.TemporaryDirectory() as d:
    log = Path(d) / "serve.log"
    (Path(d) / "root").mkdir()
    try:
        with LocalServer(Path(d) / "root", workers=2, log_path=log) as s:
            print("serve --workers 2 ready on", s.target, "pid", s.pid)
    except Exception as exc:
        print("SERVER FAILED:", exc)
        print(log.read_text() if log.exists() else "(no log)")
        sys.exit(1)
EOF

stage "scaling: python -m loadtest.scaling $SCALING_ARGS"
# shellcheck disable=SC2086
timeout -k 10 "$SCALING_TIMEOUT" "$PY" -m loadtest.scaling $SCALING_ARGS --json "$OUT/scaling.json" 2>&1 |
    tee "$OUT/scaling.log"
echo "scaling exit: ${PIPESTATUS[0]}"

if [ "${FLIGHT:-1}" != 0 ]; then
    stage "flight_bench: python -m loadtest.flight_bench $FLIGHT_ARGS"
    # shellcheck disable=SC2086
    timeout -k 10 "$FLIGHT_TIMEOUT" "$PY" -m loadtest.flight_bench $FLIGHT_ARGS --json "$OUT/flight_bench.json" 2>&1 |
        tee "$OUT/flight_bench.log"
    echo "flight_bench exit: ${PIPESTATUS[0]}"
fi

stage "done"
uptime
ls -la "$OUT"

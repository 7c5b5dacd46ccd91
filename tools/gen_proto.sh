#!/usr/bin/env bash
# Regenerate the Python stubs of protos/shardstream/v1 into shardstream/v1 (import name shardstream.v1).
# The output is committed; CI runs this and fails when `git diff` shows drift.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m grpc_tools.protoc -I protos \
    --python_out="$tmp" --grpc_python_out="$tmp" --pyi_out="$tmp" \
    protos/shardstream/v1/*.proto
cp "$tmp"/shardstream/v1/*.py "$tmp"/shardstream/v1/*.pyi shardstream/v1/

#!/usr/bin/env bash
# podman with this repository's containers.conf (runc; default ulimits no higher than this shell's:
# deploy/image/containers-conf.sh), e.g. deploy/image/podman.sh run --rm shardstream:0.1.0 --help
set -euo pipefail
conf=$(cd "$(dirname "$0")/../.." && pwd)/build/image/containers.conf
mkdir -p "$(dirname "$conf")"
"$(dirname "$0")/containers-conf.sh" > "$conf.new" && mv "$conf.new" "$conf"
export CONTAINERS_CONF=$conf
exec podman "$@"

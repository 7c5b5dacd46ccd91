#!/usr/bin/env bash
# `make image`: deploy/Dockerfile built with Debian's podman, without any container registry.
#
#   deploy/image/build.sh                 # builds shardstream:VERSION (VERSION from pyproject.toml)
#   IMAGE=shardstream:dev deploy/image/build.sh
#
# 1. The base image (PYTHON_IMAGE of the Dockerfile) is made from Debian's packages: mmdebstrap writes
#    a minimal bookworm with python3, python3-venv and ca-certificates as a tarball and `podman import`
#    turns it into localhost/shardstream-base:bookworm. The wheel stage's (BUILD_IMAGE) is the same
#    plus gcc and python3-dev, to compile shardstream/_kernels.c: localhost/shardstream-build-base.
#    Both are made once and kept (BASE_REBUILD=1 redoes them, e.g. for Debian's security updates).
# 2. `podman build` runs the Dockerfile on it. The wheel stage reaches the package index the host's pip
#    is set up for (PIP_INDEX_URL, else pip's global.index-url, else PyPI), trusting the host's CA
#    bundle (PIP_CERT / pip's global.cert, else the system bundle), which is mounted for the build only.
#
# podman runs through deploy/image/podman.sh, with a containers.conf of our own
# (build/image/containers.conf, from deploy/image/containers-conf.sh): runc, and default ulimits no
# higher than this shell's. podman's own defaults for root (nofile 1048576) are refused where root
# lacks CAP_SYS_RESOURCE, as in many CI sandboxes ("error setting rlimit type 7: operation not
# permitted"), and runc refused an nproc above kernel.pid_max here.
set -euo pipefail
cd "$(dirname "$0")/../.."

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
IMAGE=${IMAGE:-shardstream:${VERSION}}
BASE_IMAGE=${BASE_IMAGE:-localhost/shardstream-base:bookworm}
BUILD_BASE_IMAGE=${BUILD_BASE_IMAGE:-localhost/shardstream-build-base:bookworm}
SUITE=bookworm  # the Debian release of the base; python3 there is 3.11 (requires-python >= 3.10)
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
WORK=build/image

need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]} (Debian packages)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

mkdir -p "$WORK"
podman() { deploy/image/podman.sh "$@"; }  # with our containers.conf

started=$(date +%s)
base_image() {  # base_image IMAGE PACKAGES: a minimal bookworm with PACKAGES, imported as IMAGE
    [ "${BASE_REBUILD:-0}" = 1 ] || ! podman image exists "$1" || return 0
    echo "base image $1: mmdebstrap $SUITE" >&2
    rm -f "$WORK/base.tar"
    mmdebstrap --quiet --variant=minbase --include="$2" \
        --aptopt='Acquire::Languages "none"' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        "$SUITE" "$WORK/base.tar" \
        "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main" \
        </dev/null
    podman import --quiet --change 'CMD ["/bin/bash"]' "$WORK/base.tar" "$1" >/dev/null
    rm -f "$WORK/base.tar"
}
base_image "$BASE_IMAGE" python3,python3-venv,ca-certificates
base_image "$BUILD_BASE_IMAGE" python3,python3-venv,python3-dev,gcc,libc6-dev,ca-certificates

# pip's settings as the host uses them (environment first, then pip's config files).
pip_setting() {  # pip_setting ENV_NAME CONFIG_KEY
    local value=${!1:-}
    if [ -z "$value" ] && command -v python3 >/dev/null 2>&1; then
        value=$(python3 -m pip config get "$2" 2>/dev/null || true)
    fi
    printf '%s' "$value"
}
index_url=$(pip_setting PIP_INDEX_URL global.index-url)
ca_bundle=$(pip_setting PIP_CERT global.cert)
[ -n "$ca_bundle" ] || ca_bundle=/etc/ssl/certs/ca-certificates.crt

# podman 4.3 keeps a cached install step whose mounted wheels changed: the sources' digest makes it rerun
sources=$(python3 deploy/image/sources_digest.py)
build_args=(--build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg "BUILD_IMAGE=$BUILD_BASE_IMAGE" --build-arg "PIP_INDEX_URL=${index_url:-https://pypi.org/simple}"
    --build-arg "SOURCES_DIGEST=$sources")
if [ -r "$ca_bundle" ]; then
    build_args+=(--volume "$(readlink -f "$ca_bundle"):/etc/ssl/certs/build-host-ca.crt:ro"
        --build-arg PIP_CERT=/etc/ssl/certs/build-host-ca.crt)
fi

podman build --file deploy/Dockerfile --ignorefile deploy/Dockerfile.dockerignore --tag "$IMAGE" \
    "${build_args[@]}" .
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "built $IMAGE: $((size / 1000000)) MB in $(($(date +%s) - started)) s"

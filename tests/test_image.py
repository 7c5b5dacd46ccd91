"""The server image (deploy/Dockerfile) built with Debian's podman and run as the chart runs it.

Runs only where podman is installed (`make image` installs it with apt-get; `.ci/run` builds the image
before the tests): the image tagged shardstream:VERSION is built first if it is missing
(deploy/image/build.sh, about 2 minutes here). The container runs as the Helm chart renders its pod
with the default values (ports moved to free ones through the chart's values): UID 10001, read-only
root filesystem with /tmp in memory, every capability dropped, the CPU and memory limits, the env and
args as rendered, the registry mounted read-only at its mount path, every port published on loopback
under its own number (a client dials the data port GetDataset names on the host it asked). Then: the
kubelet's gRPC probes as rendered pass (readiness on the data plane's service name), /metrics 200 with
every worker, two Loaders on this host read a dataset served from the container exactly once, /metrics
counts the epoch, and `podman stop` within the grace period (SIGTERM) drains to exit 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from grpc_health.v1 import health_pb2

from shardstream.client import Loader

from .support.chart import DOCKERFILE, Rendered, cpu_millis, flag, memory_mib, probe_grpc, render
from .support.data import N_ROWS, write_dataset
from .support.servers import unused_port_outside, unused_port_range, wait_for

REPO = Path(__file__).resolve().parent.parent
PODMAN = REPO / "deploy" / "image" / "podman.sh"  # podman with the repository's containers.conf
BUILD = REPO / "deploy" / "image" / "build.sh"
sources_digest = runpy.run_path(str(REPO / "deploy" / "image" / "sources_digest.py"))["sources_digest"]  # not a package
SERVING = health_pb2.HealthCheckResponse.SERVING

pytestmark = [
    pytest.mark.skipif(
        shutil.which("podman") is None, reason="podman is not installed (Debian package podman; `make image` installs it)"
    ),
    pytest.mark.timeout(900),  # the first test may build the image: 2 to 4 minutes on 2 cores, more on a cold mirror
]


def version() -> str:
    import tomllib

    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def podman(*args: str, timeout_s: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(PODMAN), *args], capture_output=True, text=True, timeout=timeout_s)
    assert not check or done.returncode == 0, f"podman {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def sources_of(tag: str) -> str | None:
    """The sources' digest the image was built from (its label), None if there is no such image."""
    done = podman("image", "inspect", "--format", '{{index .Labels "io.shardstream.sources"}}', tag, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


@pytest.fixture(scope="module")
def image() -> str:
    """The image of this checkout: built when missing or built from other sources (its label)."""
    tag = f"shardstream:{version()}"
    if sources_of(tag) != sources_digest(REPO):
        done = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=900, env={**os.environ, "IMAGE": tag})
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return tag


@contextlib.contextmanager
def container(name: str, argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`podman run` in the foreground (its own process group, output to `log`); the container is
    removed afterwards whatever happened (conmon keeps it running outside our process group)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(PODMAN), "run", "--name", name, *argv], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_the_image_runs_non_root_with_shardstream_as_entrypoint(image: str) -> None:
    # built from these sources: podman 4.3 kept a cached install step with the wheels of old ones
    assert sources_of(image) == sources_digest(REPO), "the image holds other sources than this checkout's"
    config = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == "10001:10001" and config["Entrypoint"] == ["shardstream"]
    assert config.get("StopSignal") in ("SIGTERM", "15")
    assert set(config["ExposedPorts"]) == {"7070/tcp", "7071/tcp", "9090/tcp"}
    # nothing the final stage should not carry: no compiler, no wheels, no pip cache
    script = "for p in /wheels /root/.cache/pip /opt/build; do [ -e $p ] && echo $p; done; command -v gcc cc g++; true"
    assert podman("run", "--rm", "--entrypoint", "sh", image, "-c", script).stdout.strip() == ""
    # the version installed is the one the Dockerfile pins, and it is this repository's
    pin = f'"shardstream[server]=={version()}"'
    assert pin in DOCKERFILE.read_text()
    shown = podman("run", "--rm", "--entrypoint", "python3", image, "-c", "import importlib.metadata as m; print(m.version('shardstream'))")
    assert shown.stdout.strip() == version()
    # the wheel stage compiled the C kernels (shardstream/_kernels.c): not the numpy fallback
    assert "(native kernels)" in podman("run", "--rm", image, "--version").stdout


def pod_as_podman_run(r: Rendered, image: str, registry: Path) -> list[str]:
    """`podman run` options and arguments for the server container as the chart renders it: its
    user, read-only root with /tmp in memory, capabilities, CPU and memory limits, environment and
    args (the image's ENTRYPOINT), the registry volume read-only at its mount path, and its ports
    published on loopback under their own numbers."""
    pod, c = r.server["spec"]["template"]["spec"], r.container
    sc, limits = c["securityContext"], c["resources"]["limits"]
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"] == {"drop": ["ALL"]}
    assert not sc["allowPrivilegeEscalation"] and "command" not in c
    (registry_mount,) = [m for m in c["volumeMounts"] if m["name"] == "registry"]
    return [
        "--user", f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}",
        "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--cpus", str(cpu_millis(limits["cpu"]) / 1000), "--memory", f"{int(memory_mib(limits['memory']))}m",
        *[a for e in c["env"] for a in ("--env", f"{e['name']}={e['value']}")],
        *[a for p in c["ports"] for a in ("--publish", f"127.0.0.1:{p['containerPort']}:{p['containerPort']}")],
        "--volume", f"{registry}:{registry_mount['mountPath']}:ro",
        image, *c["args"],
    ]  # fmt: skip


def test_the_image_serves_a_loader_on_the_host_exactly_once(image: str, tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    write_dataset(registry, "toy", N_ROWS)
    workers = int(flag(render().container["args"], "--workers"))  # the chart's defaults: 2 CPUs, 2 workers
    data_port = unused_port_range(workers)  # worker i's Flight data plane on data_port + i
    port, metrics_port = unused_port_outside(data_port, workers), unused_port_outside(data_port, workers)
    r = render({"server": {"port": port, "dataPort": data_port, "metricsPort": metrics_port}})
    argv = pod_as_podman_run(r, image, registry)
    grace_s = r.server["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    name = f"shardstream-smoke-{os.getpid()}"
    log = tmp_path / "container.log"
    with container(name, argv, log) as proc:
        c = r.container  # the kubelet's probes as rendered: start-up, then readiness (the data plane) and liveness
        startup = c["startupProbe"]
        budget_s = startup["periodSeconds"] * startup["failureThreshold"]
        wait_for(lambda: proc.poll() is not None or probe_grpc(port, startup) == SERVING, "health SERVING", budget_s)
        assert proc.poll() is None, log.read_text()
        for kind in ("readinessProbe", "livenessProbe"):
            assert probe_grpc(c[kind]["grpc"]["port"], c[kind]) == SERVING, kind

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
                assert reply.status == 200
                return str(reply.read().decode())

        assert "shardstream_" in scrape() and f'worker="{workers - 1}"' in scrape()
        seen: list[int] = []
        for rank in range(2):
            with Loader(f"127.0.0.1:{port}", "toy@1", batch_size=16, rank=rank, world_size=2, seed=3, epochs=1) as ld:
                seen += [int(i) for b in ld for i in np.asarray(b["id"])]
        assert sorted(seen) == list(range(N_ROWS)), "every sample exactly once"

        def rows_sent() -> float:
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in scrape().splitlines()
                if line.startswith("shardstream_rows_sent_total")
            )

        wait_for(lambda: rows_sent() >= N_ROWS, "/metrics to count the epoch's rows", 30)
        assert rows_sent() == N_ROWS
        # the kubelet's stop: SIGTERM (health NOT_SERVING, drain), SIGKILL after the grace period
        podman("stop", "--time", str(grace_s), name, timeout_s=grace_s + 30)
        assert proc.wait(timeout=30) == 0, log.read_text()
        assert "stopped" in log.read_text()

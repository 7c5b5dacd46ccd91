"""Training-loop defaults a new user meets first: rank and world size from the launcher, len(loader),
and endpoint errors that say what to fix."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardstream.client import Loader
from shardstream.client.launcher import from_launcher, resolve_rank_world
from shardstream.client.torch_dataset import ShardStreamDataset
from shardstream.errors import InvalidArgumentError, UnavailableError
from shardstream.order.read_order import StepLayout

from .support.data import N_ROWS
from .support.servers import unused_port


# --- rank and world size ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (0, 1)),
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}, (3, 8)),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6"}, (5, 6)),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "5", "SLURM_NTASKS": "6"},
            (1, 2),
        ),  # torchrun first
        ({"RANK": "1"}, (0, 1)),  # half a pair is no launcher
    ],
)
def test_rank_and_world_size_come_from_the_launcher(env: dict[str, str], expected: tuple[int, int]) -> None:
    assert resolve_rank_world(None, None, env) == expected


def test_explicit_values_win_and_a_lone_world_size_1_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8"}
    assert resolve_rank_world(2, 4, env) == (2, 4)
    assert resolve_rank_world(None, 8, env) == (3, 8)
    assert resolve_rank_world(5, None, env) == (5, 8)
    with caplog.at_level(logging.WARNING, logger="shardstream.client"):
        assert resolve_rank_world(0, 1, env) == (0, 1)
    assert [r.getMessage() for r in caplog.records] == [
        "world_size=1 was given, but torchrun (RANK/WORLD_SIZE) says this is rank 3 of 8: every rank will read "
        "the whole dataset (leave rank and world_size unset to use the launcher's)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shardstream.client"):
        assert resolve_rank_world(0, 1, {}) == (0, 1)
    assert not caplog.records


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, r"torchrun \(RANK/WORLD_SIZE\): RANK='x' is not an integer"),
        ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, r"SLURM .*: rank 4 is not in \[0, 4\)"),
    ],
)
def test_a_broken_launcher_environment_is_one_clear_error(env: dict[str, str], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        from_launcher(env)


def test_a_world_size_that_contradicts_the_launcher_needs_a_rank() -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"world_size=2 was given but torchrun .* says 8: pass rank="
    ):
        resolve_rank_world(None, 2, {"RANK": "3", "WORLD_SIZE": "8"})


def test_a_loader_takes_the_launchers_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with Loader([f"127.0.0.1:{unused_port()}"], "toy", batch_size=4) as ld:  # no network until iterated
        assert (ld.rank, ld.world_size) == (2, 3)


SCRIPT = """
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
from shardstream.client import Loader
with Loader(sys.argv[1].split(","), "toy@1", batch_size=10, seed=3) as ld:  # no rank arguments
    ids = [i for b in ld for i in b["id"].tolist()]
    where = (ld.rank, ld.world_size)
with open(os.path.join(sys.argv[2], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"where": where, "ids": ids}, f)
dist.destroy_process_group()
"""


def test_under_torchrun_ranks_read_disjoint_halves(endpoints: list[str], tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert torchrun, "torchrun is installed with torch"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")
    }
    proc = subprocess.run(
        [
            torchrun,
            "--nproc-per-node",
            "2",
            "--master-port",
            str(unused_port()),
            str(script),
            ",".join(endpoints),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [tuple(r["where"]) for r in runs] == [(0, 2), (1, 2)]
    a, b = (set(r["ids"]) for r in runs)
    assert not a & b and len(a) + len(b) == N_ROWS and a | b == set(range(N_ROWS))


# --- len ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("world", "batch", "drop_last"), [(1, 10, False), (3, 7, False), (3, 7, True), (2, 2000, False)]
)
def test_len_is_this_ranks_steps_per_epoch(
    endpoints: list[str], world: int, batch: int, drop_last: bool
) -> None:
    expected = StepLayout(N_ROWS, 0, world, batch, drop_last).num_steps
    for rank in range(world):
        with Loader(
            endpoints, "toy@1", batch_size=batch, rank=rank, world_size=world, drop_last=drop_last
        ) as ld:
            assert len(ld) == expected == sum(1 for _ in ld)
            assert len(ld) == expected  # a loader that has run, or resumed, still tells a whole epoch


def test_len_of_a_worker_split_and_of_the_torch_dataset(endpoints: list[str]) -> None:
    steps = StepLayout(N_ROWS, 0, 2, 7).num_steps
    shares = []
    for worker in range(3):
        with Loader(endpoints, "toy@1", batch_size=7, rank=1, world_size=2) as ld:
            ld.split_steps(worker, 3)
            shares.append(len(ld))
            assert len(ld) == sum(1 for _ in ld)
    assert sum(shares) == steps
    ds = ShardStreamDataset(endpoints, "toy@1", batch_size=7, rank=1, world_size=2)
    assert len(ds) == steps


def test_an_endless_loader_has_no_len(endpoints: list[str]) -> None:
    with (
        Loader(endpoints, "toy@1", batch_size=7, epochs=None) as ld,
        pytest.raises(TypeError, match="epochs=None"),
    ):
        len(ld)


# --- endpoints ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("endpoint", "match"),
    [
        ("http://host:7070", r"has a scheme \(http://\).*'host:7070'"),
        ("grpc://10.0.0.5:7070/", r"has a scheme \(grpc://\).*'10.0.0.5:7070'"),
        ("host", r"'host' is not 'host:port' \(the port is required"),
        ("host:", r"is not 'host:port'"),
    ],
)
def test_an_endpoint_that_is_not_host_port_is_refused_at_construction(endpoint: str, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        Loader([endpoint], "toy", batch_size=1)


def test_a_refused_connection_names_the_endpoint_and_waits_out_timeout_s() -> None:
    dead = f"127.0.0.1:{unused_port()}"
    t0 = time.monotonic()
    with Loader([dead], "toy", batch_size=1, timeout_s=1.5) as ld:
        with pytest.raises(
            UnavailableError, match=rf"{dead} within 1.5 s: is `shardstream serve` running there\?"
        ):
            iter(ld)
    assert time.monotonic() - t0 >= 1.5  # "within N s" is only said once N s have passed

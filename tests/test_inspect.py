"""`shardstream inspect` agrees with what the servers deliver, and its stats mean what they say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardstream.client import Loader

from .support.data import N_ROWS


def inspect(data_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardstream", "inspect", *args, "--root", str(data_root)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("dataset", "shuffle", "world", "batch", "rank", "step"),
    [
        ("toy@1", "block", 3, 16, 2, 5),
        ("toy@1", "full", 2, 7, 0, 71),  # the short last step
        ("toy@1", "none", 1, 32, 0, 3),
        ("toy@1:0.75,toy@2:0.25", "block", 2, 20, 1, 30),
    ],
)
def test_inspect_matches_the_loader(endpoints, data_root, dataset, shuffle, world, batch, rank, step) -> None:  # type: ignore[no-untyped-def]
    r = inspect(
        data_root,
        dataset,
        "--seed",
        "9",
        "--world-size",
        str(world),
        "--batch-size",
        str(batch),
        "--rank",
        str(rank),
        "--step",
        str(step),
        "--shuffle",
        shuffle,
        "--window",
        "3",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)
    spec = (
        {k: float(v) for k, v in (p.rsplit(":", 1) for p in dataset.split(","))}
        if ":" in dataset
        else dataset
    )
    with Loader(
        endpoints,
        spec,
        batch_size=batch,
        rank=rank,
        world_size=world,
        seed=9,
        shuffle=shuffle,
        shuffle_window=3,
    ) as ld:
        it = iter(ld)
        for _ in range(step + 1):
            got = next(it)
        info = ld.last_batch
    assert [s["id"] for s in planned["samples"]] == got["id"].tolist()
    assert [s["row"] for s in planned["samples"]] == info.rows.tolist()
    assert [s["position"] for s in planned["samples"]] == list(range(info.position_start, info.position_end))


def test_inspect_show_prints_rows_and_bad_steps_are_clear(data_root) -> None:  # type: ignore[no-untyped-def]
    r = inspect(data_root, "toy@1", "--shuffle", "none", "--batch-size", "3", "--step", "2", "--show")
    assert r.returncode == 0, r.stderr
    assert "sample-6" in r.stdout and "sample-8" in r.stdout and "step 2 of 337" in r.stdout
    for args, message in (
        (("--step", "999"), "outside the epoch's 32 steps"),
        (("--rank", "1"), "--rank must be in [0, 1)"),
        (("--shuffle", "sideways"), "unknown shuffle mode"),
        (("--show", "--columns", "nope"), "unknown column"),
    ):
        r = inspect(data_root, "toy@1", *args)
        assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_stats_separate_sequential_blocked_and_full_shuffles(data_root) -> None:  # type: ignore[no-untyped-def]
    stats = {}
    for mode in ("none", "block", "full"):
        r = inspect(
            data_root, "toy@1", "--shuffle", mode, "--window", "2", "--stats", "--json", "--batch-size", "16"
        )
        assert r.returncode == 0, r.stderr
        stats[mode] = json.loads(r.stdout)
    assert stats["none"]["mean_displacement"] == 0 and stats["none"]["adjacent_correlation"] == pytest.approx(
        1
    )
    assert abs(stats["full"]["adjacent_correlation"]) < 0.2 and stats["full"]["mean_displacement"] > 0.25
    # block: row groups of 50 rows, window 2 -> a batch of 16 touches at most 2 windows' 4 groups
    assert stats["block"]["row_groups_per_batch_max"] <= 4 < stats["full"]["row_groups_per_batch_max"]
    assert stats["none"]["steps"] == -(-N_ROWS // 16)


def test_inspect_positions_are_a_permutation_over_the_epoch(data_root) -> None:  # type: ignore[no-untyped-def]
    ids = []
    for step in range(4):
        r = inspect(data_root, "toy@1", "--batch-size", "300", "--step", str(step), "--json", "--seed", "4")
        ids += [s["id"] for s in json.loads(r.stdout)["samples"]]
    assert sorted(ids) == list(range(N_ROWS)) and ids != sorted(ids)
    assert np.all(np.asarray(ids) >= 0)

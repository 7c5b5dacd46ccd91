"""The rank simulator (`python -m loadtest.scale`), small: 50 ranks of one job over 2 servers and a
real redis-server, cold start, commits, a restart storm and 8 ranks loading one checkpoint at once. Correctness only — no errors, every
rank got its first batch, the commits landed in Redis, every rank resumed at the committed step at
its own first sample, every step's samples exactly once (the plan's, a whole epoch each row once) and
the step replayed after the restart the same samples — never its figures or wall-clock time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from loadtest.scale import main as scale_main
from loadtest.scale_fleet import rpc_delta


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server; .ci/run does this)")


def test_small_fleet_start_commit_restart(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    code = scale_main(
        [
            "--ranks", "50",
            "--servers", "2",
            "--processes", "2",
            "--scenarios", "cold", "commit", "restart", "ckptload",
            "--ckpt-ranks", "8",
            "--ckpt-mib", "4",
            "--dim", "16",
            "--step-s", "0.01",
            "--steps", "4",
            "--commit-every", "2",
            "--root", str(tmp_path / "root"),
            "--json", str(out),
        ]
    )  # fmt: skip
    result = json.loads(out.read_text())
    checks = result["checks"]
    assert code == 0, checks
    assert checks["errors"] == 0
    assert checks["every_rank_first_batch"] is True
    assert checks["commits_in_redis"] is True
    assert checks["restart_step"] == 4  # 4 steps after the first batch's step 1, committed every 2 (step 4)
    assert checks["every_rank_resumed"] is True
    assert checks["resumed_at_committed"] is True
    # Steps 1..5 (the cold start's, the commit phase's 4) are one whole epoch of 50 x 4 x 5 rows; the
    # restart resumed from step 4 and took step 5 again, each rank the same 4 samples as before.
    assert checks["samples_exactly_once"] is True and checks["samples_replays_identical"] is True
    samples = result["samples"]
    assert samples["steps"] == 5 and samples["whole_epochs"] == 1 and samples["samples"] == 50 * 4 * 6
    assert samples["replayed"] == 50 and samples["replay_mismatches"] == 0
    assert samples["lost"] == samples["duplicated"] == samples["wrong"] == samples["gaps"] == 0
    rows = {r["scenario"]: r for r in result["scenarios"]}
    assert list(rows) == ["cold", "commit", "restart", "ckptload"]
    assert rows["cold"]["n"] == rows["restart"]["n"] == 50
    assert rows["commit"]["n"] == 50 * 2  # every rank committed twice (steps 2 and 4)
    # Every rank asked a server for the dataset and opened a stream, at the start and again at the restart.
    assert rows["cold"]["rpcs"]["DoGet"] >= 50 and rows["restart"]["rpcs"]["DoGet"] >= 50
    assert rows["cold"]["rpcs"]["GetDataset"] >= 50
    # 8 ranks loaded the checkpoint, every chunk verified and the bytes' sha256 checked; the servers
    # sent it 8 times and read it from the checkpoint root at most once each
    assert checks["checkpoint_loaded_intact"] is True and checks["checkpoint_read_once_per_server"] is True
    ck = rows["ckptload"]
    assert ck["n"] == 8 and ck["errors"] == 0
    assert ck["ckpt_served_mib"] >= 8 * 4 and 0 < ck["ckpt_storage_read_mib"] <= 2 * 4


def test_rpc_delta_counts_a_restarted_server_from_zero() -> None:
    before = [{"DoGet": 10.0}, {"DoGet": 5.0}]
    after = [{"DoGet": 3.0}, {"DoGet": 7.0}, {"DoGet": 1.0}]  # server 0 restarted, server 2 added
    assert rpc_delta(before, after) == {"DoGet": 3.0 + 2.0 + 1.0}
    assert rpc_delta(before, [{}, {"DoGet": 6.0}]) == {"DoGet": 1.0}  # server 0 down: nothing known

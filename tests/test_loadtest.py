"""The load-test driver (`python -m loadtest`) on a tiny dataset: its numbers agree with each other.

Real servers and rank processes; nothing here looks at speed, and every run is a fixed amount of work
(whole epochs, or --batches per rank) without a time limit, so a busy machine only makes it slower.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from loadtest.driver import LoadConfig, run_load

REPO = Path(__file__).resolve().parent.parent


def _consistent(res: dict, rows: int) -> None:
    tot, ranks = res["total"], res["ranks"]
    assert res["check"]["rows_equal_positions"] is True
    assert tot["rows"] == sum(r["rows"] for r in ranks) > 0
    assert tot["batches"] == sum(r["batches"] for r in ranks)
    assert tot["bytes"] == tot["rows"] * res["dataset"]["row_bytes"]
    for r in ranks:
        assert r["batches"] > 0 and r["cpu_s"] > 0 and r["peak_rss_mib"] > 0
        assert r["wait_p50_ms"] <= r["wait_p99_ms"]
        assert 0 <= r["stall_fraction"] <= 1
    for s in res["servers"]:
        assert s["cpu_s"] > 0 and s["peak_rss_mib"] > 0
    # The servers sent at least what was delivered, and read something from storage.
    assert tot["server_rows_sent"] >= tot["rows"]
    assert tot["storage_read_bytes"] > 0 and tot["read_amplification"] > 0


def test_whole_epochs_deliver_every_sample_exactly_once(tmp_path: Path) -> None:
    rows = 3001
    out, png = tmp_path / "lt.json", tmp_path / "lt.png"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadtest",
            *("--servers", "2", "--ranks", "2", "--rows", str(rows), "--dim", "8", "--batch-size", "37"),
            *("--row-group-rows", "250", "--epochs", "2", "--step-ms", "0", "--duration", "0"),
            *("--root", str(tmp_path / "root"), "--json", str(out), "--png", str(png)),
        ],
        cwd=REPO,
    )
    try:
        assert proc.wait(timeout=300) == 0
    finally:
        if proc.poll() is None:  # SIGTERM: the driver stops its servers and ranks on the way out
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    res = json.loads(out.read_text())
    chk = res["check"]
    assert chk == {
        "rows_equal_positions": True,
        "whole_epochs": True,
        "positions_exactly_once": True,
        "ids_add_up": True,
        "epochs_checked": 2,
    }
    _consistent(res, rows)
    assert res["total"]["rows"] == 2 * rows == res["total"]["server_rows_sent"]
    # Every row was read from storage at least once (each server caches what it read).
    assert res["total"]["storage_read_bytes"] >= rows * res["dataset"]["row_bytes"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_s3_root_for_a_fixed_number_of_batches(s3_root: str, s3_env: dict[str, str], tmp_path: Path) -> None:
    batches = 10  # half an epoch of each rank (2000 rows / (2 ranks x 50)), however long the machine takes
    res = run_load(
        LoadConfig(
            servers=2,
            ranks=2,
            batches=batches,
            step_ms=1.0,
            batch_size=50,
            rows=2000,
            dim=8,
            row_group_rows=200,
            root=s3_root,
            s3_endpoint=s3_env["AWS_ENDPOINT_URL"],
        ),
        workdir=tmp_path,
    )
    assert res["check"]["whole_epochs"] is False and res["check"]["positions_exactly_once"] is None
    _consistent(res, 2000)
    assert [r["batches"] for r in res["ranks"]] == [batches, batches]
    assert res["total"]["rows"] == 2 * batches * 50
    assert all(r["wait_p50_ms"] is not None and r["first_batch_ms"] is not None for r in res["ranks"])
    assert res["total"]["storage_fetched_bytes"] > 0  # read over S3


def test_the_build_benchmark_runs_every_build_path(tmp_path: Path) -> None:
    """`loadtest.build_bench --previous --numpy` (issue #26's same-run comparisons) on a tiny
    dataset: the previous build path still runs against today's reader, today's runs on the numpy
    kernels too, and all build the same messages' rows."""
    out = tmp_path / "bb.json"
    subprocess.run(
        [sys.executable, "-m", "loadtest.build_bench", "--mib", "4", "--epochs", "1", "--rounds", "1",
         "--previous", "--numpy", "--json", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    res = json.loads(out.read_text())
    for mode in ("none", "block", "full"):
        passes = {p["path"]: p for p in res["passes"] if p["mode"] == mode}
        assert set(passes) == {"current", "previous", "numpy"}
        assert passes["current"]["rows"] == passes["previous"]["rows"] == passes["numpy"]["rows"] > 0
        assert {f"{mode} current/previous", f"{mode} current/numpy"} <= set(res["summary"])
    assert res["config"]["kernels"] == "native kernels"

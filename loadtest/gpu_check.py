"""GPU check: a real training loop fed by shardstream, and the client's pinned-memory path.

    python -m loadtest.gpu_check [--rows N] [--dim D] [--batch B] [--json PATH]

Starts two local servers over a generated dataset (an int64 `id`, a float32 feature vector of D
values, an int64 label), then on the GPU (if there is one; else on the CPU, saying so):

1. correctness: every batch moved to the device carries exactly the features its ids imply
   (features[i] = id * 1e-3 + j), over a whole epoch, nothing lost or repeated;
2. copy path: host->device time per batch from the Loader's tensors, plain vs pinned
   (`tensor.pin_memory()` then `.to(device, non_blocking=True)`), alternating, as a ratio;
3. a training loop (an MLP, AdamW, bf16 autocast on GPU) reading batches from the Loader: samples/s
   and the data stall — the share of wall time spent waiting for the next batch;
4. the same loop through `ShardStreamDataset(pin_memory=True)` under torch's DataLoader.

Prints a table and writes JSON. Exits non-zero only if a correctness check fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from loadtest.common import bench_main, bench_parser, results_path
from shardstream.client import Loader
from shardstream.client.torch_dataset import ShardStreamDataset
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest


def make_dataset(root: Path, rows: int, dim: int) -> None:
    ids = np.arange(rows, dtype=np.int64)
    feats = (ids[:, None] * 1e-3 + np.arange(dim)[None, :]).astype(np.float32)
    table = pa.table(
        {
            "id": ids,
            "x": pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1)), dim),
            "y": (ids % 10).astype(np.int64),
        }
    )
    src = root.parent / "src.parquet"
    pq.write_table(table, src, row_group_size=8192)
    ingest(src, "gpu", root, IngestOptions(progress=False, row_group_rows=8192))


def check_epoch(
    endpoints: list[str], batch: int, dim: int, device: torch.device, rows: int
) -> dict[str, object]:
    seen = torch.zeros(rows, dtype=torch.int32, device=device)
    col = torch.arange(dim, device=device, dtype=torch.float32)
    bad = 0
    with Loader(endpoints, "gpu", batch_size=batch, output="torch") as ld:
        for b in ld:
            ids = b["id"].pin_memory().to(device, non_blocking=True) if device.type == "cuda" else b["id"]
            x = b["x"].pin_memory().to(device, non_blocking=True) if device.type == "cuda" else b["x"]
            expect = ids.to(torch.float32)[:, None] * 1e-3 + col[None, :]
            bad += int((~torch.isclose(x, expect, rtol=1e-5, atol=1e-3)).any(dim=1).sum())
            seen.index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {
        "rows_with_wrong_features": bad,
        "missing": int((seen == 0).sum()),
        "repeated": int((seen > 1).sum()),
    }


def copy_ratio(endpoints: list[str], batch: int, device: torch.device, pairs: int) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    with Loader(endpoints, "gpu", batch_size=batch, output="torch", epochs=None, shuffle=False) as ld:
        it = iter(ld)
        batches = [next(it)["x"] for _ in range(16)]

    def plain() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x in batches:
            x.to(device)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / len(batches)

    def pinned() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x in batches:
            x.pin_memory().to(device, non_blocking=True)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / len(batches)

    plain(), pinned()  # warm-up
    a, b = [], []
    for _ in range(pairs):
        a.append(plain())
        b.append(pinned())
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return {
        "plain_ms_per_batch": statistics.median(a) * 1e3,
        "pinned_ms_per_batch": statistics.median(b) * 1e3,
        "plain_over_pinned_median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
    }


def train(batches, dim: int, device: torch.device, steps: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(dim, 2048),
        torch.nn.GELU(),
        torch.nn.Linear(2048, 2048),
        torch.nn.GELU(),
        torch.nn.Linear(2048, 10),
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    waited = 0.0
    samples = 0
    it = iter(batches)
    t_start = time.perf_counter()
    losses = []
    for _ in range(steps):
        t0 = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            break
        waited += time.perf_counter() - t0
        x = b["x"].to(device, non_blocking=True)
        y = b["y"].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss)
        samples += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t_start
    return {
        "steps": len(losses),
        "samples_per_s": samples / wall,
        "data_stall_fraction": waited / wall,
        "first_loss": losses[0].item(),
        "last_loss": losses[-1].item(),
    }


def run(a: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (no GPU)",
        "torch": torch.__version__,
        "pyarrow": pa.__version__,
        "rows": a.rows,
        "dim": a.dim,
        "batch": a.batch,
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        t0 = time.perf_counter()
        make_dataset(root, a.rows, a.dim)
        out["ingest_s"] = time.perf_counter() - t0
        with LocalServer(root) as s1, LocalServer(root) as s2:
            eps = [s1.target, s2.target]
            out["epoch_check"] = check_epoch(eps, a.batch, a.dim, device, a.rows)
            out["copy"] = copy_ratio(eps, a.batch, device, a.pairs)
            with Loader(eps, "gpu", batch_size=a.batch, output="torch", epochs=None) as ld:
                out["train_loader"] = train(ld, a.dim, device, a.steps)
            ds = ShardStreamDataset(eps, "gpu", batch_size=a.batch, epochs=None, pin_memory=True)
            dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
            out["train_dataset_pinned"] = train(dl, a.dim, device, a.steps)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.gpu_check", __doc__, whole_doc=True)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=5)
    return bench_main(
        ap,
        argv,
        run,
        json_default=results_path("gpu_check"),
        report=lambda out: print(json.dumps(out, indent=1)),
        failed=lambda out: out["epoch_check"] != {"rows_with_wrong_features": 0, "missing": 0, "repeated": 0},
    )


if __name__ == "__main__":
    sys.exit(main())

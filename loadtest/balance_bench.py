"""Balanced steps: packed rows and attention cost per rank, balance=None against "tokens" and "attention".

    python -m loadtest.balance_bench [--steps 40] [--quick] [--json PATH]

Two corpora: CPython's standard library source files (those of the interpreter running this, without
site-packages; the byte tokenizer's token counts are the files' UTF-8 sizes: median ~6 KB, a long
tail) and a synthetic lognormal corpus (median 1,500 tokens, sigma 1.2). Each step draws W·B
documents (in a seeded shuffled order, with replacement where a step needs more documents than the
corpus holds), for W in (8, 64, 512), B in (4, 8, 32) documents per rank and seq_len 2048 and 8192.

Per cell and mode, over the steps: the median of max/mean packed rows per rank, the median of
max/mean attention cost per rank (Σ document-chunk length²), and the simulated data-parallel time —
Σ over steps of the largest rank's cost, as a ratio to balance=None's — once with a step's cost
linear in its rows ("rows": MLP-bound) and once in its attention cost ("attn"). The targets
(issue "balanced steps"): rows max/mean ≤ 1 + 1/mean rows (±1 row); attention max/mean ≤ 1.05 where a
rank has ≥ 4 rows a step. A cost-column cell partitions lognormal sample costs (LPT) against
slicing. Pure arithmetic: nothing here depends on the machine, and no test asserts on the figures.

`--served` (on by default) measures what balancing costs a server, in process: rank 0's epoch of
variable-length pre-tokenized documents (list<int32>, lognormal lengths, an `n_tokens` column),
text.pack at seq_len 2048, 8 ranks x 8 and x 64 documents (~50 KB and ~400 KB of tokens a rank a
step: the planning is per step, so it weighs more on small steps), built by `MessageBuilder.stream` with row groups
cached (a warm-up epoch first) for balance None, "tokens" and "attention", alternating over
`--rounds`: server CPU seconds per GB of packed rows sent, and the ratio to None (target ≤ 1.1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.common import bench_main, bench_parser, results_path
from shardstream.order.balance import (
    deal_attention,
    deal_tokens,
    pack_step,
    partition_costs,
    rank_costs,
    unbalanced_rows,
)

WORLDS = (8, 64, 512)
DOCS_PER_RANK = (4, 8, 32)
SEQ_LENS = (2048, 8192)


def cpython_sizes() -> np.ndarray:
    """Tokens (+ EOS) of each standard-library source file under the byte tokenizer."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sizes = [p.stat().st_size + 1 for p in sorted(stdlib.rglob("*.py")) if "site-packages" not in p.parts]
    return np.asarray([s for s in sizes if s > 1], dtype=np.int64)


def lognormal_sizes(n: int = 20_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.lognormal(np.log(1500), 1.2, n).astype(np.int64) + 1).clip(1, 1 << 20)


def _ratio(values: np.ndarray) -> float:
    mean = float(values.mean())
    return float(values.max()) / mean if mean else 1.0


def cell(sizes: np.ndarray, world: int, per_rank: int, seq_len: int, steps: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    need = world * per_rank
    order = rng.permutation(len(sizes))
    modes = {"none": [], "tokens": [], "attention": []}  # per step: (rows per rank, cost per rank)
    for t in range(steps):
        if need <= len(sizes):
            start = (t * need) % (len(sizes) - need + 1)
            docs = sizes[order[start : start + need]]
        else:
            docs = sizes[rng.integers(0, len(sizes), need)]
        plain = unbalanced_rows(docs, world, seq_len)
        modes["none"].append((np.array([p.num_rows for p in plain]), np.array([p.row_cost.sum() for p in plain])))
        step = pack_step(docs, seq_len)
        modes["tokens"].append(rank_costs(step, deal_tokens(step.num_rows, world), world))
        modes["attention"].append(rank_costs(step, deal_attention(step.row_cost, world), world))
    out: dict[str, Any] = {"world": world, "docs_per_rank": per_rank, "seq_len": seq_len}
    base_rows = sum(float(r.max()) for r, _ in modes["none"])
    base_attn = sum(float(c.max()) for _, c in modes["none"])
    for mode, per_step in modes.items():
        mean_rows = statistics.mean(float(r.mean()) for r, _ in per_step)
        out[mode] = {
            "rows_max_mean": statistics.median(_ratio(r) for r, _ in per_step),
            "attn_max_mean": statistics.median(_ratio(c) for _, c in per_step),
            "mean_rows": mean_rows,
            "rows_target": 1 + 1 / mean_rows if mean_rows else None,
            "dp_time_rows": sum(float(r.max()) for r, _ in per_step) / base_rows,
            "dp_time_attn": sum(float(c.max()) for _, c in per_step) / base_attn,
        }
    return out


def cost_cell(world: int, per_rank: int, steps: int, seed: int) -> dict[str, Any]:
    """balance={"cost": C}: lognormal sample costs (e.g. audio seconds) partitioned vs sliced."""
    rng = np.random.default_rng(seed)
    sliced, lpt, base, dealt = [], [], 0.0, 0.0
    for _ in range(steps):
        costs = rng.lognormal(0, 1.0, world * per_rank)
        a = np.add.reduceat(costs, np.arange(0, len(costs), per_rank))
        b = np.bincount(partition_costs(costs, world), weights=costs, minlength=world)
        sliced.append(_ratio(a))
        lpt.append(_ratio(b))
        base += float(a.max())
        dealt += float(b.max())
    return {
        "world": world,
        "samples_per_rank": per_rank,
        "none_max_mean": statistics.median(sliced),
        "cost_max_mean": statistics.median(lpt),
        "dp_time": dealt / base,
    }


def served(rounds: int, docs: int = 20_000, batches: tuple[int, ...] = (8, 64)) -> dict[str, Any]:
    """Server CPU per GB of rank 0's epoch with and without balance (see the module docstring)."""
    import tempfile
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardstream.server.backends.roots import open_registry
    from shardstream.server.read.build import MessageBuilder
    from shardstream.server.read.plan import ReadPlanner
    from shardstream.server.read.reader import new_row_group_cache
    from shardstream.server.writing.ingest import IngestOptions, ingest
    from shardstream.v1 import shardstream_pb2 as pb

    lengths = lognormal_sizes(docs, seed=1) - 1
    rng = np.random.default_rng(2)
    values = rng.integers(0, 50_000, int(lengths.sum()), dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    table = pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)), "n_tokens": pa.array(lengths, pa.int32())})
    modes = {"none": pb.Balance.BALANCE_NONE, "tokens": pb.Balance.BALANCE_TOKENS, "attention": pb.Balance.BALANCE_ATTENTION}
    cpu: dict[str, list[float]] = {f"{m}/{b}": [] for b in batches for m in modes}
    with tempfile.TemporaryDirectory(prefix="balance-served-") as tmp:
        src = Path(tmp) / "docs.parquet"
        pq.write_table(table, src)
        ingest(src, "docs", Path(tmp) / "root", IngestOptions(row_group_rows=2048, progress=False))
        with open_registry(str(Path(tmp) / "root")) as registry:
            planner = ReadPlanner(registry, new_row_group_cache(2 << 30))
            builder = MessageBuilder()
            pack = json.dumps({"column": "tokens", "seq_len": 2048, "eos_id": 50_000, "lengths": "n_tokens"})

            def epoch(key: str) -> tuple[float, int]:
                mode, batch = key.split("/")
                req = pb.ReadRequest(
                    dataset="docs", seed=0, shuffle=pb.Shuffle(mode="block"), rank=0, world_size=8, batch_size=int(batch),
                    columns=["tokens"], split_steps=True, transforms=[pb.Transform(op="text.pack", params_json=pack)],
                )  # fmt: skip
                if modes[mode]:
                    req.balance.mode = modes[mode]
                c0 = time.process_time()
                nbytes = sum(m.nbytes for m in builder.stream(planner.plan(req)))
                return time.process_time() - c0, nbytes

            for key in cpu:
                epoch(key)  # warm-up: row groups cached
            for r in range(rounds):
                for key in list(cpu) if r % 2 == 0 else list(cpu)[::-1]:
                    seconds, nbytes = epoch(key)
                    cpu[key].append(seconds / (nbytes / 1e9))
    return {
        "documents": docs,
        "cpu_s_per_gb": {k: statistics.median(v) for k, v in cpu.items()},
        "ratio_to_none": {
            k: statistics.median(v) / statistics.median(cpu[f"none/{k.split('/')[1]}"]) for k, v in cpu.items()
        },
        "rounds": rounds,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    corpora = {"cpython": cpython_sizes(), "lognormal": lognormal_sizes()}
    worlds = (8, 64) if args.quick else WORLDS
    cells = []
    for name, sizes in corpora.items():
        for world in worlds:
            for per_rank in DOCS_PER_RANK:
                for seq_len in SEQ_LENS:
                    steps = max(3, args.steps * 8 // world) if world > 8 else args.steps
                    cells.append({"corpus": name, **cell(sizes, world, per_rank, seq_len, steps, args.seed)})
    costs = [cost_cell(w, b, args.steps, args.seed) for w in worlds for b in DOCS_PER_RANK]
    out_served = served(args.rounds) if getattr(args, "served", True) else None
    return {
        "served": out_served,
        "corpora": {k: {"documents": len(v), "median_tokens": float(np.median(v)), "p99_tokens": float(np.percentile(v, 99))} for k, v in corpora.items()},
        "cells": cells,
        "cost_cells": costs,
    }


def report(res: dict[str, Any]) -> None:
    for name, c in res["corpora"].items():
        print(f"{name}: {c['documents']} documents, median {c['median_tokens']:.0f} tokens, p99 {c['p99_tokens']:.0f}")
    print(f"{'corpus':<10}{'W':>5}{'B':>4}{'seq':>6} | rows max/mean none tok attn (target) | attn max/mean none tok attn"
          " | DP time vs none: rows tok attn, attn-cost tok attn")  # fmt: skip
    for c in res["cells"]:
        n, t, a = c["none"], c["tokens"], c["attention"]
        print(
            f"{c['corpus']:<10}{c['world']:>5}{c['docs_per_rank']:>4}{c['seq_len']:>6} | "
            f"{n['rows_max_mean']:5.2f} {t['rows_max_mean']:5.2f} {a['rows_max_mean']:5.2f} ({t['rows_target']:.2f}) | "
            f"{n['attn_max_mean']:5.2f} {t['attn_max_mean']:5.2f} {a['attn_max_mean']:5.2f} | "
            f"{t['dp_time_rows']:.2f} {a['dp_time_rows']:.2f}, {t['dp_time_attn']:.2f} {a['dp_time_attn']:.2f}"
            f"{'' if a['mean_rows'] >= 4 else '  (< 4 rows a rank)'}"
        )
    if res.get("served"):
        s = res["served"]
        print(
            f"server CPU/GB, rank 0 of 8 ranks, {s['documents']} pre-tokenized documents (mode/documents a rank): "
            + ", ".join(f"{k} {s['cpu_s_per_gb'][k]:.2f} s/GB ({s['ratio_to_none'][k]:.2f}x)" for k in s["cpu_s_per_gb"])
        )
    print("cost column (lognormal costs): W B | max/mean sliced, LPT | DP time vs sliced")
    for c in res["cost_cells"]:
        print(f"  {c['world']:>4} {c['samples_per_rank']:>3} | {c['none_max_mean']:.2f} {c['cost_max_mean']:.3f} | {c['dp_time']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("loadtest.balance_bench", __doc__ or "")
    parser.add_argument("--steps", type=int, default=40, help="steps per cell at W=8 (fewer at larger W; default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="W in (8, 64) only")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of the served cost (default 5)")
    parser.add_argument("--no-served", dest="served", action="store_false", help="the arithmetic only")
    return bench_main(parser, argv, run, json_default=results_path("balance_bench"), report=report)


if __name__ == "__main__":
    sys.exit(main())

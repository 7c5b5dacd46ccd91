"""transformers.Trainer resumed N samples into a run: time to the first trained batch, ShardStreamTrainer vs the Trainer's default.

    python -m loadtest.hf_resume_bench [--at 100 10000 1000000] [--default-up-to 1000000]
                                       [--rows 200000] [--batch 10] [--reps 3]
                                       [--json loadtest/results/hf_resume_bench.json]

One dataset (`id` int64 and `input_ids`, 32 int32 tokens a row: 136 B a sample) of --rows rows is
ingested in a private temp dir and served by one `LocalServer`. The model is a GPT-2 built from a
config (1 layer, 16 wide, 256-token vocabulary; nothing downloaded), trained on CPU with
per-device batch --batch and no gradient accumulation; the Loader streams endless epochs
(`epochs=None`, block shuffle, seed 0), so N samples in is epoch N // rows, offset N % rows.

For each N of --at, a checkpoint of global step S = N / batch is made from one real checkpoint
(one trained step, saved by ShardStreamTrainer): its trainer_state.json gets global_step S, and the
Loader state it holds gets the cursor of step S — what the run would have saved at step S. Then, in
this process, alternating:

- **integration**: `ShardStreamTrainer(...).train(resume_from_checkpoint=...)` — the Loader state is
  loaded, nothing is read before the first batch;
- **default**: a `transformers.Trainer` whose train DataLoader is `DataLoader(ShardStreamDataset(...),
  batch_size=None)` and nothing else — what a Trainer does with an iterable dataset on resume:
  accelerate's `skip_first_batches` reads and drops S batches first (transformers issue #11284).

Measured: wall time from `train()` to the first `compute_loss` (both include loading the model,
optimizer, scheduler and RNG from the checkpoint: the same work), and the first batch's ids, which
must be those at position N (a run whose ids differ is reported and the exit status is 1). The
default is measured only for N up to --default-up-to; above it, its time is extrapolated linearly
from the two largest measured N (marked "extrapolated"). The integration runs --reps times, the
default --reps times below 100,000 samples and once above. Figures only; nothing asserted on time.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loadtest.common import bench_main, bench_parser, log, results_path, versions
from shardstream.client import Loader
from shardstream.client.loader_state import LoaderState
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest

__all__ = ["main"]

DATASET = "hfresume"
TOKENS = 32
VOCAB = 256
SEED = 0
DEFAULT_AT = (100, 10_000, 1_000_000)
DEFAULT_ROWS = 200_000
DEFAULT_BATCH = 10
DEFAULT_REPS = 3
ONE_REP_FROM = 100_000  # the default's measurements from this N on run once (each reads N samples)


def build_dataset(workdir: Path, rows: int) -> Path:
    ids = np.arange(rows, dtype=np.int64)
    tokens = ((ids[:, None] * 7 + np.arange(TOKENS)) % VOCAB).astype(np.int32)
    table = pa.table(
        {"id": ids, "input_ids": pa.FixedSizeListArray.from_arrays(pa.array(tokens.reshape(-1)), TOKENS)}
    )
    src = workdir / "src.parquet"
    pq.write_table(table, src)
    root = workdir / "root"
    ingest(src, DATASET, root, IngestOptions(progress=False))
    src.unlink()
    return root


class Bench:
    """The model, the arguments and the two Trainers, built the same way for every measurement."""

    def __init__(self, endpoint: str, batch: int, workdir: Path) -> None:
        import torch
        import transformers
        from torch.utils.data import DataLoader
        from transformers import GPT2Config, GPT2LMHeadModel, PrinterCallback, Trainer, TrainingArguments

        from shardstream.client.integrations.hf_trainer import ShardStreamTrainer, TrainingStream
        from shardstream.client.torch_dataset import ShardStreamDataset

        transformers.logging.set_verbosity_error()
        logging.getLogger("shardstream").setLevel(logging.WARNING)
        self.torch, self.endpoint, self.batch, self.workdir = torch, endpoint, batch, workdir
        self.loader_kwargs = {"batch_size": batch, "columns": ["id", "input_ids"], "epochs": None, "seed": SEED}
        self.config = GPT2Config(
            vocab_size=VOCAB, n_positions=TOKENS, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0,
        )
        self.GPT2LMHeadModel, self.TrainingArguments = GPT2LMHeadModel, TrainingArguments
        self.PrinterCallback = PrinterCallback  # (it prints each run's metrics to stdout: removed)
        self.TrainingStream, self.ShardStreamDataset = TrainingStream, ShardStreamDataset
        bench = self

        def timed_loss(trainer: Any, model: Any, inputs: dict[str, Any], *a: Any, **kw: Any) -> Any:
            ids = inputs.pop("sample_id")
            if trainer.first is None:
                trainer.first = (time.perf_counter(), ids.tolist())
            return super(type(trainer), trainer).compute_loss(model, inputs, *a, **kw)

        class Integration(ShardStreamTrainer):
            first: tuple[float, list[int]] | None = None
            compute_loss = timed_loss

        class Default(Trainer):  # type: ignore[misc]
            """The Trainer as it is, on the same data: only batch_size=None (batches are made upstream)."""

            first: tuple[float, list[int]] | None = None
            compute_loss = timed_loss

            def get_train_dataloader(self) -> Any:
                return DataLoader(self.train_dataset, batch_size=None, num_workers=0, collate_fn=bench.tokens)

        self.Integration, self.Default = Integration, Default

    @staticmethod
    def tokens(batch: dict[str, Any]) -> dict[str, Any]:
        return {"input_ids": batch["input_ids"].long(), "labels": batch["input_ids"].long(), "sample_id": batch["id"]}

    def args(self, out: Path, max_steps: int, save_steps: int | None) -> Any:
        return self.TrainingArguments(
            output_dir=str(out), max_steps=max_steps, save_strategy="steps" if save_steps else "no",
            save_steps=save_steps or 1, per_device_train_batch_size=self.batch, logging_strategy="no",
            report_to="none", use_cpu=True, seed=SEED, disable_tqdm=True, dataloader_pin_memory=False,
        )

    def model(self) -> Any:
        self.torch.manual_seed(SEED)
        return self.GPT2LMHeadModel(self.config)

    def base_checkpoint(self) -> Path:
        """One trained step, saved by ShardStreamTrainer: the checkpoint every measurement is made from."""
        out = self.workdir / "base"
        stream = self.TrainingStream([self.endpoint], DATASET, **self.loader_kwargs)
        trainer = self.Integration(
            model=self.model(), args=self.args(out, 1, 1), train_dataset=stream, data_collator=self.tokens
        )
        trainer.remove_callback(self.PrinterCallback)
        trainer.train()
        stream.close()
        return out / "checkpoint-1"

    def checkpoint_at(self, base: Path, samples: int, rows: int) -> Path:
        """`base` as the run would have saved it at global step samples / batch."""
        step = samples // self.batch
        out = self.workdir / f"at-{samples}" / f"checkpoint-{step}"
        if out.exists():
            return out
        shutil.copytree(base, out)
        state_file = out / "trainer_state.json"
        state = json.loads(state_file.read_text())
        state["global_step"] = step
        saved = state["stateful_callbacks"]["ShardStreamCallback"]["attributes"]["loader_state"]
        cursor = LoaderState.from_dict(saved["loader"])
        saved["loader"] = replace(cursor, epoch=samples // rows, offset=samples % rows, steps=step).to_dict()
        state_file.write_text(json.dumps(state))
        return out

    def expected_ids(self, checkpoint: Path) -> list[int]:
        """The ids at the checkpoint's cursor, read by a plain Loader."""
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        cursor = state["stateful_callbacks"]["ShardStreamCallback"]["attributes"]["loader_state"]["loader"]
        with Loader([self.endpoint], DATASET, **self.loader_kwargs) as loader:
            loader.load_state_dict(cursor)
            return [int(i) for i in next(iter(loader))["id"]]

    def resume(self, kind: str, checkpoint: Path) -> tuple[float, list[int]]:
        """(seconds from train() to the first compute_loss, that batch's ids)."""
        step = int(checkpoint.name.split("-")[1])
        args = self.args(checkpoint.parent / f"run-{kind}", step + 1, None)
        if kind == "integration":
            data: Any = self.TrainingStream([self.endpoint], DATASET, **self.loader_kwargs)
            trainer = self.Integration(model=self.model(), args=args, train_dataset=data, data_collator=self.tokens)
        else:
            data = self.ShardStreamDataset([self.endpoint], DATASET, **self.loader_kwargs)
            trainer = self.Default(model=self.model(), args=args, train_dataset=data)
        trainer.remove_callback(self.PrinterCallback)
        t0 = time.perf_counter()
        trainer.train(resume_from_checkpoint=str(checkpoint))
        assert trainer.first is not None
        if kind == "integration":
            data.close()
        return trainer.first[0] - t0, trainer.first[1]


def run(args: argparse.Namespace) -> dict[str, Any]:
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="shardstream-hf-resume-") as tmp:
        workdir = Path(tmp)
        log(f"ingesting {args.rows:,} rows ...")
        root = build_dataset(workdir, args.rows)
        with LocalServer(root) as server:
            bench = Bench(server.target, args.batch, workdir)
            base = bench.base_checkpoint()
            warm = bench.checkpoint_at(base, args.batch * 2, args.rows)
            for kind in ("integration", "default"):  # first Trainer of each kind in this process: not timed
                bench.resume(kind, warm)
            for samples in args.at:
                ckpt = bench.checkpoint_at(base, samples, args.rows)
                expected = bench.expected_ids(ckpt)
                kinds = ["integration"] + (["default"] if samples <= args.default_up_to else [])
                times: dict[str, list[float]] = {k: [] for k in kinds}
                wrong: list[str] = []
                for rep in range(args.reps):
                    order = kinds if rep % 2 == 0 else kinds[::-1]
                    for kind in order:
                        if kind == "default" and samples >= ONE_REP_FROM and times[kind]:
                            continue
                        seconds, ids = bench.resume(kind, ckpt)
                        times[kind].append(seconds)
                        if ids != expected:
                            wrong.append(f"{kind}: first ids {ids[:4]}..., expected {expected[:4]}...")
                        log(f"N={samples:,} {kind}: {seconds:.3f} s")
                points.append({
                    "samples": samples,
                    "step": samples // args.batch,
                    "integration_s": statistics.median(times["integration"]),
                    "integration_runs_s": times["integration"],
                    "default_s": statistics.median(times["default"]) if "default" in times else None,
                    "default_runs_s": times.get("default", []),
                    "default_extrapolated": "default" not in times,
                    "wrong_batches": wrong,
                })
    measured = [p for p in points if not p["default_extrapolated"]]
    for p in points:
        if p["default_extrapolated"] and len(measured) >= 2:
            a, b = measured[-2], measured[-1]
            slope = (b["default_s"] - a["default_s"]) / (b["samples"] - a["samples"])
            p["default_s"] = b["default_s"] + slope * (p["samples"] - b["samples"])
    return {
        "benchmark": "hf_resume_bench",
        "rows": args.rows,
        "batch": args.batch,
        "reps": args.reps,
        "points": points,
        "versions": versions("transformers", "accelerate", "torch", "grpcio"),
    }


def table(result: dict[str, Any]) -> str:
    """The Markdown table loadtest/README.md quotes."""
    lines = [
        f"| resumed at (samples in) | global step (batch {result['batch']}) | ShardStreamTrainer: first trained batch | "
        "Trainer default (skip_first_batches) | default / integration |",
        "|---:|---:|---:|---:|---:|",
    ]
    for p in result["points"]:
        default = p["default_s"]
        mark = " (extrapolated)" if p["default_extrapolated"] else ""
        shown = "n/a" if default is None else f"{default:,.2f} s{mark}"
        ratio = "n/a" if default is None else f"{default / p['integration_s']:,.1f}x"
        lines.append(f"| {p['samples']:,} | {p['step']:,} | {p['integration_s']:.2f} s | {shown} | {ratio} |")
    return "\n".join(lines)


def report(result: dict[str, Any]) -> None:
    print(table(result))
    for p in result["points"]:
        for w in p["wrong_batches"]:
            print(f"WRONG FIRST BATCH at N={p['samples']:,}: {w}")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.hf_resume_bench", __doc__)
    ap.add_argument("--at", type=int, nargs="+", default=list(DEFAULT_AT), help="samples into the run (default 100 10000 1000000)")
    ap.add_argument(
        "--default-up-to", type=int, default=max(DEFAULT_AT),
        help="measure the Trainer's default up to this N; above it, extrapolate (default 1000000: all measured)",
    )
    ap.add_argument("--rows", type=int, default=DEFAULT_ROWS, help=f"dataset rows (default {DEFAULT_ROWS:,})")
    ap.add_argument("--batch", type=int, default=DEFAULT_BATCH, help=f"per-device batch (default {DEFAULT_BATCH})")
    ap.add_argument("--reps", type=int, default=DEFAULT_REPS, help=f"measurements per point (default {DEFAULT_REPS})")

    def check(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
        bad = [n for n in a.at if n <= 0 or n % a.batch]
        if bad:
            parser.error(f"--at: each N must be a positive multiple of --batch {a.batch}: {bad}")
        a.at = sorted(a.at)

    return bench_main(
        ap, argv, run, json_default=results_path("hf_resume_bench"), report=report, check=check,
        failed=lambda r: any(p["wrong_batches"] for p in r["points"]),
    )


if __name__ == "__main__":
    raise SystemExit(main())

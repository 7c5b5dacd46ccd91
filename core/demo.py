"""`shardstream demo`: the whole loop on one machine, with nothing to set up.

1. make a small classification dataset as JSON Lines and ingest it;
2. start two shard-reader servers as subprocesses;
3. train a tiny torch model on 2 ranks (processes), batch 32, and "preempt" them mid-epoch after
   saving a checkpoint: model replicas averaged, plus the Loader state (one global offset);
4. resume on 3 ranks with batch 24 from that checkpoint and finish the epoch;
5. prove that every sample was seen exactly once, and shut the servers down gracefully.

Each rank is a process of its own (`python -m shardstream.demo rank …`) with its own Loader, like a
real training job; the ranks train model replicas that are averaged at each checkpoint (local SGD),
so no torch.distributed setup is needed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["run_demo"]

DATASET = "demo"
FEATURES = 8
CLASSES = 4


def _make_jsonl(path: Path, rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 1.0, size=(CLASSES, FEATURES))
    labels = rng.integers(0, CLASSES, size=rows)
    feats = centers[labels] + rng.normal(0, 1, size=(rows, FEATURES))
    with path.open("w") as f:
        for i in range(rows):
            f.write(
                json.dumps(
                    {"id": i, "features": [round(float(v), 4) for v in feats[i]], "label": int(labels[i])}
                )
                + "\n"
            )


def _model():  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES))


# --- one rank ------------------------------------------------------------------------------------
def _rank_main(argv: list[str]) -> int:
    import torch

    from shardstream.client import Loader

    p = argparse.ArgumentParser(prog="shardstream.demo rank")
    p.add_argument("--endpoints", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument(
        "--stop-after", type=int, default=0, help="steps before the simulated preemption (0: to the end)"
    )
    p.add_argument("--resume", help="checkpoint directory to resume from")
    p.add_argument("--out", required=True, help="directory for this rank's checkpoint and the ids it saw")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen: list[np.ndarray] = []
    losses: list[float] = []
    with Loader(
        a.endpoints.split(","),
        DATASET,
        batch_size=a.batch_size,
        rank=a.rank,
        world_size=a.world_size,
        seed=1234,
        shuffle=True,
        output="torch",
        columns=["id", "features", "label"],
    ) as loader:
        if a.resume:
            ckpt = Path(a.resume)
            loader.load_state_dict(json.loads((ckpt / "loader.json").read_text()))
            model.load_state_dict(torch.load(ckpt / "model.pt"))
        step = 0
        for batch in loader:
            seen.append(batch["id"].numpy().copy())
            x, y = batch["features"].float(), batch["label"].long()
            if len(y):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            step += 1
            if a.stop_after and step == a.stop_after:
                break
        state = loader.state_dict()
    (out / "loader.json").write_text(json.dumps(state, sort_keys=True))
    torch.save(model.state_dict(), out / "model.pt")
    np.save(out / "seen.npy", np.concatenate(seen) if seen else np.empty(0, np.int64))
    (out / "summary.json").write_text(
        json.dumps({"steps": step, "first_loss": losses[:10], "last_loss": losses[-10:]})
    )
    return 0


def _evaluate(model_path: Path, root: Path) -> float:
    import pyarrow.parquet as pq
    import torch

    from shardstream.registry import Registry

    reg = Registry(root)
    m = reg.resolve(DATASET)
    table = pq.read_table([str(reg.shard_path(m, s.uri)) for s in m.shards])
    x = torch.tensor(np.stack(table.column("features").to_numpy(zero_copy_only=False)), dtype=torch.float32)
    y = torch.tensor(table.column("label").to_numpy())
    model = _model()
    model.load_state_dict(torch.load(model_path))
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def _average(models: list[Path], out: Path) -> None:
    import torch

    states = [torch.load(p) for p in models]
    torch.save({k: sum(s[k] for s in states) / len(states) for k in states[0]}, out)


# --- the orchestration ---------------------------------------------------------------------------
def _run_ranks(
    phase: str,
    endpoints: str,
    world: int,
    batch: int,
    work: Path,
    *,
    stop_after: int = 0,
    resume: Path | None = None,
) -> list[Path]:
    outs = [work / phase / f"rank{r}" for r in range(world)]
    procs = []
    for r, out in enumerate(outs):
        cmd = [
            sys.executable,
            "-m",
            "shardstream.demo",
            "rank",
            "--endpoints",
            endpoints,
            "--rank",
            str(r),
            "--world-size",
            str(world),
            "--batch-size",
            str(batch),
            "--out",
            str(out),
        ]
        if stop_after:
            cmd += ["--stop-after", str(stop_after)]
        if resume:
            cmd += ["--resume", str(resume)]
        procs.append(subprocess.Popen(cmd))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"{phase}: rank exit codes {codes}")
    return outs


def run_demo(rows: int = 20_000, workdir: str | None = None, keep: bool = False) -> int:
    from shardstream.server.fleet import LocalServer
    from shardstream.server.ingest import IngestOptions, ingest

    try:
        import torch  # noqa: F401
    except ImportError:
        print("shardstream demo needs torch: pip install 'shardstream[torch]'", file=sys.stderr)
        return 1
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="shardstream-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    root = work / "datasets"
    t0 = time.monotonic()
    print(f"== shardstream demo in {work}")

    src = work / "demo.jsonl"
    _make_jsonl(src, rows)
    m = ingest(src, DATASET, root, IngestOptions(row_group_rows=1000, shard_rows=5000))
    print(f"1. ingested {rows} samples as {m.ref}: {len(m.shards)} shards, fingerprint {m.fingerprint[:12]}")

    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    servers = [LocalServer(root, metrics=True, log_path=logs / f"server{i}.log") for i in range(2)]
    try:
        for s in servers:
            s.start()
        endpoints = ",".join(s.target for s in servers)
        print(f"2. two servers up at {endpoints} (logs in {logs})")

        w1, b1, w2, b2 = 2, 32, 3, 24
        steps1 = max(1, (rows // (w1 * b1)) // 2)
        outs1 = _run_ranks("phase1", endpoints, w1, b1, work, stop_after=steps1)
        states = [json.loads((o / "loader.json").read_text()) for o in outs1]
        if any(s != states[0] for s in states):
            raise RuntimeError("ranks disagree on the loader state")
        ckpt = work / "checkpoint"
        ckpt.mkdir(exist_ok=True)
        (ckpt / "loader.json").write_text(json.dumps(states[0], sort_keys=True))
        _average([o / "model.pt" for o in outs1], ckpt / "model.pt")
        s1 = json.loads((outs1[0] / "summary.json").read_text())
        print(
            f"3. {w1} ranks x batch {b1} trained {steps1} steps (loss {np.mean(s1['first_loss']):.3f} -> "
            f"{np.mean(s1['last_loss']):.3f}), then were preempted; checkpoint at global offset {states[0]['offset']}"
        )

        outs2 = _run_ranks("phase2", endpoints, w2, b2, work, resume=ckpt)
        steps2 = json.loads((outs2[0] / "summary.json").read_text())["steps"]
        _average([o / "model.pt" for o in outs2], work / "model.pt")
        print(f"4. resumed on {w2} ranks x batch {b2} and finished the epoch in {steps2} more steps")

        seen = np.concatenate([np.load(o / "seen.npy") for o in outs1 + outs2])
        unique, counts = np.unique(seen, return_counts=True)
        missing = rows - len(unique)
        duplicated = int((counts > 1).sum())
        ok = missing == 0 and duplicated == 0 and len(seen) == rows
        accuracy = _evaluate(work / "model.pt", root)
        print(
            f"5. samples delivered: {len(seen)} of {rows}; missing {missing}; seen twice {duplicated} -> "
            f"{'EXACTLY ONCE' if ok else 'MISMATCH'}; accuracy of the averaged model {accuracy:.1%}"
        )
    finally:
        codes = [s.stop() for s in servers]
    print(f"6. servers drained and stopped (exit codes {codes}) in {time.monotonic() - t0:.1f} s total")
    if not keep and not workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok and codes == [0, 0] else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        sys.exit(_rank_main(sys.argv[2:]))
    sys.exit(run_demo())

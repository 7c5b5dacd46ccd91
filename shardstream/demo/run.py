"""The demo's orchestration: dataset, servers, ranks, preemption, resume on another world size, proof."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .images import IMAGE_SIDE, image_phase
from .rank import CLASSES, DATASET, FEATURES, JOB, model

__all__ = ["run_demo"]


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


def _seen(out: Path, upto: int | None = None, after: int = 0) -> list[int]:
    """Ids a rank trained on in job steps (after, upto]."""
    path = out / "seen.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [i for r in recs if after < r["step"] and (upto is None or r["step"] <= upto) for i in r["ids"]]


def _evaluate(model_path: Path, root: Path) -> float:
    import pyarrow.parquet as pq
    import torch

    from shardstream.registry import Registry

    reg = Registry(root)
    m = reg.resolve(DATASET)
    table = pq.read_table([str(reg.shard_path(m, s.uri)) for s in m.shards])
    x = torch.tensor(np.stack(table.column("features").to_numpy(zero_copy_only=False)), dtype=torch.float32)
    y = torch.tensor(table.column("label").to_numpy())
    net = model()
    net.load_state_dict(torch.load(model_path))
    with torch.no_grad():
        return float((net(x).argmax(1) == y).float().mean())


def _average(models: list[Path], out: Path) -> None:
    import torch

    states = [torch.load(p) for p in models]
    torch.save({k: sum(s[k] for s in states) / len(states) for k in states[0]}, out)


# --- the orchestration ---------------------------------------------------------------------------
class _Ranks:
    def __init__(self, endpoints: str, store: str, work: Path, every: int) -> None:
        self.endpoints, self.store, self.work, self.every = endpoints, store, work, every

    def start(self, phase: str, rank: int, world: int, batch: int, *extra: str) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable,
            "-m",
            "shardstream.demo",
            "rank",
            "--endpoints",
            self.endpoints,
            "--rank",
            str(rank),
            "--world-size",
            str(world),
            "--batch-size",
            str(batch),
            "--store",
            self.store,
            "--out",
            str(self.work / phase / f"rank{rank}"),
            "--commit-every",
            str(self.every),
            *extra,
        ]
        return subprocess.Popen(cmd)


def _wait_for_step(out: Path, step: int, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(json.loads(line)["step"] >= step for line in _lines(out / "seen.jsonl")):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"rank in {out} stopped before step {step}")
        time.sleep(0.05)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def run_demo(rows: int = 20_000, workdir: str | None = None, keep: bool = False) -> int:
    from shardstream.client.cursors.stores import open_store
    from shardstream.server.local_fleet import LocalServer
    from shardstream.server.writing.ingest import IngestOptions, ingest

    try:
        import torch  # noqa: F401
    except ImportError:
        print("shardstream demo needs torch: pip install 'shardstream[torch]'", file=sys.stderr)
        return 1
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="shardstream-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    root = work / "datasets"
    t0 = time.monotonic()
    store_url = os.environ.get("REDIS_URL") or f"sqlite:///{(work / 'cursors.db').resolve()}"
    print(f"== shardstream demo in {work} (cursor store: {store_url})")
    store = open_store(store_url)
    if JOB in store.jobs() and store.committed(JOB):
        print(f"   note: the store already holds job {JOB!r}; its new steps overwrite the old ones")

    src = work / "demo.jsonl"
    _make_jsonl(src, rows)
    m = ingest(src, DATASET, root, IngestOptions(row_group_rows=1000, shard_rows=5000))
    print(f"1. ingested {rows} samples as {m.ref}: {len(m.shards)} shards, fingerprint {m.fingerprint[:12]}")

    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    servers = [LocalServer(root, metrics=True, log_path=logs / f"server{i}.log") for i in range(2)]
    ok = False
    try:
        for s in servers:
            s.start()
        endpoints = ",".join(s.target for s in servers)
        print(f"2. two servers up at {endpoints} (logs in {logs})")

        w1, b1, w2, b2 = 2, 32, 3, 24
        steps1 = rows // (w1 * b1)
        every = max(2, steps1 // 12)  # checkpoint interval, in steps
        stop = max(2 * every, steps1 // 2 // every * every)  # the preemption, at a checkpoint
        die = max(2, stop * 3 // 5)  # rank 1 crashes here, some steps after a checkpoint
        kill_server_at = max(1, stop // 4)
        ranks = _Ranks(endpoints, store_url, work, every)
        p1 = [
            ranks.start("phase1", 0, w1, b1, "--stop-at", str(stop)),
            ranks.start("phase1", 1, w1, b1, "--stop-at", str(stop), "--die-at", str(die)),
        ]
        _wait_for_step(work / "phase1" / "rank0", kill_server_at, p1[0])
        servers[0].kill()
        print(
            f"3. {w1} ranks x batch {b1} training; at step {kill_server_at} server 0 got SIGKILL — the ranks "
            "failed over to server 1"
        )
        servers[0].start()
        code = p1[1].wait()
        again = ranks.start(
            "phase1b",
            1,
            w1,
            b1,
            "--stop-at",
            str(stop),
            "--resume",
            "--ckpt-dir",
            str(work / "phase1" / "rank1"),
        )
        if again.wait() != 0 or p1[0].wait() != 0:
            raise RuntimeError("a phase-1 rank failed")
        restarted_at = json.loads(_lines(work / "phase1b" / "rank1" / "seen.jsonl")[0])["step"] - 1
        print(
            f"4. rank 1 got SIGKILL after step {die} (exit {code}); restarted, it resumed at the job's latest "
            f"committed step {restarted_at} with its model checkpoint of that step (server 0 is back at "
            f"{servers[0].target})"
        )
        committed = store.committed(JOB)[-1]
        print(f"5. both ranks reached step {stop} and committed it; the job is preempted there")

        _average(
            [work / "phase1" / "rank0" / f"model-{stop}.pt", work / "phase1b" / "rank1" / f"model-{stop}.pt"],
            work / "model-preempted.pt",
        )
        p2 = [
            ranks.start("phase2", r, w2, b2, "--resume", "--init-model", str(work / "model-preempted.pt"))
            for r in range(w2)
        ]
        if any(p.wait() != 0 for p in p2):
            raise RuntimeError("a phase-2 rank failed")
        _average([work / "phase2" / f"rank{r}" / "model-final.pt" for r in range(w2)], work / "model.pt")
        steps2 = json.loads((work / "phase2" / "rank0" / "summary.json").read_text())["steps"] - committed
        print(
            f"6. resumed from step {committed} on {w2} ranks x batch {b2}: the epoch finished in {steps2} more steps"
        )

        # What the model trained on: rank 1's first life counts up to its checkpoint only.
        seen = np.asarray(
            _seen(work / "phase1" / "rank0", upto=stop)
            + _seen(work / "phase1" / "rank1", upto=restarted_at)
            + _seen(work / "phase1b" / "rank1", after=restarted_at, upto=stop)
            + [i for r in range(w2) for i in _seen(work / "phase2" / f"rank{r}", after=committed)],
            dtype=np.int64,
        )
        unique, counts = np.unique(seen, return_counts=True)
        missing = rows - len(unique)
        duplicated = int((counts > 1).sum())
        ok = missing == 0 and duplicated == 0 and len(seen) == rows
        accuracy = _evaluate(work / "model.pt", root)
        print(
            f"7. samples trained on: {len(seen)} of {rows}; missing {missing}; seen twice {duplicated} -> "
            f"{'EXACTLY ONCE' if ok else 'MISMATCH'}; accuracy of the averaged model {accuracy:.1%}"
        )
        ok = image_phase(work, root, endpoints) and ok
    finally:
        codes = [s.stop() for s in servers]
        store.close()
    print(f"9. servers drained and stopped (exit codes {codes}) in {time.monotonic() - t0:.1f} s total")
    if not keep and not workdir:  # the rest goes; the datasets and cursors stay for the visualizers
        for path in work.iterdir():
            if path.name not in ("datasets", "cursors.db"):
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    _visualizer_lines(work, root, store_url, removable=not keep and not workdir)
    return 0 if ok and codes == [0, 0] else 1


def _visualizer_lines(work: Path, root: Path, store_url: str, removable: bool) -> None:
    """The commands that open what the demo trained on, as each rank received it."""
    # phase 1's job (2 ranks x 32, seed 0) and the image phase's training transforms (images.py)
    train = [
        {"op": "image.decode", "column": "image", "size": [IMAGE_SIDE, IMAGE_SIDE], "layout": "CHW", "crop": "random",
         "hflip": True, "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}}
    ]
    tf = shlex.quote(json.dumps(train, separators=(",", ":")))
    store = shlex.quote(store_url)
    print("10. look at what the ranks received (the job's steps are on the Jobs page):")
    print(f"    shardstream web --root {root} --store {store} --port 8080 {DATASET} --world-size 2 --batch-size 32")
    print(f"    shardstream view --root {root} shapes --seed 1 --batch-size 32 --columns image,label --transforms {tf}")
    if removable:
        print(f"    (the datasets and cursors were kept for them in {work}: rm -rf {work} when done)")

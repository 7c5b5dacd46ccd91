"""`shardstream demo`: the whole loop on one machine, with nothing to set up.

1. make a small classification dataset as JSON Lines and ingest it;
2. start two shard-reader servers as subprocesses;
3. train a tiny torch model on 2 ranks (processes), batch 32, and "preempt" them mid-epoch after
   saving a checkpoint: model replicas averaged, plus the Loader state (one global offset);
4. resume on 3 ranks with batch 24 from that checkpoint and finish the epoch;
5. prove that every sample was seen exactly once;
6. server-side decode: ingest a folder of PNG images, train a small CNN on batches the fleet decoded,
   cropped and normalised (image.decode) — the trainer decodes nothing — and shut the servers down.

Each rank is a process of its own (`python -m shardstream.demo rank …`) with its own Loader, like a
real training job; the ranks train model replicas that are averaged at each checkpoint (local SGD),
so no torch.distributed setup is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["run_demo"]

DATASET = "demo"
JOB = "demo-job"
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
    p.add_argument("--store", required=True, help="cursor store URL")
    p.add_argument("--commit-every", type=int, required=True, help="checkpoint interval in steps")
    p.add_argument(
        "--stop-at", type=int, default=0, help="job step of the simulated preemption (0: epoch end)"
    )
    p.add_argument("--die-at", type=int, default=0, help="SIGKILL this process after this job step (a crash)")
    p.add_argument("--resume", action="store_true", help="resume from the job's latest committed step")
    p.add_argument("--ckpt-dir", help="where this rank's model-STEP.pt checkpoints are (default: --out)")
    p.add_argument(
        "--init-model", help="model weights to resume from when there is no checkpoint of the step"
    )
    p.add_argument("--out", required=True, help="directory for checkpoints and the ids this rank saw")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
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
        job=JOB,
        cursor_store=a.store,
        resume="latest" if a.resume else None,
    ) as loader:
        step = loader.resumed_from or 0  # the job step this rank's checkpoint is for
        if a.resume:
            mine = Path(a.ckpt_dir or out) / f"model-{step}.pt"
            model.load_state_dict(torch.load(mine if mine.exists() else a.init_model))
        with (out / "seen.jsonl").open("a") as seen:
            for batch in loader:
                step += 1
                x, y = batch["features"].float(), batch["label"].long()
                if len(y):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
                seen.write(json.dumps({"step": step, "ids": batch["id"].tolist()}) + "\n")
                seen.flush()
                if step % a.commit_every == 0 or step == a.stop_at:
                    torch.save(model.state_dict(), out / f"model-{step}.pt")  # the model checkpoint ...
                    loader.commit(step)  # ... and the data cursor describe the same step
                if step == a.die_at:
                    loader.flush_commits()
                    os.kill(os.getpid(), signal.SIGKILL)  # a crash: no cleanup, threads and all
                if step == a.stop_at:
                    break
        loader.flush_commits()
    torch.save(model.state_dict(), out / "model-final.pt")
    (out / "summary.json").write_text(
        json.dumps({"steps": step, "first_loss": losses[:10], "last_loss": losses[-10:]})
    )
    return 0


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
    model = _model()
    model.load_state_dict(torch.load(model_path))
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


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


# --- server-side decode ----------------------------------------------------------------------------
IMAGE_CLASSES = ("red", "green", "blue", "yellow")
IMAGE_SIDE = 32


def _make_images(src: Path, per_class: int, seed: int = 0) -> None:
    """PNG files in src/<colour>/: a noisy background with a rectangle of the class's colour."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    colours = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (40, 60, 220), "yellow": (230, 220, 40)}
    for name in IMAGE_CLASSES:
        (src / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = (int(v) for v in rng.integers(40, 72, 2))
            img = Image.fromarray(rng.integers(0, 140, (h, w, 3), dtype=np.uint8))
            x0, y0 = int(rng.integers(0, w // 3)), int(rng.integers(0, h // 3))
            ImageDraw.Draw(img).rectangle((x0, y0, x0 + w // 2, y0 + h // 2), fill=colours[name])
            img.save(src / name / f"{i:04d}.png")


def _image_phase(work: Path, root: Path, endpoints: str) -> bool:
    import torch

    from shardstream.client import Loader
    from shardstream.server.ingest import IngestOptions, ingest

    src = work / "images"
    _make_images(src, per_class=96)
    m = ingest(src, "shapes", root, IngestOptions(row_group_rows=64, progress=False))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, len(IMAGE_CLASSES)),
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    decode = {
        "op": "image.decode",
        "column": "image",
        "size": [IMAGE_SIDE, IMAGE_SIDE],
        "layout": "CHW",
        "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
    }
    train = [{**decode, "crop": "random", "hflip": True}]
    cpu0 = time.process_time()
    with Loader(
        endpoints.split(","),
        m.ref,
        batch_size=32,
        epochs=4,
        seed=1,
        columns=["image", "label"],
        transforms=train,
        output="torch",
    ) as loader:
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["image"]), batch["label"].long())
            opt.zero_grad()
            loss.backward()
            opt.step()
            shape = tuple(batch["image"].shape)
    correct = 0
    with (
        torch.no_grad(),
        Loader(
            endpoints.split(","),
            m.ref,
            batch_size=64,
            shuffle=False,
            columns=["image", "label"],
            transforms=[decode],
            output="torch",
        ) as loader,
    ):
        for batch in loader:
            correct += int((model(batch["image"]).argmax(1) == batch["label"].long()).sum())
    accuracy = correct / m.num_rows
    print(
        f"8. server-side decode: {m.num_rows} PNGs as {m.ref}; the fleet decoded, cropped and normalised them "
        f"(image.decode) into float32 batches of {list(shape)}; a small CNN trained 4 epochs on them "
        f"(trainer CPU {time.process_time() - cpu0:.1f} s, no image decoded here): accuracy {accuracy:.1%}"
    )
    return accuracy > 0.5


def run_demo(rows: int = 20_000, workdir: str | None = None, keep: bool = False) -> int:
    from shardstream.client.stores import open_store
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
        ok = _image_phase(work, root, endpoints) and ok
    finally:
        codes = [s.stop() for s in servers]
        store.close()
    print(f"9. servers drained and stopped (exit codes {codes}) in {time.monotonic() - t0:.1f} s total")
    if not keep and not workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok and codes == [0, 0] else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        sys.exit(_rank_main(sys.argv[2:]))
    sys.exit(run_demo())

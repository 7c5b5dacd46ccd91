"""One trainer process of the chaos suite: one or more ranks of a job, each a thread with its own Loader.

    python -m loadtest.chaos_rank CONFIG.json      (CONFIG: a TrainerConfig as JSON)

Every rank appends JSON lines to LOG_DIR/rank-R.jsonl, flushed line by line (a SIGKILL loses nothing
written), and the driver (loadtest/chaos_job.py) reads them as they grow:

    {"phase", "rank", "pid", "start": S, "how": "fresh"|"store"|"checkpoint", "error": ...}
    {"phase", "rank", "s": step, "e": epoch, "p": [first, end) global positions, "k": [sample keys],
     "w": seconds the loop waited for this batch, "t": time.time()}
    {"phase", "rank", "commit_failed": step, "error": "..."}        a commit the store did not take
    {"phase", "rank", "held": step, "f": ...}                       at `hold_at`, blocked until killed
    {"phase", "rank", "end": steps, "f": ..., "retries": ...}       the epochs are done
    {"phase", "rank", "error": "DataLossError", "message", "f"}     a typed error ended the rank

("f": the rank's failovers so far, shardstream_client_failovers_total; a killed rank's are not known.)

Steps count from the job's start: a resumed rank starts at the step it resumed from. Sample keys make
content checkable against the plan: "id" is the `id` column, "source_id" adds `_source * KEY_STRIDE`
(mixtures), "text" parses the key each document's text starts with ("KEY:...") out of packed tokens
(text.tokenize with the bytes tokenizer, then text.pack).

With a job (`job`, `store`) every rank commits each `commit_every` steps and waits for its commit
(flush_commits: a failure is logged as commit_failed and training goes on); with `checkpoint_dir`
the ranks of the process then meet (a barrier: they are one job's ranks) and the first of them saves
the "model checkpoint" of that step: {"step", "state": loader.state_dict()}. A resumed process uses
resume="latest" with resume_min_step = its newest checkpoint's step; if the store cannot give that
(CursorStoreBehindError, NoCommittedStepError) and `fallback_to_checkpoint` is set, it loads the
checkpoint's state instead (load_state_dict) — otherwise the typed error ends it.

With `lockstep` the job's ranks, in whatever processes, meet before each commit (_Lockstep), as a
data-parallel job's ranks do at every all-reduce; `late_rank` makes one rank open its Loader only once
another has logged a step of the phase (a process slow to start).

Exit status: 0 done, 3 a typed shardstream error (logged), 1 anything else (a traceback).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import REGISTRY

from shardstream.client import Loader
from shardstream.errors import CursorStoreBehindError, NoCommittedStepError, ShardstreamError

__all__ = ["KEY_STRIDE", "TrainerConfig", "main", "packed_keys"]

KEY_STRIDE = 1_000_000_000  # key of row r of mixture source s: s * KEY_STRIDE + r
EXIT_TYPED_ERROR = 3
BYTES_EOS = 256  # the bytes tokenizer's EOS (server/transforms/text.py)
FAILOVERS = "shardstream_client_failovers_total"
RETRIES = "shardstream_client_stream_retries_total"


@dataclass
class TrainerConfig:
    endpoints: list[str]
    dataset: str | dict[str, float]
    ranks: list[int]
    world_size: int
    batch_size: int
    log_dir: str
    phase: int = 0
    seed: int = 0
    shuffle: str = "block"
    epochs: int = 1
    columns: list[str] | None = None
    transforms: list[dict[str, Any]] | None = None
    key: str = "id"  # id | source_id | text (module docstring)
    prefetch: int = 4
    timeout_s: float = 10.0
    max_retries: int = 6
    stream_idle_timeout_s: float = 60.0
    max_message_bytes: int = 0  # the Loader's (0: the server's default)
    step_ms: float = 0.0  # simulated compute per step (time.sleep releases the GIL, as a GPU step does)
    job: str | None = None
    store: str | None = None
    resume: bool = False
    commit_every: int = 0
    commit_timeout_s: float = 10.0
    checkpoint_dir: str | None = None
    fallback_to_checkpoint: bool = False
    hold_at: int = 0  # after this step: log "held", then block until killed
    lockstep: bool = False  # ranks in several processes meet before each commit (_Lockstep)
    late_rank: int | None = None  # this rank opens its Loader once another has logged a step (_start_late)
    env: dict[str, str] = field(default_factory=dict)  # for the driver: extra environment of the process

    def dump(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path


def packed_keys(batch: dict[str, np.ndarray], first: int, end: int) -> list[int]:
    """The key of every position in [first, end) from text.pack rows: the tokens of each document
    (document_ids), EOS dropped, read as UTF-8 "KEY:..."; -1 where a position has no document and
    -2 for a document outside [first, end) (both count as wrong content)."""
    ids = batch["input_ids"].reshape(-1)
    docs = batch["document_ids"].reshape(-1)
    keep = (docs >= 0) & (ids != BYTES_EOS)
    ids, docs = ids[keep], docs[keep]
    out = [-1] * (end - first)
    if not len(docs):
        return out
    order = np.argsort(docs, kind="stable")  # tokens of a document stay in stream order
    ids, docs = ids[order], docs[order]
    starts = np.flatnonzero(np.r_[True, docs[1:] != docs[:-1]])
    for a, b in zip(starts, [*starts[1:], len(docs)], strict=True):
        d = int(docs[a])
        if not first <= d < end:
            return [-2] * (end - first)
        text = bytes(ids[a:b].astype(np.uint8)).decode("utf-8", errors="replace")
        head = text.split(":", 1)[0]
        out[d - first] = int(head) if head.isdigit() else -1
    return out


def _client_metric(name: str, cfg: TrainerConfig, rank: int) -> int:
    """A client counter of this rank (shardstream.client.metrics: labelled by job_name and rank)."""
    value = REGISTRY.get_sample_value(name, {"job_name": cfg.job or "", "rank": str(rank)})
    return int(value or 0)


def _keys(cfg: TrainerConfig, batch: dict[str, np.ndarray], first: int, end: int) -> list[int]:
    if cfg.key == "text":
        return packed_keys(batch, first, end)
    keys = batch["id"].astype(np.int64)
    if cfg.key == "source_id":
        keys = keys + batch["_source"].astype(np.int64) * KEY_STRIDE
    return keys.tolist()


class _Shared:
    """What the rank threads of the process share: the checkpoint files and the barrier of a commit."""

    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        self.barrier = threading.Barrier(len(cfg.ranks))
        self.dir = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        self.held = threading.Event()

    def newest_checkpoint(self) -> dict[str, Any] | None:
        if self.dir is None or not self.dir.is_dir():
            return None
        steps = sorted(int(p.stem) for p in self.dir.glob("*.json"))
        return json.loads((self.dir / f"{steps[-1]}.json").read_text()) if steps else None

    def save_checkpoint(self, step: int, state: dict[str, Any]) -> None:
        assert self.dir is not None
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{step}.tmp"
        tmp.write_text(json.dumps({"step": step, "state": state}))
        tmp.replace(self.dir / f"{step}.json")


class _Lockstep:
    """The job's ranks meet before each commit, across processes, as data-parallel ranks do (each
    step's all-reduce waits for every rank): no rank commits step N before every rank of the world has
    trained to step N or ended. Without it a rank that starts late lets its peer run ahead alone, and
    a step can complete with a record the late rank's slot still holds from an earlier, abandoned run
    (client/cursors/fence.py: what a store cannot tell without a coordinator). Each rank keeps its
    newest step in LOG_DIR/lockstep-pPHASE/RANK, replaced whole."""

    ENDED = sys.maxsize

    def __init__(self, cfg: TrainerConfig) -> None:
        self.dir = Path(cfg.log_dir) / f"lockstep-p{cfg.phase}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.world = cfg.world_size
        self.timeout_s = cfg.stream_idle_timeout_s * 2

    def reached(self, rank: int, step: int) -> None:
        tmp = self.dir / f".{rank}.tmp"
        tmp.write_text(str(step))
        tmp.replace(self.dir / str(rank))

    def _step(self, rank: int) -> int:
        try:
            return int((self.dir / str(rank)).read_text())
        except FileNotFoundError:
            return -1

    def meet(self, rank: int, step: int) -> None:
        self.reached(rank, step)
        _poll(
            lambda: all(self._step(r) >= step for r in range(self.world)),
            self.timeout_s,
            f"rank {rank}: the job's ranks did not all reach step {step}",
        )


def _start_late(cfg: TrainerConfig, rank: int) -> None:
    """A rank whose process was slow to start: wait until another rank of the phase has logged a step
    (reading their logs)."""
    others = [Path(cfg.log_dir) / f"rank-{r}.jsonl" for r in range(cfg.world_size) if r != rank]
    _poll(
        lambda: any(_stepped(path, cfg.phase) for path in others),
        cfg.stream_idle_timeout_s * 2,
        f"rank {rank}: no other rank logged a step",
    )


def _poll(done: Callable[[], bool], timeout_s: float, failure: str) -> None:
    """Wait until `done()` (what peers wrote in files), or raise RuntimeError(failure) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(failure)
        time.sleep(0.002)  # a poll of the peers' files, not a wait for time to pass


def _stepped(log: Path, phase: int) -> bool:
    with contextlib.suppress(FileNotFoundError):
        for line in log.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line being written
                rec = json.loads(line)
                if rec["phase"] == phase and "s" in rec:
                    return True
    return False


def _loader(cfg: TrainerConfig, rank: int, resume: bool, min_step: int | None) -> Loader:
    return Loader(
        cfg.endpoints,
        cfg.dataset,
        batch_size=cfg.batch_size,
        rank=rank,
        world_size=cfg.world_size,
        seed=cfg.seed,
        shuffle=cfg.shuffle,
        epochs=cfg.epochs,
        columns=cfg.columns,
        transforms=cfg.transforms,
        provenance=cfg.key == "source_id",
        prefetch=cfg.prefetch,
        timeout_s=cfg.timeout_s,
        max_retries=cfg.max_retries,
        stream_idle_timeout_s=cfg.stream_idle_timeout_s,
        max_message_bytes=cfg.max_message_bytes,
        job=cfg.job,
        cursor_store=cfg.store,
        resume="latest" if resume else None,
        resume_min_step=min_step if resume else None,
    )


def _open(cfg: TrainerConfig, rank: int, shared: _Shared, log: Any) -> tuple[Loader, int]:
    """The rank's Loader, resumed as configured, and the step it starts after (logged)."""
    ckpt = shared.newest_checkpoint() if cfg.resume else None
    ld = _loader(cfg, rank, cfg.resume, ckpt["step"] if ckpt else None)
    how, error, start = "fresh", None, 0
    if cfg.resume:
        try:
            start = ld.resumed_from or 0
            how = "store"
        except (CursorStoreBehindError, NoCommittedStepError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            ld.close()
            if not (cfg.fallback_to_checkpoint and ckpt):
                log({"start": None, "how": "failed", "error": error})
                raise
            ld = _loader(cfg, rank, False, None)
            ld.load_state_dict(ckpt["state"])
            how, start = "checkpoint", ckpt["step"]
    log({"pid": os.getpid(), "start": start, "how": how, "error": error, "t": round(time.time(), 3)})
    return ld, start


def _rank(cfg: TrainerConfig, rank: int, shared: _Shared, failures: list[BaseException]) -> None:
    path = Path(cfg.log_dir) / f"rank-{rank}.jsonl"
    lockstep = _Lockstep(cfg) if cfg.lockstep else None
    with path.open("a") as f:

        def log(rec: dict[str, Any]) -> None:
            f.write(json.dumps({"phase": cfg.phase, "rank": rank, **rec}) + "\n")
            f.flush()

        try:
            if cfg.late_rank == rank:
                _start_late(cfg, rank)
            ld, step = _open(cfg, rank, shared, log)
            with ld:
                it = iter(ld)
                while True:
                    t0 = time.perf_counter()
                    batch = next(it, None)
                    if batch is None:
                        break
                    wait = time.perf_counter() - t0
                    step += 1
                    info = ld.last_batch
                    assert info is not None
                    first, end = info.position_start, info.position_end
                    log(
                        {
                            "s": step,
                            "e": info.epoch,
                            "p": [first, end],
                            "k": _keys(cfg, batch, first, end),
                            "w": round(wait, 5),
                            "t": round(time.time(), 3),
                        }
                    )
                    if cfg.job and cfg.commit_every and step % cfg.commit_every == 0:
                        if lockstep is not None:
                            lockstep.meet(rank, step)
                        _commit(cfg, ld, step, shared, log, rank)
                    if step == cfg.hold_at:
                        log({"held": step, "f": _client_metric(FAILOVERS, cfg, rank)})
                        shared.held.wait()  # never set: the driver kills the process here
                    if cfg.step_ms:
                        time.sleep(cfg.step_ms / 1000)
                log(
                    {
                        "end": step,
                        "f": _client_metric(FAILOVERS, cfg, rank),
                        "retries": _client_metric(RETRIES, cfg, rank),
                    }
                )
        except ShardstreamError as exc:
            log(
                {
                    "error": type(exc).__name__,
                    "message": str(exc)[:4000],
                    "f": _client_metric(FAILOVERS, cfg, rank),
                }
            )
            failures.append(exc)
            shared.barrier.abort()
        except threading.BrokenBarrierError as exc:  # another rank of the process failed first
            log({"aborted": True})
            failures.append(exc)
        except BaseException as exc:
            failures.append(exc)
            shared.barrier.abort()
            raise
        finally:
            if lockstep is not None:  # a rank that ended holds nobody back
                lockstep.reached(rank, _Lockstep.ENDED)


def _commit(cfg: TrainerConfig, ld: Loader, step: int, shared: _Shared, log: Any, rank: int) -> None:
    ld.commit(step)
    try:
        ld.flush_commits(timeout_s=cfg.commit_timeout_s)
    except ShardstreamError as exc:  # the store is down: training goes on, the failure is on record
        log({"commit_failed": step, "error": f"{type(exc).__name__}: {exc}"[:1000]})
    if shared.dir is not None:
        shared.barrier.wait()  # every rank of the job has committed this step (or failed to)
        if rank == cfg.ranks[0]:
            shared.save_checkpoint(step, ld.state_dict())
        shared.barrier.wait()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m loadtest.chaos_rank CONFIG.json", file=sys.stderr)
        return 2
    cfg = TrainerConfig(**json.loads(Path(args[0]).read_text()))
    shared = _Shared(cfg)
    failures: list[BaseException] = []
    threads = [
        threading.Thread(target=_rank, args=(cfg, r, shared, failures), name=f"rank-{r}", daemon=True)
        for r in cfg.ranks
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(not isinstance(e, ShardstreamError | threading.BrokenBarrierError) for e in failures):
        return 1
    return EXIT_TYPED_ERROR if failures else 0


if __name__ == "__main__":
    sys.exit(main())

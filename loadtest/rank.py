"""One simulated training rank of `python -m loadtest`, run as its own process.

    python -m loadtest.rank CONFIG.json

CONFIG holds the Loader arguments (endpoints, dataset, rank, world size, batch size, ...), the step
time, the duration and where to write. The rank builds its Loader and resolves the dataset, writes
its ready file, waits for the driver's go file (so every rank starts together), then runs the
training loop: `next(loader)` (timed: the data wait), then `step_ms` of simulated compute
(`time.sleep`, which releases the GIL as a GPU step would), until `duration_s` has passed (0: no
limit), `batches` batches were taken (0: no count) or its epochs are done. It writes a JSON summary and the per-batch record (.npz: wait, end time, rows,
bytes, global positions, epoch) for the driver.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.client import Loader

__all__ = ["main", "peak_rss_mib", "reset_peak_rss"]

GO_POLL_S = 0.005
GO_TIMEOUT_S = 600.0
MIB = 1 << 20


def reset_peak_rss(pid: int) -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM to the current RSS."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mib(pid: int) -> float | None:
    """VmHWM (peak resident set) of `pid`, MiB."""
    return _status_mib(pid, "VmHWM:")


def rss_mib(pid: int) -> float | None:
    return _status_mib(pid, "VmRSS:")


def _status_mib(pid: int, key: str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _nbytes(batch: Any) -> int:
    """Payload bytes of a delivered batch (numeric columns; object columns count their pointers)."""
    if isinstance(batch, dict):
        total = 0
        for v in batch.values():
            if hasattr(v, "element_size"):  # torch
                total += v.element_size() * v.numel()
            else:
                total += v.nbytes
        return total
    return int(batch.nbytes)  # pyarrow.RecordBatch


def _ids(batch: Any) -> np.ndarray | None:
    col = batch.get("id") if isinstance(batch, dict) else None
    if col is None and not isinstance(batch, dict) and "id" in batch.schema.names:
        col = batch.column("id").to_numpy()
    if col is None:
        return None
    return col.numpy() if hasattr(col, "numpy") else np.asarray(col)


def run(cfg: dict[str, Any]) -> None:
    pid = os.getpid()
    loader = Loader(
        cfg["endpoints"],
        cfg["dataset"],
        batch_size=cfg["batch_size"],
        rank=cfg["rank"],
        world_size=cfg["world_size"],
        seed=cfg["seed"],
        shuffle=cfg["shuffle"],
        epochs=cfg["epochs"],
        output=cfg["output"],
        prefetch=cfg["prefetch"],
        streams=cfg.get("streams", 1),
        max_message_bytes=cfg.get("max_message_bytes", 0),
    )
    with loader:
        _ = loader.target  # GetDataset now, not inside the timed loop
        Path(cfg["ready_path"]).write_text(json.dumps({"pid": pid}))
        go = Path(cfg["go_path"])
        parent, deadline = os.getppid(), time.monotonic() + GO_TIMEOUT_S
        while not go.exists():
            if os.getppid() != parent or time.monotonic() > deadline:
                raise SystemExit("the driver went away before the go")  # no orphan left waiting
            time.sleep(GO_POLL_S)
        step_s = cfg["step_ms"] / 1e3
        duration_s = cfg["duration_s"]
        batches = cfg.get("batches", 0)
        rss_start = rss_mib(pid)
        reset_peak_rss(pid)
        cpu0 = _cpu_s()
        waits: list[float] = []
        ends: list[float] = []
        rows: list[int] = []
        nbytes: list[int] = []
        pos: list[tuple[int, int, int]] = []  # (epoch, position_start, position_end)
        id_sum = id_count = 0
        t_start = time.perf_counter()
        it = iter(loader)
        finished = False
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                finished = True
                break
            t1 = time.perf_counter()
            info = loader.last_batch
            assert info is not None
            n = info.position_end - info.position_start
            waits.append(t1 - t0)
            rows.append(n)
            nbytes.append(_nbytes(batch))
            pos.append((info.epoch, info.position_start, info.position_end))
            ids = _ids(batch)
            if ids is not None:
                id_sum += int(ids.sum())
                id_count += len(ids)
            del batch
            if step_s > 0:
                time.sleep(step_s)  # the training step: the GIL is free, as during a GPU step
            ends.append(time.perf_counter() - t_start)
            if (duration_s and ends[-1] >= duration_s) or (batches and len(ends) >= batches):
                break
        wall = time.perf_counter() - t_start
        cpu = _cpu_s() - cpu0
        peak = peak_rss_mib(pid)
    np.savez(
        cfg["record_path"],
        wait_s=np.asarray(waits, np.float64),
        end_s=np.asarray(ends, np.float64),
        rows=np.asarray(rows, np.int64),
        nbytes=np.asarray(nbytes, np.int64),
        positions=np.asarray(pos, np.int64).reshape(-1, 3),
    )
    summary = {
        "rank": cfg["rank"],
        "pid": pid,
        "batches": len(waits),
        "rows": int(sum(rows)),
        "bytes": int(sum(nbytes)),
        "wall_s": wall,
        "finished_epochs": finished,
        "cpu_s": cpu,
        "cpu_s_total": _cpu_s(),
        "rss_start_mib": rss_start,
        "peak_rss_mib": peak,
        "id_sum": id_sum,
        "id_count": id_count,
        "prefetch_batches": cfg["prefetch"],
    }
    tmp = Path(cfg["result_path"] + ".tmp")
    tmp.write_text(json.dumps(summary))
    tmp.replace(cfg["result_path"])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m loadtest.rank CONFIG.json", file=sys.stderr)
        return 2
    run(json.loads(Path(args[0]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

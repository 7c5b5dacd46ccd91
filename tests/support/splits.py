"""Data-loader worker splits simulated from the pure cursor functions, as the prefetch thread runs them.

`worker_steps` is what one worker's Loader delivers (its steps and the cursor after each) from a
cursor, epoch after epoch — its first step of each later epoch from `RankStream.worker_epoch_start`,
as client/spec.py gives it; `round_robin` is the order DataLoader hands them to the training loop;
`rank_steps` is the stream without workers.
"""

from __future__ import annotations

from shardstream.order.cursor_math import NO_SPLIT, RankStream, WorkerSplit, cursor_after
from shardstream.order.scheduled_steps import split_start

__all__ = ["Step", "rank_steps", "round_robin", "worker_steps"]

Step = tuple[int, tuple[int, int], tuple[int, int]]  # (epoch, global range, cursor after it)


def rank_steps(stream: RankStream, cursor: tuple[int, int], epochs: int) -> list[Step]:
    """The rank's steps from `cursor` until `epochs`, without workers (as a Loader delivers them)."""
    out: list[Step] = []
    e, o = cursor
    while e < epochs:
        lay = stream.layout(o, e)
        out += [(e, lay.global_range(s), cursor_after(lay, e, s, NO_SPLIT)) for s in range(lay.num_steps)]
        e, o = e + 1, split_start(stream.layout(0, e + 1), 0)
    return out


def worker_steps(
    stream: RankStream, cursor: tuple[int, int], worker: int, workers: int, epochs: int, *, split: bool = True
) -> list[Step]:
    """Worker `worker`'s steps until `epochs`: from the rank's cursor (split=True: moved `worker`
    steps on, as Loader.split_steps does) or from the worker's own saved cursor (split=False)."""
    if split:
        first = stream.advance(*cursor, worker) if worker else cursor
        if first is None:
            return []
        cursor = first
    sp = WorkerSplit(worker, workers)
    out: list[Step] = []
    e, o = cursor
    while e < epochs:
        lay = stream.layout(o, e)
        out += [
            (e, lay.global_range(s), cursor_after(lay, e, s, sp)) for s in range(0, lay.num_steps, workers)
        ]
        e += 1
        o = (
            stream.worker_epoch_start(cursor, workers, e)
            if workers > 1
            else split_start(stream.layout(0, e), 0)
        )
    return out


def round_robin(per_worker: list[list[Step]]) -> list[Step]:
    """DataLoader's in-order hand-over: one item of each worker in turn, a finished worker left out."""
    out: list[Step] = []
    its = [iter(w) for w in per_worker]
    while its:
        alive = []
        for it in its:
            item = next(it, None)
            if item is not None:
                out.append(item)
                alive.append(it)
        its = alive
    return out

"""ShardStreamDataset under torch's DataLoader (0, 1, 2 workers) and torchdata's StatefulDataLoader."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from shardstream.client.torch_dataset import ShardStreamDataset

from .support.data import N_ROWS
from .support.resume import as_json, check_resume, ids


def ids_of(batches) -> list[int]:  # type: ignore[no-untyped-def]
    return [i for b in batches for i in b["id"].tolist()]


def reference(endpoints: list[str], **kw) -> list[int]:  # type: ignore[no-untyped-def]
    return ids_of(
        DataLoader(ShardStreamDataset(endpoints, "toy@1", batch_size=16, seed=2, **kw), batch_size=None)
    )


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_dataloader_workers_split_the_stream_in_order(endpoints: list[str], workers: int) -> None:
    ds = ShardStreamDataset(endpoints, "toy@1", batch_size=16, rank=1, world_size=2, seed=2)
    kw = dict(multiprocessing_context="spawn") if workers else {}
    got = ids_of(DataLoader(ds, batch_size=None, num_workers=workers, **kw))
    solo = ids_of(
        DataLoader(
            ShardStreamDataset(endpoints, "toy@1", batch_size=16, rank=1, world_size=2, seed=2),
            batch_size=None,
        )
    )
    assert got == solo and len(set(got)) == len(got)
    other = ids_of(
        DataLoader(
            ShardStreamDataset(endpoints, "toy@1", batch_size=16, rank=0, world_size=2, seed=2),
            batch_size=None,
        )
    )
    assert sorted(got + other) == list(range(N_ROWS))


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(endpoints: list[str], workers: int) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    kw = dict(multiprocessing_context="spawn") if workers else {}
    whole = reference(endpoints)

    def stateful() -> StatefulDataLoader:
        return StatefulDataLoader(
            ShardStreamDataset(endpoints, "toy@1", batch_size=16, seed=2),
            batch_size=None,
            num_workers=workers,
            **kw,
        )

    # a fresh StatefulDataLoader loads the state taken after 21 batches (and at 0, at the end)
    res = check_resume(stateful, cuts=[21], item=ids)
    assert [i for b in res.full for i in b] == whole


def test_a_global_state_resumes_under_workers(endpoints: list[str]) -> None:
    whole = reference(endpoints)

    def under_workers(state: dict[str, Any]) -> DataLoader:  # type: ignore[type-arg]
        ds2 = ShardStreamDataset(endpoints, "toy@1", batch_size=16, seed=2)
        ds2.load_state_dict(state)
        return DataLoader(ds2, batch_size=None, num_workers=2, multiprocessing_context="spawn")

    # the state of the dataset iterated on its own (after 7 batches, at 0, at the end) under 2 workers
    res = check_resume(
        lambda: ShardStreamDataset(endpoints, "toy@1", batch_size=16, seed=2),
        cuts=[7],
        item=ids,
        resume=under_workers,
        checkpoint=as_json,
    )
    assert [i for b in res.full for i in b] == whole


def test_tensors_and_pin_memory_flag(endpoints: list[str]) -> None:
    ds = ShardStreamDataset(endpoints, "toy@1", batch_size=8, pin_memory=True, columns=["x", "id"])
    b = next(iter(DataLoader(ds, batch_size=None)))
    assert isinstance(b["x"], torch.Tensor) and b["x"].shape == (8, 3)
    with pytest.raises(ValueError, match="pin_memory needs output='torch'"):
        ShardStreamDataset(endpoints, "toy@1", batch_size=8, pin_memory=True, output="numpy")
    with pytest.raises(ValueError):
        ShardStreamDataset(endpoints, "toy@1", batch_size=0)


# --- DataLoader workers across epochs, and job cursors under them ----------------------------------
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers on a 2-core host
def test_workers_keep_the_stream_order_across_epoch_boundaries(endpoints: list[str]) -> None:
    """64 steps an epoch and 3 workers: worker 1 ends epoch 0 one step before worker 0 does; the
    split counts steps across epochs, so the round robin still hands over the stream's order."""
    kw: dict[str, Any] = dict(batch_size=16, seed=4, epochs=3, columns=["id"])
    whole = ids_of(DataLoader(ShardStreamDataset(endpoints, "toy@1", **kw), batch_size=None))
    got = ids_of(
        DataLoader(
            ShardStreamDataset(endpoints, "toy@1", **kw),
            batch_size=None,
            num_workers=3,
            multiprocessing_context="spawn",
        )
    )
    assert got == whole and len(whole) == 3 * N_ROWS


def test_a_job_under_a_plain_dataloader_with_workers_is_refused(endpoints: list[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    ds = ShardStreamDataset(
        endpoints, "toy@1", batch_size=16, job="j", cursor_store=f"sqlite:///{tmp_path}/c.db"
    )
    with pytest.raises(Exception, match=r"ds.dataloader\(num_workers=k"):
        next(iter(DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn")))
    with pytest.raises(ValueError, match="persistent_workers"):
        ds.dataloader(num_workers=2, persistent_workers=True)


# (world size, per-rank batch (int or phases), epochs, workers before the kill, after it, seed,
#  commit every, steps each rank hands over before it is killed, skip_steps)
JOB_CASES = [
    (1, 16, 2, 3, 2, 5, 9, [70], None),  # 64 steps an epoch: the kill is in epoch 1, past a worker skew
    (2, 7, 2, 2, 0, 11, 7, [80, 90], None),  # 73 steps an epoch; resumed without workers
    (1, [[0, 16], [400, 24]], 2, 2, 3, 3, 6, [33], [[10, 13]]),  # a batch ramp and a skip range
]


@pytest.mark.parametrize(
    ("world", "batch", "epochs", "k1", "k2", "seed", "every", "kill_at", "skips"), JOB_CASES
)
def test_job_cursors_under_dataloader_workers_survive_a_kill_exactly(  # type: ignore[no-untyped-def]
    endpoints: list[str], tmp_path, world, batch, epochs, k1, k2, seed, every, kill_at, skips
) -> None:
    """Ranks reading through k DataLoader workers commit the job's cursor, are SIGKILLed (workers
    prefetching) and resume from the latest committed step with another number of workers: each
    rank's delivered steps are exactly the uninterrupted run's — nothing lost, nothing twice."""
    from shardstream.client import Loader

    from .support.rank_worker import steps_logged
    from .support.torch_rank import kill_group, start_rank, wait_paused

    store = f"sqlite:///{tmp_path}/cursors.db"
    base = dict(
        endpoints=endpoints,
        world_size=world,
        batch_size=batch,
        seed=seed,
        epochs=epochs,
        job="jw",
        store=store,
        commit_every=every,
        skip_steps=skips or [],
    )
    logs = [tmp_path / f"rank{r}.jsonl" for r in range(world)]
    procs = [
        start_rank(
            {**base, "rank": r, "workers": k1, "resume": None, "log": str(logs[r]), "pause_at": kill_at[r]}
        )
        for r in range(world)
    ]
    try:
        for p, log in zip(procs, logs, strict=True):
            wait_paused(p, log)
    finally:
        for p in procs:
            kill_group(p)
    assert all(p.returncode == -9 for p in procs)
    before = [steps_logged(log) for log in logs]
    committed = every * (min(kill_at) // every)
    # the step every rank committed ("latest" would race: a rank restarted first may commit the next)
    procs = [
        start_rank({**base, "rank": r, "workers": k2, "resume": committed, "log": str(logs[r])})
        for r in range(world)
    ]
    try:
        for p in procs:
            assert p.wait(timeout=300) == 0
    finally:
        for p in procs:
            kill_group(p)
    sched = [tuple(x) for x in batch] if isinstance(batch, list) else batch
    for r in range(world):
        with Loader(
            endpoints,
            "toy@1",
            batch_size=sched,
            rank=r,
            world_size=world,
            seed=seed,
            epochs=epochs,
            columns=["id"],
            skip_steps=[tuple(x) for x in skips] if skips else None,
        ) as ld:
            whole = [b["id"].tolist() for b in ld]
        after = steps_logged(logs[r])[len(before[r]) :]
        assert [s["step"] for s in before[r]] == list(range(1, kill_at[r] + 1))
        assert [s["step"] for s in after] == list(range(committed + 1, len(whole) + 1))
        assert [s["ids"] for s in before[r][:committed]] + [s["ids"] for s in after] == whole, r


def test_an_abandoned_iteration_is_stopped_before_the_interpreter_exits(endpoints: list[str]) -> None:
    """A Loader iterated and never closed (as in a DataLoader worker, whose iterator ends only with
    its process) keeps its prefetch thread streaming; the exit hook cancels and joins it while the
    interpreter is whole (a daemon thread still in Flight's C++ at finalization can abort the process)."""
    from shardstream.client import prefetch

    before = set(prefetch._LIVE)
    it = iter(ShardStreamDataset(endpoints, "toy@1", batch_size=4, seed=2, prefetch=1))
    next(it)
    (producer,) = set(prefetch._LIVE) - before
    assert producer._thread.is_alive()  # streaming (or waiting for room) with the rest unread
    prefetch._stop_live_producers()
    assert not producer._thread.is_alive() and producer not in prefetch._LIVE
    it.close()  # the iteration's own stop afterwards is harmless

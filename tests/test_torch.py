"""ShardStreamDataset under torch's DataLoader (0, 1, 2 workers) and torchdata's StatefulDataLoader."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from shardstream.client.torch import ShardStreamDataset

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

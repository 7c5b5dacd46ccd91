"""Mixtures and shuffle modes through real servers: exactly the plan's samples, resumable."""

from __future__ import annotations

import random

import numpy as np
import pytest

from shardstream.client import Loader
from shardstream.errors import FailedPreconditionError, NotFoundError
from shardstream.order.delivery import make_selector
from shardstream.order.read_order import ShuffleSpec
from shardstream.registry import Registry

from .support.data import N_ROWS
from .support.resume import Ranks, as_json, check_resume, ids

MIX = {"toy@1": 0.75, "toy@2": 0.25}


def expected_ids(data_root, spec: ShuffleSpec, seed: int, epoch: int, block: int = 0) -> list[int]:  # type: ignore[no-untyped-def]
    """The mixture epoch's ids, computed from the plan alone (toy@2's ids are 10000 + row)."""
    reg = Registry(data_root)
    manifests = [reg.resolve(r) for r in MIX]
    sel = make_selector(manifests, list(MIX.values()), seed=seed, shuffle=spec, mixture_block=block)
    src, rows = sel.order.select(epoch, np.arange(sel.num_rows))
    return (rows + 10_000 * src).tolist()


def run(endpoints, world: int, batch: int, *, seed: int = 0, **kw):  # type: ignore[no-untyped-def]
    per_rank, states = [], []
    for rank in range(world):
        with Loader(endpoints, MIX, batch_size=batch, rank=rank, world_size=world, seed=seed, **kw) as ld:
            per_rank.append([b["id"].tolist() for b in ld])
            states.append(ld.state_dict())
    order = [i for t in range(len(per_rank[0])) for r in per_rank for i in r[t]]
    return order, states


@pytest.mark.parametrize("mode", ["none", "full", "block"])
def test_mixture_epoch_delivers_exactly_the_planned_samples(endpoints, data_root, mode: str) -> None:  # type: ignore[no-untyped-def]
    spec = ShuffleSpec(mode, 3)
    order, states = run(endpoints, 3, 32, seed=5, shuffle=mode, shuffle_window=3)
    assert order == expected_ids(data_root, spec, 5, 0)
    assert len(order) == 2 * N_ROWS and states[0]["epoch"] == 1
    # 3:1 in every schedule block of 1000
    first_block = np.asarray(order[:1000])
    assert (first_block >= 10_000).sum() == 250


@pytest.mark.parametrize("case", range(4))
def test_mixture_resume_with_other_world_and_batch_size(endpoints, data_root, case: int) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(case)
    w1, b1, w2, b2 = rng.choice([1, 2, 4]), rng.choice([8, 25]), rng.choice([1, 3]), rng.choice([5, 40])
    stop = rng.randrange(1, 2 * N_ROWS // (w1 * b1))

    def job(world: int, batch: int) -> Ranks:
        return Ranks(
            lambda rank: Loader(endpoints, MIX, batch_size=batch, rank=rank, world_size=world, seed=case),
            world,
        )

    # every rank saves the same state (Ranks asserts it); w2 ranks of b2 resume it
    res = check_resume(
        lambda: job(w1, b1),
        cuts=[stop],
        remake=lambda: job(w2, b2),
        item=ids,
        flatten=True,
        checkpoint=as_json,
    )
    assert [i for step in res.full for i in step] == expected_ids(data_root, ShuffleSpec(), case, 0)


def test_mixture_provenance_and_endless_source_epochs(endpoints) -> None:  # type: ignore[no-untyped-def]
    with Loader(endpoints, "toy@1:0.5,tiny:0.5", batch_size=100, epochs=None, provenance=True) as ld:
        it = iter(ld)
        b = next(it)
        assert set(b["_source"].tolist()) == {0, 1}
        assert (b["id"][b["_source"] == 1] == 0).all()  # tiny has one row: it repeats every sample
        assert ld.last_batch.sources is not None


def test_mixture_errors(endpoints) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="finite number > 0"):
        Loader(endpoints, {"toy@1": -1.0}, batch_size=1)
    with (
        Loader(endpoints, {"toy@1": 1.0, "ghost": 1.0}, batch_size=1) as ld,
        pytest.raises(NotFoundError, match="ghost"),
    ):
        iter(ld)
    with Loader(endpoints, MIX, batch_size=10) as ld:
        state = ld.state_dict()
    with Loader(endpoints, {"toy@1": 0.5, "toy@2": 0.5}, batch_size=10) as ld:
        with pytest.raises(FailedPreconditionError, match="toy@1:0.75,toy@2:0.25"):
            ld.load_state_dict(state)
    with Loader(endpoints, "toy@1", batch_size=10) as ld, pytest.raises(FailedPreconditionError):
        ld.load_state_dict(state)

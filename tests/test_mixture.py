"""Mixture schedule properties (pure: no servers)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.errors import InvalidArgumentError
from shardstream.order.mixture import MixtureOrder, MixturePlan, SourceInfo, allocate, parse_mixture
from shardstream.order.read_order import DatasetOrder, ShuffleSpec, StepLayout

from .support.processes import same_output_in_processes


def plan_of(
    rows: list[int], weights: list[float], seed: int = 0, block: int = 0, epoch_samples: int = 0
) -> MixturePlan:
    sources = [
        SourceInfo(f"s{i}@1", f"fp{i}", n, w) for i, (n, w) in enumerate(zip(rows, weights, strict=True))
    ]
    return MixturePlan(sources, seed, block, epoch_samples)


@settings(max_examples=200, deadline=None)
@given(weights=st.lists(st.floats(0.001, 100), min_size=1, max_size=6), block=st.integers(6, 3000))
def test_allocation_is_exact_and_closest(weights: list[float], block: int) -> None:
    alloc = allocate(weights, block)
    assert alloc.sum() == block
    quota = np.asarray(weights) / sum(weights) * block
    assert (np.abs(alloc - quota) < 1).all()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.integers(1, 300), min_size=1, max_size=4),
    data=st.data(),
    seed=st.integers(0, 2**32),
    block=st.integers(81, 200),  # every weight (1..20 of <= 80) gets a share
)
def test_every_block_has_exact_counts_and_sources_run_their_own_epochs(rows, data, seed, block) -> None:  # type: ignore[no-untyped-def]
    weights = data.draw(st.lists(st.integers(1, 20), min_size=len(rows), max_size=len(rows)))
    plan = plan_of(rows, [float(w) for w in weights], seed, block)
    epochs = 3
    n = plan.epoch_samples * epochs
    src = np.empty(n, np.int64)
    sep = np.empty(n, np.int64)
    spos = np.empty(n, np.int64)
    for e in range(epochs):
        sl = slice(e * plan.epoch_samples, (e + 1) * plan.epoch_samples)
        src[sl], sep[sl], spos[sl] = plan.locate(e, np.arange(plan.epoch_samples))
    # exact proportions in every complete schedule block
    for b in range(n // block):
        counts = np.bincount(src[b * block : (b + 1) * block], minlength=len(rows))
        assert counts.tolist() == plan.alloc.tolist()
    # each source: its k-th sample is (k div N, k mod N) -> every source epoch visits each position once
    for s, size in enumerate(rows):
        mine = src == s
        k = np.arange(mine.sum())
        assert sep[mine].tolist() == (k // size).tolist()
        complete = mine.sum() // size
        for e in range(complete):
            assert sorted(spos[mine][sep[mine] == e].tolist()) == list(range(size))


def test_small_source_repeats_with_a_fresh_order_each_epoch() -> None:
    plan = plan_of([1000, 10], [0.5, 0.5], seed=3, block=100)
    orders = [
        DatasetOrder("fpA", [1000], 3, ShuffleSpec("full")),
        DatasetOrder("fpB", [10], 3, ShuffleSpec("full")),
    ]
    mix = MixtureOrder(plan, orders)
    src, rows = mix.select(0, np.arange(200))
    small = rows[src == 1]
    assert len(small) == 100  # 10 epochs of the small source in 200 samples
    epochs = [small[i : i + 10].tolist() for i in range(0, 100, 10)]
    assert all(sorted(e) == list(range(10)) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1  # each repetition has its own order


@settings(max_examples=80, deadline=None)
@given(
    w1=st.integers(1, 5), b1=st.integers(1, 20), w2=st.integers(1, 5), b2=st.integers(1, 20), data=st.data()
)
def test_mixture_resume_with_other_world_and_batch_size_is_exact(w1, b1, w2, b2, data) -> None:  # type: ignore[no-untyped-def]
    plan = plan_of([97, 41, 13], [0.6, 0.3, 0.1], seed=1, block=50)
    orders = [DatasetOrder(f"fp{i}", [n], 1, ShuffleSpec("full")) for i, n in enumerate([97, 41, 13])]
    mix = MixtureOrder(plan, orders)
    n = plan.epoch_samples

    def deliver(offset: int, w: int, b: int, steps: int | None) -> tuple[list[tuple[int, int]], int]:
        lay = StepLayout(n, offset, w, b)
        k = lay.num_steps if steps is None else min(steps, lay.num_steps)
        out = []
        for t in range(k):
            for r in range(w):
                src, rows = mix.select(0, np.arange(*lay.rank_range(t, r)))
                out += list(zip(src.tolist(), rows.tolist(), strict=True))
        return out, (lay.offset_after(k - 1) if k else offset)

    whole, _ = deliver(0, 1, n, None)
    first, offset = deliver(0, w1, b1, data.draw(st.integers(0, n // (w1 * b1))))
    rest, _ = deliver(offset, w2, b2, None)
    assert first + rest == whole


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"a@1": -0.5, "b@1": 1.5}, "must be a finite number > 0"),
        ({"a@1": 0.0}, "must be a finite number > 0"),
        ({"a@1": "lots"}, "must be a number"),
        ({"a@1": True}, "must be a number"),
        ({"a@1": math.nan}, "finite"),
        ({}, "at least one dataset"),
        ("a@1:0.5,b@1", "is not 'NAME"),
        ("a@1:x", "is not a number"),
        ("a@1:1,a@1:2", "appears twice"),
        ({"bad name": 1.0}, "invalid dataset name"),
        (42, "a mixture is a dict"),
    ],
)
def test_bad_mixtures_are_refused_with_one_clear_error(spec, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgumentError, match=message):
        parse_mixture(spec)


def test_parse_forms_agree() -> None:
    assert parse_mixture("web@3:0.7, code@1:0.2,math@2:0.1") == parse_mixture(
        {"web@3": 0.7, "code@1": 0.2, "math@2": 0.1}
    )


def test_weight_too_small_for_the_block_and_empty_sources() -> None:
    with pytest.raises(InvalidArgumentError, match="weight too small"):
        plan_of([10, 10], [1.0, 0.0001], block=100)
    with pytest.raises(InvalidArgumentError, match="has no rows"):
        plan_of([10, 0], [1.0, 1.0])


def test_fingerprint_covers_sources_weights_block_and_length() -> None:
    base = plan_of([10, 20], [1.0, 2.0]).fingerprint
    assert base == plan_of([10, 20], [1.0, 2.0]).fingerprint
    assert base != plan_of([10, 20], [1.0, 3.0]).fingerprint
    assert base != plan_of([10, 20], [1.0, 2.0], block=500).fingerprint
    assert base != plan_of([10, 20], [1.0, 2.0], epoch_samples=99).fingerprint


def test_schedule_is_the_same_in_other_processes() -> None:
    code = (
        "import numpy as np;from shardstream.order.mixture import MixturePlan, SourceInfo;"
        "p = MixturePlan([SourceInfo('a@1','fa',50,0.7), SourceInfo('b@1','fb',9,0.3)], 4, 20);"
        "print([x.tolist() for x in p.locate(2, np.arange(60))])"
    )
    same_output_in_processes(code)

"""Mixture phases (shardstream/order/curriculum.py): properties over random phases, weights, sources (pure)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.errors import InvalidArgumentError
from shardstream.order.curriculum import MixtureSchedule, is_mixture_schedule, parse_mixture_schedule
from shardstream.order.mixture import MixtureOrder, MixturePlan, SourceInfo
from shardstream.order.read_order import DatasetOrder, ShuffleSpec


def sources(rows: list[int]) -> list[SourceInfo]:
    return [SourceInfo(f"s{i}@1", f"fp{i}", n, 1.0) for i, n in enumerate(rows)]


def test_one_phase_is_the_plain_mixture_bit_for_bit() -> None:
    srcs = [SourceInfo("a@1", "fa", 97, 0.7), SourceInfo("b@1", "fb", 41, 0.3)]
    plain = MixturePlan(srcs, 5, 50)
    sched = MixtureSchedule(srcs, [(0, [0.7, 0.3])], 5, 50)
    for epoch in (0, 3):
        for got, want in zip(
            sched.locate(epoch, np.arange(400)), plain.locate(epoch, np.arange(400)), strict=True
        ):
            assert got.tolist() == want.tolist()


phase_weights = st.lists(st.sampled_from([0.0, 0.0, 0.1, 0.3, 0.5, 1.0, 2.0]), min_size=3, max_size=3).filter(
    any
)


@settings(max_examples=120, deadline=None)
@given(
    rows=st.lists(st.integers(1, 70), min_size=3, max_size=3),
    block=st.integers(3, 40),
    starts=st.lists(st.integers(1, 600), max_size=3, unique=True),
    weights=st.lists(phase_weights, min_size=4, max_size=4),
    seed=st.integers(0, 3),
    data=st.data(),
)
def test_each_source_keeps_its_epochs_across_phases(rows, block, starts, weights, seed, data) -> None:  # type: ignore[no-untyped-def]
    # phases at distinct blocks
    blocks = sorted({-(-s // block) for s in starts} - {0})
    phases = [(0, weights[0])] + [
        (b * block - data.draw(st.integers(0, block - 1)), w)
        for b, w in zip(blocks, weights[1:], strict=False)
    ]
    try:
        sched = MixtureSchedule(sources(rows), phases, seed, block)
    except InvalidArgumentError as exc:
        assert "weight too small" in str(exc)
        return
    total = 1500
    src, sep, spos = sched.locate(0, np.arange(total))
    count = sep * np.asarray(rows)[src] + spos
    for s, n in enumerate(rows):
        mine = count[src == s]
        # the source's k-th sample in stream order is its sample k: source epochs follow each other,
        # each complete one is exactly its N samples
        assert mine.tolist() == list(range(len(mine)))
        assert (spos[src == s] < n).all()
    # every block holds exactly its phase's allocation
    for b in range(total // block):
        i = sched.phase_at(b * block)
        got = np.bincount(src[b * block : (b + 1) * block], minlength=3)
        assert got.tolist() == sched._alloc[i].tolist()
        assert (sched._alloc[i][np.asarray(phases[i][1]) == 0] == 0).all()
    # a position's answer does not depend on what else is asked, nor on how (epoch, offset) splits it
    pick = np.asarray(sorted(data.draw(st.lists(st.integers(0, total - 1), min_size=1, max_size=20))))
    one = sched.locate(0, pick)
    assert all((a == b[pick]).all() for a, b in zip(one, (src, sep, spos), strict=True))
    L = sched.epoch_samples
    if L < total:
        later = sched.locate(1, np.arange(total - L))
        assert all((a == b[L:]).all() for a, b in zip(later, (src, sep, spos), strict=True))
    g = data.draw(st.integers(0, total))
    assert sched.taken_before(g).tolist() == np.bincount(src[:g], minlength=3).tolist()


def test_orders_across_phases_and_small_sources_repeat_in_fresh_orders() -> None:
    srcs = sources([500, 10])
    sched = MixtureSchedule(srcs, [(0, [1.0, 0.0]), (100, [0.5, 0.5]), (300, [1.0, 0.0])], 3, 20)
    assert sched.phase_starts == [0, 100, 300]
    orders = [DatasetOrder(f"fp{i}", [n], 3, ShuffleSpec("full")) for i, n in enumerate([500, 10])]
    src, rows = MixtureOrder(sched, orders).select(0, np.arange(500))
    small = rows[src == 1]
    assert len(small) == 100 and (src[:100] == 0).all() and (src[300:] == 0).all()
    epochs = [small[i : i + 10].tolist() for i in range(0, 100, 10)]
    assert all(sorted(e) == list(range(10)) for e in epochs) and len({tuple(e) for e in epochs}) > 1
    big = rows[src == 0]
    assert sorted(big.tolist()) == sorted(set(big.tolist()))  # 400 of source 0's epoch: none twice


def test_parse_label_and_errors() -> None:
    phases = [(0, {"web@3": 0.7, "code@1": 0.3}), (2_000_000, {"web@3": 0.5, "code@1": 0.3, "math@2": 0.2})]
    text = "0=web@3:0.7,code@1:0.3;2000000=web@3:0.5,code@1:0.3,math@2:0.2"
    assert is_mixture_schedule(phases) and is_mixture_schedule(text)
    assert not is_mixture_schedule({"web@3": 1.0}) and not is_mixture_schedule("web@3:0.7,code@1:0.3")
    assert parse_mixture_schedule(phases) == parse_mixture_schedule(text)
    srcs = [SourceInfo(r, f"fp-{r}", 10**7, 0.0) for r in ("web@3", "code@1", "math@2")]
    sched = MixtureSchedule(srcs, [(0, [0.7, 0.3, 0.0]), (2_000_000, [0.5, 0.3, 0.2])], 0)
    assert sched.label == text
    assert sched.weights_at(1_999_999) == {"web@3": 0.7, "code@1": 0.3}
    assert sched.weights_at(2_000_000)["math@2"] == 0.2
    other = MixtureSchedule(srcs, [(0, [0.7, 0.3, 0.0]), (3_000_000, [0.5, 0.3, 0.2])], 0)
    assert other.content == sched.content and other.fingerprint != sched.fingerprint
    for bad, match in (
        ([(5, {"a@1": 1.0})], "start at offset 0"),
        ([(0, {"a@1": 1.0}), (0, {"a@1": 2.0})], "increasing"),
        ("0=a@1:1;x=b@1:1", "OFFSET="),
        ([(0, {"a@1": -1.0})], "finite number > 0"),
    ):
        with pytest.raises(InvalidArgumentError, match=match):
            parse_mixture_schedule(bad)
    with pytest.raises(InvalidArgumentError, match="same schedule block"):
        MixtureSchedule(srcs, [(0, [1, 0, 0]), (10, [0, 1, 0]), (900, [0, 0, 1])], 0)
    with pytest.raises(InvalidArgumentError, match="not all 0"):
        MixtureSchedule(srcs, [(0, [0, 0, 0])], 0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), second=st.integers(1, 9), third=st.integers(10, 30))
def test_position_of_inverts_locate(seed: int, second: int, third: int) -> None:
    """`position_of(source, count)` (explain --sample in a mixture) is `locate` inverted, for a plain
    mixture and for phases — one of which leaves a source out."""

    srcs = [SourceInfo("a@1", "fa", 37, 0.7), SourceInfo("b@1", "fb", 23, 0.3)]
    plain = MixturePlan(srcs, seed, 10)
    phased = MixtureSchedule(
        srcs, [(0, [0.7, 0.3]), (second * 10, [0.0, 1.0]), (third * 10, [0.5, 0.5])], seed, 10
    )
    for plan in (plain, phased):
        src, ep, pos = plan.locate(0, np.arange(400))
        for g in range(400):
            s = int(src[g])
            assert plan.position_of(s, int(ep[g]) * srcs[s].num_rows + int(pos[g])) == g

"""A Loader's integer arguments and schedules are checked at construction against what a Read request
can carry (shardstream/limits.py): a value out of range is one InvalidArgumentError line naming the
argument and its range — never a bare `ValueError: Value out of range` from protobuf at the first
batch. No server is needed: nothing is sent before the first batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream import limits
from shardstream.client import Loader
from shardstream.errors import InvalidArgumentError
from shardstream.server.read import request_limits
from shardstream.v1 import shardstream_pb2 as pb

NOWHERE = ["127.0.0.1:9"]  # never dialled: construction makes no network call


def outside(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers below `low` or above `high`, near the edges and far past them."""
    return st.one_of(
        st.integers(max_value=low - 1),
        st.integers(min_value=high + 1),
        st.integers(min_value=high + 1, max_value=high + 3),
        st.sampled_from([low - 1, high + 1, 2**64, 2**64 + 1, -(2**63) - 1, 10**5000]),
    )


# argument -> (what it is given as, the name the error must carry, low, high)
CASES: dict[str, tuple[Callable[[int], dict[str, Any]], str, int, int]] = {
    "batch_size": (lambda v: {"batch_size": v}, "batch_size", 1, limits.MAX_BATCH_SIZE),
    "batch_phase_size": (lambda v: {"batch_size": [(0, 8), (100, v)]}, "batch_size", 1, limits.MAX_BATCH_SIZE),
    "batch_phase_start": (lambda v: {"batch_size": [(0, 8), (v, 16)]}, "batch_size", 1, limits.MAX_POSITION),
    "seed": (lambda v: {"seed": v}, "seed", 0, limits.MAX_SEED),
    "shuffle_window": (lambda v: {"shuffle_window": v}, "shuffle_window", 1, limits.MAX_SHUFFLE_WINDOW),
    "world_size": (lambda v: {"world_size": v, "rank": 0}, "world_size", 1, limits.MAX_WORLD_SIZE),
    "rank": (lambda v: {"world_size": 4, "rank": v}, "rank", 0, 3),
    "epochs": (lambda v: {"epochs": v}, "epochs", 1, limits.MAX_EPOCH + 1),
    "max_message_bytes": (lambda v: {"max_message_bytes": v}, "max_message_bytes", 0, limits.MAX_MESSAGE_BYTES),
    "mixture_block": (lambda v: {"mixture_block": v}, "mixture_block", 0, limits.MAX_MIXTURE_BLOCK),
    "mixture_epoch_samples": (
        lambda v: {"mixture_epoch_samples": v},
        "mixture_epoch_samples",
        0,
        limits.MAX_MIXTURE_EPOCH_SAMPLES,
    ),
    "skip_start": (lambda v: {"skip_steps": [(v, limits.MAX_POSITION)]}, "skip_steps", 0, limits.MAX_POSITION - 1),
    "skip_end": (lambda v: {"skip_steps": [(0, v)]}, "skip_steps", 1, limits.MAX_POSITION),
    "mixture_phase_start": (
        lambda v: {"dataset": [(0, {"a@1": 1.0}), (v, {"b@1": 1.0})]},
        "mixture phase",
        1,
        limits.MAX_POSITION,
    ),
}


def build(**kw: Any) -> Loader:
    kw.setdefault("dataset", "a@1")
    kw.setdefault("batch_size", 8)
    return Loader(NOWHERE, kw.pop("dataset"), **kw)


@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_an_out_of_range_integer_is_refused_at_construction_naming_the_argument(case: str, data: st.DataObject) -> None:
    given_as, name, low, high = CASES[case]
    value = data.draw(outside(low, high))
    with pytest.raises(InvalidArgumentError) as info:
        build(**given_as(value))
    message = str(info.value)
    assert name in message and "\n" not in message and len(message) < 300, message


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_edges_of_each_range_construct(case: str) -> None:
    given_as, _, low, high = CASES[case]
    for value in (low, high):
        with build(**given_as(value)):
            pass


def test_the_ranges_fit_the_wire_and_are_the_servers() -> None:
    """Each bound is one a Read request holds (protobuf raises past it) and the server's own limit."""
    request = pb.ReadRequest(
        seed=limits.MAX_SEED,
        epoch=limits.MAX_EPOCH,
        world_size=limits.MAX_WORLD_SIZE,
        batch_size=limits.MAX_BATCH_SIZE,
        max_message_bytes=limits.MAX_MESSAGE_BYTES,
        mixture_block=limits.MAX_MIXTURE_BLOCK,
        mixture_epoch_samples=limits.MAX_MIXTURE_EPOCH_SAMPLES,
        shuffle=pb.Shuffle(window=limits.MAX_SHUFFLE_WINDOW),
    )
    request.batch_schedule.add(start=limits.MAX_POSITION, batch_size=limits.MAX_BATCH_SIZE)
    request.skip.add(start=0, end=limits.MAX_POSITION)
    request.mixture_phases.add(start=limits.MAX_POSITION)
    assert pb.ReadRequest.FromString(request.SerializeToString()) == request
    with pytest.raises(ValueError):
        pb.ReadRequest(seed=limits.MAX_SEED + 1)
    with pytest.raises(ValueError):
        pb.ReadRequest(batch_size=limits.MAX_BATCH_SIZE + 1)
    assert limits.MAX_WORLD_SIZE == request_limits.MAX_WORLD_SIZE
    assert limits.MAX_EPOCH == request_limits.MAX_EPOCH
    assert limits.MAX_POSITION == request_limits.MAX_COUNT
    assert limits.MAX_SHUFFLE_WINDOW == request_limits.MAX_SHUFFLE_WINDOW
    assert limits.MAX_MIXTURE_BLOCK == request_limits.MAX_MIXTURE_BLOCK
    assert limits.MAX_MIXTURE_EPOCH_SAMPLES == request_limits.MAX_MIXTURE_EPOCH_SAMPLES

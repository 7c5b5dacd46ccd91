"""The wire codec (shardstream/order/read_query.py): decode(encode(q)) == q for any valid ReadQuery,
encode(decode(r)) == r for any Read request a client makes (plain, mixture and mixture phases, with
schedules, transforms and columns), and a request over a limit is refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.client.loader_options import LoaderOptions
from shardstream.client.schedule_state import LoaderSchedule
from shardstream.client.target import Target, dataset_refs, target_of
from shardstream.errors import InvalidArgumentError
from shardstream.order import read_query as rq
from shardstream.order.cursor_math import WorkerSplit
from shardstream.order.read_query import ReadQuery, decode, encode
from shardstream.v1 import shardstream_pb2 as pb

from .support.loader_options import NOWHERE, NUM_ROWS, TARGET, valid_options

U64 = 2**64 - 1
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
counts = st.integers(0, rq.MAX_COUNT)
weights = st.floats(0, 1e6, allow_nan=False)


@st.composite
def queries(draw: st.DrawFn) -> ReadQuery:
    """Any query decode accepts."""
    mixture = draw(st.booleans())
    n = draw(st.integers(1, 4)) if mixture else 1
    sources = tuple(
        rq.Source(draw(text), draw(text), draw(weights) if mixture else 0.0) for _ in range(n)
    )
    phases: tuple[rq.MixturePhase, ...] = ()
    if mixture and draw(st.booleans()):
        phases = tuple(
            rq.MixturePhase(draw(counts), tuple(draw(weights) for _ in range(n)))
            for _ in range(draw(st.integers(1, 3)))
        )
    epoch = draw(st.integers(0, rq.MAX_EPOCH))
    world_size = draw(st.integers(1, rq.MAX_WORLD_SIZE))
    schedule = tuple(
        rq.BatchPhase(draw(counts), draw(st.integers(1, 1 << 16))) for _ in range(draw(st.integers(0, 3)))
    )
    skips = tuple(
        rq.SkipRange(start, start + draw(st.integers(1, 10**6)))
        for start in draw(st.lists(st.integers(0, 10**9), max_size=3))
    )
    return ReadQuery(
        sources=sources,
        mixture=mixture,
        mixture_phases=phases,
        mixture_block=draw(st.integers(0, rq.MAX_MIXTURE_BLOCK)) if mixture else 0,
        mixture_epoch_samples=(
            draw(st.integers(0, min(rq.MAX_MIXTURE_EPOCH_SAMPLES, rq.MAX_COUNT // (epoch + 1)))) if mixture else 0
        ),
        seed=draw(st.integers(0, U64)),
        epoch=epoch,
        shuffle_mode=draw(st.sampled_from(["", "none", "block", "full"])),
        shuffle_window=draw(st.integers(0, rq.MAX_SHUFFLE_WINDOW)),
        start_offset=draw(counts),
        rank=draw(st.integers(0, world_size - 1)),
        world_size=world_size,
        batch_size=0 if schedule else draw(st.integers(1, 1 << 16)),
        batch_schedule=schedule,
        skips=skips,
        first_step=draw(counts),
        step_stride=draw(st.integers(0, rq.MAX_STEP_STRIDE)),
        num_steps=draw(counts),
        drop_last=draw(st.booleans()),
        columns=tuple(draw(st.lists(text, max_size=4))),
        transforms=tuple(
            rq.Transform(op, params)
            for op, params in draw(st.lists(st.tuples(text, st.sampled_from(["", "{}", '{"a": [1]}'])), max_size=3))
        ),
        on_error=draw(st.sampled_from(["", "fail", "skip"])),
        max_message_bytes=draw(st.integers(0, U64)),
        split_steps=draw(st.booleans()),
    )


@settings(max_examples=300, deadline=None)
@given(q=queries())
def test_a_valid_query_survives_the_wire(q: ReadQuery) -> None:
    request = encode(q)
    assert decode(pb.ReadRequest.FromString(request.SerializeToString())) == q


def _info(name: str, version: int, rows: int) -> pb.DatasetInfo:
    return pb.DatasetInfo(
        name=name, version=version, fingerprint=f"{name}{version}".ljust(64, "0"), num_rows=rows,
        fields=[pb.Field(name="x", type="int64"), pb.Field(name="y", type="int64")],
    )


INFOS = {"a@1": _info("a", 1, 1000), "b@2": _info("b", 2, 3000), "c@3": _info("c", 3, 500)}


@st.composite
def targets(draw: st.DrawFn) -> Target:
    kind = draw(st.sampled_from(["plain", "mixture", "phases"]))
    if kind == "plain":
        return TARGET
    names = draw(st.lists(st.sampled_from(sorted(INFOS)), min_size=1, max_size=3, unique=True))
    dataset: Any
    if kind == "mixture":
        dataset = [(n, draw(st.floats(0.5, 2))) for n in names]
    else:
        # phases start in different schedule blocks (blocks of at most 1,024 samples here)
        starts = sorted(10**4 * k for k in draw(st.lists(st.integers(1, 100), max_size=2, unique=True)))
        dataset = [(start, [(n, draw(st.floats(0.5, 2))) for n in names]) for start in [0, *starts]]
        if len(dataset) == 1:
            dataset = dataset[0][1]
    return target_of(
        dataset,
        [INFOS[ref] for ref in dataset_refs(dataset)],
        columns=None,
        seed=draw(st.integers(0, 100)),
        mixture_block=draw(st.sampled_from([0, 256, 1024])),
        mixture_epoch_samples=draw(st.sampled_from([0, 10**4, 10**6])),
    )


@settings(max_examples=200, deadline=None)
@given(
    given_=valid_options(job=False),
    target=targets(),
    epoch=st.integers(0, 3),
    offset=st.integers(0, NUM_ROWS),
    step=st.integers(0, 10),
    stride=st.integers(1, 4),
)
def test_a_clients_request_is_what_its_decoded_query_encodes(
    given_: dict[str, Any], target: Target, epoch: int, offset: int, step: int, stride: int
) -> None:
    options = LoaderOptions(**given_)
    schedule = LoaderSchedule(options.batch_size, options.skip_steps).schedule(
        num_rows=NUM_ROWS, world_size=options.world_size, drop_last=options.drop_last, epoch=0, offset=0, steps=0
    )
    spec = options.read_spec(target=target, endpoints=NOWHERE, schedule=schedule, split=WorkerSplit(0, 1), origin=(0, 0))
    request = spec.request(epoch, offset, step, stride)
    assert encode(decode(request)) == request
    assert bool(request.mixture) is (target.mixture is not None)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"mixture_phases": [pb.MixturePhase(start=0, weights=[1.0])]}, "mixture_phases needs the mixture's sources"),
        ({"skip": [pb.SkipRange(start=5, end=5)]}, r"skip\[0\] must have start < end"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"batch_schedule": [pb.BatchPhase(start=0, batch_size=4)]}, "batch_size must be 0 with batch_schedule"),
        ({"batch_size": 0, "batch_schedule": [pb.BatchPhase(start=0, batch_size=0)]}, r"batch_schedule\[0\].batch_size must be >= 1"),
        ({"rank": 2, "world_size": 2}, r"rank must be in \[0, world_size\)"),
    ],
)
def test_decode_refuses_a_bad_request_naming_the_field(fields: dict[str, Any], match: str) -> None:
    req = pb.ReadRequest(dataset="toy@1", **{"world_size": 1, "batch_size": 4, **fields})
    with pytest.raises(InvalidArgumentError, match=match):
        decode(req)

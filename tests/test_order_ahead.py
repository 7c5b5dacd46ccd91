"""A stream's samples selected several messages ahead are the ones its chunks select alone.

`OrderAhead` selects the positions of the next steps at once (a keyed permutation's cost is mostly
per call); every chunk of a stream — whole steps, several steps, parts of a step, strided and
resumed streams, schedules, mixtures — must get exactly what the plan's selector gives for its own
positions, also when the look-ahead is refilled at every chunk or in the middle of a step's parts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from shardstream.server.backends.roots import open_registry
from shardstream.server.read.message_steps import MessageSteps
from shardstream.server.read.order_ahead import OrderAhead
from shardstream.server.read.plan import ReadPlan, ReadPlanner
from shardstream.server.read.reader import new_row_group_cache
from shardstream.v1 import shardstream_pb2 as pb

from .support.data import write_dataset


@pytest.fixture(scope="module")
def planner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReadPlanner]:
    root = tmp_path_factory.mktemp("order-ahead") / "root"
    write_dataset(root, "toy", 389, row_group_rows=20, shard_rows=70)
    write_dataset(root, "other", 101, row_group_rows=20, shard_rows=70, start=10_000)
    with open_registry(str(root)) as registry:
        yield ReadPlanner(registry, new_row_group_cache(16 << 20))


def _request(rng: np.random.Generator) -> pb.ReadRequest:
    world = int(rng.integers(1, 5))
    fields: dict[str, Any] = {
        "seed": int(rng.integers(100)),
        "epoch": int(rng.integers(3)),
        "world_size": world,
        "rank": int(rng.integers(world)),
        "batch_size": int(rng.integers(1, 40)),
        "drop_last": bool(rng.integers(2)),
        "split_steps": True,
        "max_message_bytes": int(rng.choice([1, 2000, 20_000, 1 << 20])),
    }
    kind = rng.integers(4)
    if kind == 1:
        fields["start_offset"] = int(rng.integers(200))
        fields["first_step"] = int(rng.integers(3))
        fields["step_stride"] = int(rng.integers(1, 4))
    req = pb.ReadRequest(dataset="toy", **fields)
    if kind == 2:
        req.batch_size = 0
        req.batch_schedule.add(start=0, batch_size=int(rng.integers(1, 9)))
        req.batch_schedule.add(start=int(rng.integers(20, 120)), batch_size=int(rng.integers(9, 40)))
    if kind == 3:
        req.dataset = ""
        req.mixture_block = 8
        req.mixture.add(dataset="toy", weight=2.0)
        req.mixture.add(dataset="other", weight=1.0)
    req.shuffle.mode = str(rng.choice(["none", "block", "full"]))
    req.shuffle.window = int(rng.integers(1, 4))
    return req


@pytest.mark.parametrize("seed", range(40))
def test_chunks_select_what_the_plan_selects_for_their_positions(
    planner: ReadPlanner, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(OrderAhead, "AHEAD_SAMPLES", int(rng.choice([1, 7, 50, 32_768])))
    monkeypatch.setattr(OrderAhead, "AHEAD_STEPS", int(rng.choice([1, 3, 16])))
    plan: ReadPlan = planner.plan(_request(rng))
    if rng.random() < 0.5:  # steps in parts of their samples
        plan = dataclasses.replace(plan, message_cap_bytes=int(rng.integers(300, 3000)), sample_bytes=100.0)
    steps, order = MessageSteps(plan), OrderAhead(plan)
    chunks = 0
    while steps.remaining:
        chunk = steps.next()
        ranges = []
        for step in chunk.steps:
            ps, pe = plan.layout.rank_range(step, plan.rank)
            a, b = chunk.samples if chunk.samples is not None else (0, pe - ps)
            ranges.append(np.arange(ps + a, ps + b, dtype=np.int64))
        positions = np.concatenate(ranges)
        want_src, want_rows = plan.selector.select(plan.epoch, positions)
        got_src, got_rows = order.select(chunk)
        assert np.array_equal(got_rows, want_rows) and np.array_equal(got_src, want_src), chunk
        steps.record(chunk, len(positions), max(1, len(positions)) * int(rng.integers(50, 400)))
        chunks += 1
    assert chunks or plan.first_step >= plan.end_step

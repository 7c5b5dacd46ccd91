"""The public step reader (client/step_reader.py) against real servers: one rank's batch at one step,
the same rows and BatchInfo as a Loader with the same options hands over at that step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from shardstream.client import Loader, StepReader, as_numpy, read_step

OPTIONS = dict(batch_size=7, world_size=3, seed=5, shuffle="block")


def loader_step(endpoints: list[str], step: int, rank: int, **options: object) -> tuple[pa.RecordBatch, object]:
    with Loader(endpoints, "toy@1", rank=rank, output="arrow", provenance=True, **options) as ld:  # type: ignore[arg-type]
        for i, batch in enumerate(ld):
            if i == step:
                return batch, ld.last_batch
    raise AssertionError(f"the Loader has no step {step}")


@pytest.mark.parametrize(("step", "rank"), [(0, 0), (4, 2), (9, 1)])
def test_read_step_is_the_loaders_batch_at_that_step(endpoints: list[str], step: int, rank: int) -> None:
    want, want_info = loader_step(endpoints, step, rank, **OPTIONS)
    got, info = read_step(endpoints, "toy@1", step, rank, **OPTIONS)
    assert got.equals(want)
    assert info.step == step
    for field in dataclasses.fields(info):
        a, b = getattr(info, field.name), getattr(want_info, field.name)
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, field.name


def test_a_step_reader_resumes_where_the_loaders_state_says(endpoints: list[str]) -> None:
    with StepReader(endpoints) as reader:
        target = reader.target("toy@1", seed=OPTIONS["seed"])
        offset = 4 * OPTIONS["world_size"] * OPTIONS["batch_size"]
        state = reader.state(target, epoch=0, offset=offset, steps=4, rank=2, **OPTIONS)
        batch, _ = reader.read(target, epoch=0, offset=offset, rank=2, **OPTIONS)
    with Loader(endpoints, "toy@1", rank=2, output="numpy", **OPTIONS) as ld:  # type: ignore[arg-type]
        ld.load_state_dict(state)
        first = next(iter(ld))
    assert as_numpy(batch).keys() == first.keys()
    for name, values in as_numpy(batch).items():
        assert (values == first[name]).all(), name

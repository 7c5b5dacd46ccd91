"""Loader options for property tests: a target that is never dialled, and hypothesis strategies of the
keyword options a Loader accepts (tests/test_loader_options.py, tests/test_read_query.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from shardstream import limits
from shardstream.client.target import Target
from shardstream.order.shuffle import SHUFFLES
from shardstream.transform_spec import ON_ERROR
from shardstream.v1 import shardstream_pb2 as pb

NOWHERE = ["127.0.0.1:9"]  # never dialled: construction makes no network call
NUM_ROWS = 10**9
TARGET = Target(
    "t@1",
    "f" * 64,
    NUM_ROWS,
    ["x", "y"],
    [pb.DatasetInfo(name="t", version=1, fingerprint="f" * 64, num_rows=NUM_ROWS)],
    None,
)


@st.composite
def batch_sizes(draw: st.DrawFn, largest: int = limits.MAX_BATCH_SIZE) -> int | list[tuple[int, int]]:
    size = st.integers(1, largest)
    if draw(st.booleans()):
        return draw(size)
    starts = draw(st.lists(st.integers(1, limits.MAX_POSITION), max_size=3, unique=True))
    return [(start, draw(size)) for start in [0, *sorted(starts)]]


@st.composite
def valid_options(draw: st.DrawFn, *, job: bool = True) -> dict[str, Any]:
    """Keyword options a Loader accepts (a random subset of them; token="" keeps $SHARDSTREAM_TOKEN out)."""
    ranges = st.tuples(st.integers(0, 10**4), st.integers(1, 10**3)).map(lambda p: (p[0], p[0] + p[1]))
    # Skip ranges are placed by the steps of the plan: keep those steps in the target's first epochs.
    skip_steps = draw(st.one_of(st.none(), st.lists(ranges, max_size=3)))
    if skip_steps:
        world_size, batch_size = draw(st.integers(1, 16)), draw(batch_sizes(10**4))
    else:
        world_size = draw(st.one_of(st.integers(1, 16), st.integers(1, limits.MAX_WORLD_SIZE)))
        batch_size = draw(batch_sizes())
    output = draw(st.sampled_from(["numpy", "arrow", "torch"]))
    window = st.integers(1, limits.MAX_SHUFFLE_WINDOW)
    params = st.dictionaries(
        st.text("abcdefgh_", min_size=1, max_size=5).filter(lambda k: k != "op"),
        st.one_of(st.integers(-(2**40), 2**40), st.text(max_size=5), st.booleans(), st.none()),
        max_size=3,
    )
    choices: dict[str, st.SearchStrategy[Any]] = {
        "seed": st.integers(0, limits.MAX_SEED),
        "shuffle": st.one_of(
            st.booleans(),
            st.sampled_from(sorted(SHUFFLES)),
            st.fixed_dictionaries({"mode": st.sampled_from(sorted(SHUFFLES))}, optional={"window": window}),
        ),
        "shuffle_window": st.one_of(st.none(), window),
        "columns": st.one_of(st.none(), st.lists(st.sampled_from(["x", "y"]), unique=True)),
        "epochs": st.one_of(st.none(), st.integers(1, limits.MAX_EPOCH + 1)),
        "drop_last": st.booleans(),
        "provenance": st.booleans(),
        "pin_memory": st.booleans() if output == "torch" else st.just(False),
        "prefetch": st.integers(1, 64),
        "streams": st.integers(1, 8),
        "timeout_s": st.floats(0.001, 1e6),
        "max_retries": st.integers(0, 100),
        "max_message_bytes": st.integers(0, limits.MAX_MESSAGE_BYTES),
        "transforms": st.one_of(
            st.none(),
            st.lists(st.builds(lambda op, p: {"op": op, **p}, st.sampled_from(["pack", "resize", "windows"]), params), max_size=3),
        ),
        "on_error": st.sampled_from(ON_ERROR),
        "stream_idle_timeout_s": st.floats(0.001, 1e6),
        "mixture_block": st.integers(0, limits.MAX_MIXTURE_BLOCK),
        "mixture_epoch_samples": st.integers(0, limits.MAX_MIXTURE_EPOCH_SAMPLES),
    }
    if job:
        choices["job"] = st.one_of(st.none(), st.sampled_from(["run-42", "a.b_c:1"]))
    names = draw(st.sets(st.sampled_from(sorted(choices))))
    out = {name: draw(choices[name]) for name in sorted(names)}
    if skip_steps is not None:
        out["skip_steps"] = skip_steps
    out.update(
        batch_size=batch_size,
        world_size=world_size,
        rank=draw(st.integers(0, world_size - 1)),
        output=output,
        token="",
    )
    return out

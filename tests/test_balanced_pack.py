"""A balanced packed step, built by its ranks (server/read/balanced_layout.py + text.pack's windows), as a
property over random documents, world sizes, sequence lengths and modes: the rows of every rank, put
back in the step's row order, are the step's documents packed as one stream — every token once, with
the labels and positions of its whole document — whether a rank's reader takes whole documents or
only the values its rows need (the window's starts/stops, as gather_spans takes them)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.order.balance import deal_attention, deal_tokens, pack_step
from shardstream.order.read_order import StepLayout
from shardstream.server.read.balanced_layout import BalancedLayout
from shardstream.server.transforms.base import BatchContext, Params
from shardstream.server.transforms.text import Pack

EOS = 9_999


def _pack(seq_len: int) -> Pack:
    schema = pa.schema([pa.field("tokens", pa.list_(pa.int32())), pa.field("n", pa.int32())])
    return Pack(Params("text.pack", {"column": "tokens", "seq_len": seq_len, "eos_id": EOS, "lengths": "n"}), schema)


def _reference(docs: list[np.ndarray], seq_len: int) -> dict[str, np.ndarray]:
    """The step's documents packed as one stream in order: rows of seq_len, the last padded."""
    ids = np.concatenate([np.append(d, EOS) for d in docs])
    labels = np.concatenate([np.append(d[1:], [EOS, -100])[: len(d) + 1] if len(d) else np.array([-100]) for d in docs])
    pos = np.concatenate([np.arange(len(d) + 1) for d in docs])
    doc = np.concatenate([np.full(len(d) + 1, i) for i, d in enumerate(docs)])
    rows = -(-len(ids) // seq_len)
    pad = rows * seq_len - len(ids)
    out = {
        "input_ids": np.append(ids, [EOS] * pad),  # pad_id defaults to eos_id
        "labels": np.append(labels, [-100] * pad),
        "position_ids": np.append(pos, [0] * pad),
        "document_ids": np.append(doc, [-1] * pad),
    }
    return {k: v.reshape(rows, seq_len) for k, v in out.items()}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    world=st.integers(1, 9),
    seq_len=st.sampled_from([1, 5, 16, 64, 256]),
    mode=st.sampled_from(["tokens", "attention"]),
    sliced=st.booleans(),
)
def test_every_ranks_rows_are_the_steps_packing(lengths: list[int], world: int, seq_len: int, mode: str, sliced: bool) -> None:
    rng = np.random.default_rng(len(lengths) * 131 + world)
    docs = [rng.integers(0, 5_000, n).astype(np.int32) for n in lengths]
    step = StepLayout(len(docs), 0, world, -(-len(docs) // world))  # one step of every document
    layout = BalancedLayout(
        step, mode=mode, costs=lambda a, b: np.asarray(lengths[a:b], np.int64), seq_len=seq_len, slices="tokens" if sliced else None
    )
    pack = _pack(seq_len)
    want = _reference(docs, seq_len)
    owner = layout._step(0).owner
    got: dict[str, np.ndarray] = {k: np.full_like(v, -7) for k, v in want.items()}
    for rank in range(world):
        window = layout.window(0, rank)
        positions = np.asarray(layout.rank_positions(0, rank), np.int64)
        mine = [docs[int(p)] for p in positions]
        if sliced:  # what a rank's reader takes: values [start, stop) of each document
            mine = [d[a:b] for d, a, b in zip(mine, window.starts.tolist(), window.stops.tolist(), strict=True)]
        column = pa.array([d.tolist() for d in mine], pa.list_(pa.int32()))
        batch = pa.RecordBatch.from_arrays([column], names=["tokens"])
        ctx = BatchContext(0, 0, positions, np.zeros(len(positions), np.int64), windows={0: window})
        result = pack.apply(batch, ctx)
        rows = np.nonzero(owner == rank)[0]
        for k in want:
            values = np.asarray(result.batch.column(k).flatten()).reshape(-1, seq_len)
            assert len(values) == len(rows)
            got[k][rows] = values
    for k in want:
        assert np.array_equal(got[k], want[k]), k


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(0, 3_000), min_size=1, max_size=400),
    world=st.integers(1, 9),
    per_rank=st.integers(1, 4),
    seq_len=st.sampled_from([1, 16, 256, 2048]),
    mode=st.sampled_from(["tokens", "attention"]),
    first=st.integers(0, 40),
    stride=st.sampled_from([1, 2, 3, 5, 16, 17]),
)
def test_a_steps_split_is_its_own_whichever_steps_are_planned_with_it(
    lengths: list[int], world: int, per_rank: int, seq_len: int, mode: str, first: int, stride: int
) -> None:
    """The layout packs and deals the steps a stream asks for (every `stride`-th) among READ_STEPS
    at a time, from whichever step it asks first: every step's split is still pack_step's and
    deal_*'s of its own documents alone."""
    layout = StepLayout(len(lengths), 0, world, per_rank)
    balanced = BalancedLayout(layout, mode=mode, costs=lambda a, b: np.asarray(lengths[a:b], np.int64), seq_len=seq_len)
    steps = list(range(layout.num_steps))
    first %= len(steps)
    for s in steps[first::stride] + steps:  # a strided stream from a step in the middle, then every step
        a, b = layout.global_range(s)
        packed = pack_step(np.asarray(lengths[a:b], np.int64) + 1, seq_len)
        owner = deal_tokens(packed.num_rows, world) if mode == "tokens" else deal_attention(packed.row_cost, world)
        got = balanced._step(s)
        assert got.num_rows == packed.num_rows and np.array_equal(got.owner, owner)
        assert np.array_equal(got.ends, np.cumsum(packed.sizes))
        assert np.array_equal(got.rank_cost, np.bincount(owner, weights=packed.row_cost, minlength=world))

"""Transforms as pure functions over record batches: properties over many random inputs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.client.convert import to_numpy, to_torch
from shardstream.errors import InvalidArgumentError
from shardstream.server.transforms.base import BatchContext, Params
from shardstream.server.transforms.rl import nstep_returns
from shardstream.server.transforms.text import IGNORE_INDEX, Pack


def _pack(
    docs: list[list[int]], steps: list[int], seq_len: int, eos: int = 99
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    col = pa.array(docs, pa.list_(pa.int32()))
    batch = pa.record_batch({"tokens": col})
    t = Pack(Params("text.pack", {"column": "tokens", "seq_len": seq_len, "eos_id": eos}), batch.schema)
    positions = np.arange(len(docs), dtype=np.int64) * 10 + 3
    res = t.apply(batch, BatchContext(0, 0, positions, np.array(steps, np.int64)))
    assert not res.errors
    return to_numpy(res.batch), res.index


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 50), max_size=30), max_size=12),
    st.integers(1, 17),
    st.data(),
)
def test_pack_preserves_every_token_once_in_order_within_steps(
    docs: list[list[int]], seq_len: int, data: st.DataObject
) -> None:
    # contiguous steps of random sizes
    steps, s = [], 0
    for _ in docs:
        s += data.draw(st.integers(0, 1))
        steps.append(s)
    out, index = _pack(docs, steps, seq_len)
    ids, labels, pos, doc = (out[k] for k in ("input_ids", "labels", "position_ids", "document_ids"))
    positions = np.arange(len(docs)) * 10 + 3
    # Rows per step = ceil((tokens + one EOS per document) / seq_len), steps in order.
    row = 0
    for step in sorted(set(steps)):
        members = [i for i, x in enumerate(steps) if x == step]
        n = sum(len(docs[i]) + 1 for i in members)
        rows = -(-n // seq_len)
        flat_ids = ids[row : row + rows].reshape(-1)
        flat_doc = doc[row : row + rows].reshape(-1)
        flat_pos = pos[row : row + rows].reshape(-1)
        flat_lab = labels[row : row + rows].reshape(-1)
        expect = [t for i in members for t in docs[i] + [99]]
        assert flat_ids[:n].tolist() == expect
        assert flat_doc[:n].tolist() == [int(positions[i]) for i in members for _ in range(len(docs[i]) + 1)]
        assert flat_pos[:n].tolist() == [p for i in members for p in range(len(docs[i]) + 1)]
        assert (flat_doc[n:] == -1).all() and (flat_lab[n:] == IGNORE_INDEX).all()
        for k in range(n):
            nxt_same = k + 1 < n and flat_doc[k + 1] == flat_doc[k]
            assert flat_lab[k] == (flat_ids[k + 1] if nxt_same else IGNORE_INDEX)
        # Each row's provenance is the document of its first token.
        for r in range(rows):
            assert positions[index[row + r]] == flat_doc[r * seq_len]
        row += rows
    assert row == len(ids)


def test_pack_reports_null_documents_as_bad_samples() -> None:
    batch = pa.record_batch({"tokens": pa.array([[1, 2], None, [3]], pa.list_(pa.int32()))})
    t = Pack(Params("text.pack", {"column": "tokens", "seq_len": 4, "eos_id": 0}), batch.schema)
    res = t.apply(batch, BatchContext(0, 0, np.arange(3), np.zeros(3, np.int64)))
    assert [i for i, _ in res.errors] == [1]
    assert to_numpy(res.batch)["input_ids"].reshape(-1).tolist() == [1, 2, 0, 3, 0, 0, 0, 0]


def _reference_pack(
    docs: list[list[int] | None], steps: list[int], positions: list[int], seq_len: int, eos: int, pad: int
) -> tuple[dict[str, list[list[int]]], list[int]]:
    """Per-rank packing token by token: each step's documents (nulls skipped), each followed by EOS,
    cut into rows of seq_len, the step's last row padded; each row's input row is that of its first
    token's document."""
    out: dict[str, list[list[int]]] = {k: [] for k in ("input_ids", "labels", "position_ids", "document_ids")}
    index: list[int] = []
    for step in sorted(set(steps)):
        ids: list[int] = []
        labels: list[int] = []
        pos: list[int] = []
        doc: list[int] = []
        row_of: list[int] = []
        for i, d in enumerate(docs):
            if steps[i] != step or d is None:
                continue
            ids += [*d, eos]
            labels += [*d[1:], eos][: len(d)] + [IGNORE_INDEX]  # the next token of the document; EOS: none
            pos += range(len(d) + 1)
            doc += [positions[i]] * (len(d) + 1)
            row_of += [i] * (len(d) + 1)
        pad_n = -len(ids) % seq_len
        padded = {
            "input_ids": ids + [pad] * pad_n,
            "labels": labels + [IGNORE_INDEX] * pad_n,
            "position_ids": pos + [0] * pad_n,
            "document_ids": doc + [-1] * pad_n,
        }
        for k, flat in padded.items():
            out[k].extend(flat[r : r + seq_len] for r in range(0, len(flat), seq_len))
        index.extend(row_of[r] for r in range(0, len(ids), seq_len))
    return out, index


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["list", "large_list", "fixed_size_list", "sliced"]),
    st.integers(0, 40),
    st.lists(st.one_of(st.none(), st.lists(st.integers(0, 50), max_size=40)), max_size=12),
    st.integers(1, 17),
    st.sampled_from([None, 98]),
    st.data(),
)
def test_pack_equals_a_token_by_token_packer(
    kind: str, width: int, docs: list[list[int] | None], seq_len: int, pad_id: int | None, data: st.DataObject
) -> None:
    """Every output of per-rank packing (ids, labels, positions, document ids, padding, row and
    document boundaries, each row's provenance) over list, large-list, fixed-size and sliced columns
    with null documents among them, against the plainest packer."""
    if kind == "fixed_size_list":  # every document has `width` tokens
        docs = [None if d is None else [d[j % len(d)] if d else 7 for j in range(width)] for d in docs]
        col = pa.array(docs, pa.list_(pa.int32(), width))
    elif kind == "sliced":  # a slice of a larger column: offsets into values that start elsewhere
        col = pa.array([[1, 2, 3], *docs, [4]], pa.list_(pa.int32())).slice(1, len(docs))
    else:
        col = pa.array(docs, pa.large_list(pa.int32()) if kind == "large_list" else pa.list_(pa.int32()))
    steps = list(np.cumsum([data.draw(st.integers(0, 1)) for _ in docs]))
    positions = [data.draw(st.integers(0, 10_000)) for _ in docs]
    params: dict = {"column": "tokens", "seq_len": seq_len, "eos_id": 99}
    if pad_id is not None:
        params["pad_id"] = pad_id
    batch = pa.record_batch({"tokens": col})
    res = Pack(Params("text.pack", params), batch.schema).apply(
        batch, BatchContext(0, 0, np.array(positions, np.int64), np.array(steps, np.int64))
    )
    want, index = _reference_pack(docs, steps, positions, seq_len, 99, 99 if pad_id is None else pad_id)
    assert [i for i, _ in res.errors] == [i for i, d in enumerate(docs) if d is None]
    got = to_numpy(res.batch)
    for k, rows in want.items():
        assert got[k].reshape(-1, seq_len).tolist() == rows, k
    assert res.index.tolist() == index


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-10, 10, width=32), min_size=1, max_size=40),
    st.integers(1, 8),
    st.floats(0, 1),
    st.booleans(),
)
def test_nstep_returns_equal_a_hand_loop(rewards: list[float], n: int, gamma: float, terminal: bool) -> None:
    r = np.array(rewards, np.float32)
    g, boot = nstep_returns(r, terminal, n, gamma)
    T = len(r)
    for t in range(T):
        m = min(n, T - t)
        expect = 0.0
        for k in range(m):
            expect += gamma**k * float(r[t + k])
        assert g[t] == pytest.approx(expect, rel=1e-5, abs=1e-4)
        assert boot[t] == pytest.approx(0.0 if terminal and t + m >= T else gamma**m, rel=1e-6, abs=1e-30)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"column": "tokens"}, "'seq_len' is required"),
        ({"column": "tokens", "seq_len": True}, "'seq_len' must be an integer"),
        ({"column": "tokens", "seq_len": 8, "eos_id": -1}, "'eos_id' must be an integer"),
    ],
)
def test_params_are_checked(raw: dict, message: str) -> None:
    schema = pa.schema([pa.field("tokens", pa.list_(pa.int32()))])
    with pytest.raises(InvalidArgumentError, match=message):
        Pack(Params("text.pack", raw), schema)


def test_fixed_shape_tensors_reach_numpy_and_torch_without_a_copy() -> None:
    values = np.arange(2 * 3 * 4 * 2, dtype=np.uint8)
    storage = pa.FixedSizeListArray.from_arrays(pa.array(values), 24)
    arr = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.uint8(), [3, 4, 2]), storage)
    batch = pa.record_batch([arr], names=["image"])
    address = storage.flatten().buffers()[1].address
    n = to_numpy(batch)["image"]
    assert n.shape == (2, 3, 4, 2) and n.ctypes.data == address
    np.testing.assert_array_equal(n.reshape(-1), values)
    t = to_torch(batch)["image"]
    assert tuple(t.shape) == (2, 3, 4, 2) and t.data_ptr() == address

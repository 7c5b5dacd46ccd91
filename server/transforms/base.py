"""What every transform shares: typed parameters, the per-batch context, per-sample error capture.

A transform is built once per Read request from its parameters and the schema it will receive
(`__init__` validates both and sets `output_schema`), then applied to each message's rows:

    result = transform.apply(batch, ctx)

`result.batch` holds the output rows, `result.index[j]` names the input row output row j comes
from (for a row made of several inputs, the first), and `result.errors` the input rows that could
not be processed, with a reason. The pipeline (pipeline.py) carries positions, steps and
provenance through `index` and applies the on_error policy, so transforms never see it.

Randomness (random crops) comes from `ctx.rng(i, salt)`: a generator seeded by (seed, epoch,
global position of row i), so a resumed or failed-over stream repeats the same draws.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from shardstream.errors import InvalidArgumentError

__all__ = [
    "BatchContext",
    "Params",
    "Result",
    "Transform",
    "fixed_bytes",
    "fixed_tensor",
    "keep_rows",
    "map_samples",
    "set_column",
    "tensor_array",
    "tensor_type",
]

_MISSING = object()
_REPR_CHARS = 100  # of a bad value quoted in an error


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_CHARS else f"{text[:_REPR_CHARS]}... ({len(text)} characters)"


class Params:
    """The parameters of one transform, read once each and checked; leftovers are an error."""

    def __init__(self, op: str, raw: Mapping[str, Any]) -> None:
        self.op = op
        self._raw = dict(raw)
        self._used: set[str] = {"op"}

    def _bad(self, name: str, want: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{self.op}: parameter {name!r} must be {want}, got {_short_repr(self._raw[name])}"
        )

    def _given(self, name: str, default: Any) -> tuple[bool, Any]:
        """(True, value) when the parameter is set, (False, default) when not; required without a default."""
        self._used.add(name)
        value = self._raw.get(name)
        if value is None:
            if default is _MISSING:
                raise InvalidArgumentError(f"{self.op}: parameter {name!r} is required")
            return False, default
        return True, value

    def get(self, name: str, default: Any = _MISSING) -> Any:
        return self._given(name, default)[1]

    def str(self, name: str, default: Any = _MISSING, choices: Sequence[str] | None = None) -> Any:
        given, v = self._given(name, default)
        if not given:
            return v
        if not isinstance(v, str) or (choices is not None and v not in choices):
            raise self._bad(name, f"one of {', '.join(map(repr, choices))}" if choices else "a string")
        return v

    def int(self, name: str, default: Any = _MISSING, low: int = 0, high: int = 2**31 - 1) -> Any:
        given, v = self._given(name, default)
        if not given:
            return v
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise self._bad(name, f"an integer in [{low}, {high}]")
        return v

    def float(
        self, name: str, default: Any = _MISSING, low: float = -math.inf, high: float = math.inf
    ) -> Any:
        given, v = self._given(name, default)
        if not given:
            return v
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not (low <= v <= high and math.isfinite(v))
        ):
            raise self._bad(name, f"a number in [{low}, {high}]")
        return float(v)

    def bool(self, name: str, default: Any = _MISSING) -> Any:
        given, v = self._given(name, default)
        if given and not isinstance(v, bool):
            raise self._bad(name, "true or false")
        return v

    def size(self, name: str, default: Any = _MISSING, high: int = 8192) -> Any:
        """[height, width] (an integer n means [n, n])."""
        given, v = self._given(name, default)
        if not given:
            return v
        if isinstance(v, int) and not isinstance(v, bool):
            v = [v, v]
        if (
            not isinstance(v, list | tuple)
            or len(v) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= high for x in v)
        ):
            raise self._bad(name, f"[height, width] with sides in [1, {high}]")
        return int(v[0]), int(v[1])

    def floats(self, name: str, n: int, default: Any = _MISSING) -> Any:
        given, v = self._given(name, default)
        if not given:
            return v
        if (
            not isinstance(v, list | tuple)
            or len(v) != n
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
        ):
            raise self._bad(name, f"a list of {n} numbers")
        return [float(x) for x in v]

    def check_unused(self) -> None:
        extra = sorted(set(self._raw) - self._used)
        if extra:
            raise InvalidArgumentError(f"{self.op}: unknown parameter(s) {', '.join(map(repr, extra))}")


def column_of(
    op: str, schema: pa.Schema, name: str, want: str, ok: Callable[[pa.DataType], bool]
) -> pa.Field:
    """The input field `name`, checked to be of the kind `want`."""
    if name not in schema.names:
        raise InvalidArgumentError(
            f"{op}: no column {name!r} (the columns at this point are: {', '.join(schema.names)})"
        )
    f = schema.field(name)
    if not ok(f.type):
        raise InvalidArgumentError(f"{op}: column {name!r} must be {want}, it is {f.type}")
    return f


def is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def replace_field(schema: pa.Schema, name: str, new: pa.Field) -> pa.Schema:
    """`schema` with column `name` replaced by `new` in place, or `new` appended when absent."""
    if name in schema.names:
        return schema.set(schema.get_field_index(name), new)
    return schema.append(new)


def set_column(batch: pa.RecordBatch, name: str, col: pa.Array, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` with column `name` replaced by `col` (or appended), as `schema` (from replace_field)."""
    arrays = list(batch.columns)
    if name in batch.schema.names:
        arrays[batch.schema.get_field_index(name)] = col
    else:
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def keep_rows(n: int, errors: list[tuple[int, str]]) -> np.ndarray:
    """The input rows (int64) that have no error."""
    keep = np.ones(n, bool)
    keep[[i for i, _ in errors]] = False
    return np.nonzero(keep)[0].astype(np.int64)


def tensor_array(a: np.ndarray) -> pa.Array:
    """An array of shape (rows, *shape) as the Arrow array of type `tensor_type(shape, a.dtype)`,
    sharing its memory (once contiguous)."""
    shape = a.shape[1:]
    flat = pa.array(np.ascontiguousarray(a).reshape(-1))
    storage = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(shape)))
    if len(shape) == 1:
        return storage
    return pa.ExtensionArray.from_storage(tensor_type(shape, a.dtype), storage)


def fixed_tensor(
    values: list[np.ndarray | None], shape: tuple[int, ...], dtype: np.dtype, keep: np.ndarray
) -> pa.Array:
    """Rows `keep` of `values` (each of `shape`) as one fixed-shape tensor array, values copied once."""
    out = np.empty((len(keep), *shape), dtype)
    for j, i in enumerate(keep.tolist()):
        out[j] = np.asarray(values[i]).reshape(shape)
    return tensor_array(out)


def fixed_bytes(t: pa.DataType) -> int | None:
    """Bytes one value of type `t` takes when its size is fixed (fixed-size lists and tensors of
    fixed-width values, nested); None for variable-size types (strings, lists)."""
    if isinstance(t, pa.BaseExtensionType):
        t = t.storage_type
    if pa.types.is_fixed_size_list(t):
        inner = fixed_bytes(t.value_type)
        return None if inner is None else t.list_size * inner
    if pa.types.is_boolean(t):
        return 1
    try:
        return max(1, t.bit_width // 8)
    except ValueError:  # not a fixed-width type
        return None


def tensor_type(shape: tuple[int, ...], dtype: np.dtype) -> pa.DataType:
    """The Arrow type `fixed_tensor` makes: a fixed-size list for 1-D, else a fixed-shape tensor."""
    value = pa.from_numpy_dtype(dtype)
    if len(shape) == 1:
        return pa.list_(value, shape[0])
    return pa.fixed_shape_tensor(value, list(shape))


@functools.lru_cache(maxsize=64)
def _salt_key(salt: str) -> int:
    """A stable integer per transform name, so different transforms draw independent numbers."""
    return int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "little")


@dataclass
class BatchContext:
    """What a transform may know about the rows it gets (one Read message's worth)."""

    seed: int
    epoch: int
    positions: np.ndarray  # int64 global position in the epoch's order, per input row
    steps: np.ndarray  # int64 step index, per input row (rows of a step are contiguous)
    pool: Executor | None = None  # for per-sample work that releases the GIL
    threads: int = 1
    # Provenance per input row (text.pack's "documents" lists every document of a row with these)
    shards: np.ndarray | None = None  # int32 shard index
    rows: np.ndarray | None = None  # int64 row in the shard
    sources: np.ndarray | None = None  # int32 mixture source (None: one dataset)
    # Balanced packing (server/read/balanced_layout.py): step -> this rank's TokenWindow of it
    windows: Mapping[int, Any] | None = None

    def rng(self, i: int, salt: str) -> np.random.Generator:
        """A generator for row i that depends on (seed, epoch, position, salt) only."""
        return np.random.default_rng([self.seed, self.epoch, int(self.positions[i]), _salt_key(salt)])


@dataclass
class Result:
    batch: pa.RecordBatch
    index: np.ndarray  # int64, per output row: the input row it comes from
    errors: list[tuple[int, str]] = field(default_factory=list)  # (input row, reason)


class Transform:
    """One operation of the catalogue. Subclasses set `op`, parse params, set `output_schema`."""

    op: ClassVar[str]
    # Each input row's output depends on that row only (not on the other rows of its step), so a
    # step may be transformed in parts (server/read/build.py splits steps larger than a message that way).
    per_sample: ClassVar[bool] = True
    output_schema: pa.Schema

    @property
    def deterministic(self) -> bool:
        """Each output row is made from one input row's values and the parameters alone — not the
        seed, epoch, position or the other rows — and an input row gives at most one output row.
        A run of such transforms at the head of a pipeline is computed once per row group and
        shared by every stream and job of the node (server/read/feature_cache.py). False unless an op
        says otherwise."""
        return False

    def apply(self, batch: pa.RecordBatch, ctx: BatchContext) -> Result:
        raise NotImplementedError


def map_samples(
    fn: Callable[[int], Any], n: int, ctx: BatchContext
) -> tuple[list[Any], list[tuple[int, str]]]:
    """fn(i) for i in range(n), on the pool in chunks; (results, errors). A sample whose fn raises
    gets None and an error entry (bad data must never take the server down)."""

    def run(rows: Iterable[int]) -> list[tuple[int, Any, str | None]]:
        out = []
        for i in rows:
            try:
                out.append((i, fn(i), None))
            except Exception as exc:  # noqa: BLE001 — any failure on one sample is that sample's
                out.append((i, None, f"{type(exc).__name__}: {exc}"))
        return out

    if ctx.pool is None or ctx.threads <= 1 or n < 2:
        parts = [run(range(n))]
    else:
        chunks = min(n, ctx.threads * 2)
        bounds = np.linspace(0, n, chunks + 1).astype(int)
        parts = list(ctx.pool.map(run, [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]))
    results: list[Any] = [None] * n
    errors = []
    for part in parts:
        for i, value, err in part:
            if err is None:
                results[i] = value
            else:
                errors.append((i, err))
    return results, errors

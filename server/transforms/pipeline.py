"""A request's transforms in order, applied to one Read message's rows, with the on_error policy.

The pipeline takes the selected rows of a message (requested columns + provenance), hands the
data columns through each transform, and carries per-row bookkeeping (step, global position,
shard, row, source) through each transform's `index`. Samples a transform cannot process are
either a DATA_LOSS naming dataset version, shard and row (on_error="fail") or dropped and
reported per step (on_error="skip"); which samples are dropped depends on their bytes only.

A pipeline whose head is deterministic (prefix.py) may take that head's output from a shared source
(`share_head`: the feature cache of server/read/feature_cache.py, wired by the read planner): the rows,
their order, the errors and what on_error does with them are the same as running it here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from prometheus_client import Counter, Histogram

from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.order.read_query import MAX_TRANSFORMS, check_params_json
from shardstream.transform_spec import ON_ERROR
from shardstream.v1 import shardstream_pb2 as pb

from ..policy.dataset_label import OTHER
from .base import BatchContext, Params, Transform, fixed_bytes
from .ops import OPS
from .prefix import PrefixSource, deterministic_head

__all__ = ["DEFAULT_MAX_SAMPLE_BYTES", "ON_ERROR", "PROVENANCE", "Pipeline", "StepRows", "build_pipeline"]

# What a transform may produce per sample (fixed-size columns), unless the server says otherwise
# (`serve --max-sample-mib`, ServerConfig.max_sample_bytes, read/request_limits.py RequestLimits).
DEFAULT_MAX_SAMPLE_BYTES = 64 << 20

PROVENANCE = ("_shard", "_row", "_source", "_documents")  # _documents: text.pack's "documents"

TRANSFORM_SECONDS = Histogram(
    "shardstream_transform_seconds",
    "Time one transform took over one Read message's rows",
    ["op", "dataset"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
SAMPLES_SKIPPED = Counter(
    "shardstream_samples_skipped_total",
    "Samples a transform could not process, skipped (on_error=skip)",
    ["op", "dataset"],
)


@dataclass(frozen=True)
class StepRows:
    """What the pipeline made of one step: its output rows and the samples it skipped."""

    rows: int
    skipped: list[pb.SkippedSample]


class Pipeline:
    def __init__(
        self,
        transforms: Sequence[Transform],
        on_error: str,
        describe: Callable[[int, int, int], str],
        specs: Sequence[tuple[str, str]] = (),
    ):
        self.transforms = list(transforms)
        self.on_error = on_error
        self.dataset = OTHER  # its metrics' `dataset` label (server/policy/dataset_label.py; the servicer sets it)
        self._describe = describe  # (source, shard, row) -> "toy@2 shard 3 (part-3.parquet) row 17"
        # (op, parameters as canonical JSON) per transform: what a shared head's results are keyed by
        self.specs = list(specs)
        self.features: PrefixSource | None = None  # serves the deterministic head (share_head)
        self.shared = 0  # transforms at the head that `features` serves

    def share_head(self, features: PrefixSource, count: int) -> None:
        """Take the output of the first `count` transforms (a deterministic head: prefix.py) from
        `features` instead of running them, whenever it can serve a message's rows."""
        assert 0 < count <= deterministic_head(self.transforms), "only a deterministic head is shared"
        self.features, self.shared = features, count

    def __bool__(self) -> bool:
        return bool(self.transforms)

    @property
    def per_sample(self) -> bool:
        """Every transform maps samples on their own: a step's samples may be transformed in parts."""
        return all(t.per_sample for t in self.transforms)

    def apply(
        self,
        batch: pa.RecordBatch,
        *,
        seed: int,
        epoch: int,
        positions: np.ndarray,
        steps: np.ndarray,
        step_ids: Sequence[int],
        pool: Executor | None,
        threads: int,
        windows: Mapping[int, Any] | None = None,
        take: Callable[[], pa.RecordBatch] | None = None,
    ) -> tuple[pa.RecordBatch, list[StepRows]]:
        """(output batch with provenance columns last, per step of `step_ids`: rows and skips).

        `take`: `batch` holds only the rows' provenance columns, and `take()` the same rows with all
        their columns, called only if the shared head (`features`) does not serve them: a message
        whose head the feature cache holds never takes its stored bytes."""
        head = self.features.prefix(batch, pool, threads) if self.features and batch.num_rows else None
        if head is None and take is not None:
            batch = take()
        names = batch.schema.names
        shard = batch.column("_shard").to_numpy()
        row = batch.column("_row").to_numpy()
        source = batch.column("_source").to_numpy() if "_source" in names else None
        data = batch.select([n for n in names if n not in PROVENANCE])
        skipped: dict[int, list[pb.SkippedSample]] = {s: [] for s in step_ids}

        def failed(op: str, errors: Sequence[tuple[int, str]]) -> None:
            """The on_error policy for the rows (current numbering) `op` could not process."""
            for i, reason in sorted(errors):
                src = int(source[i]) if source is not None else 0
                where = self._describe(src, int(shard[i]), int(row[i]))
                if self.on_error == "fail":
                    raise DataLossError(
                        f"{op} failed on {where} (position {int(positions[i])} of epoch {epoch}): {reason} "
                        "(on_error='skip' leaves such samples out)"
                    )
                SAMPLES_SKIPPED.labels(op, self.dataset).inc()
                skipped[int(steps[i])].append(
                    pb.SkippedSample(
                        position=int(positions[i]),
                        shard=int(shard[i]),
                        row=int(row[i]),
                        source=src,
                        reason=f"{op}: {reason}",
                    )
                )

        rest = self.transforms
        if head is not None:  # the shared head's results: the same rows, errors and order as running it
            for t, errors in zip(self.transforms[: self.shared], head.errors, strict=True):
                failed(t.op, errors)
            idx = head.index
            data, positions, steps, shard, row = head.batch, positions[idx], steps[idx], shard[idx], row[idx]
            if source is not None:
                source = source[idx]
            rest = self.transforms[self.shared :]
        for t in rest:
            ctx = BatchContext(seed, epoch, positions, steps, pool, threads, shard, row, source, windows)
            t0 = time.perf_counter()
            res = t.apply(data, ctx)
            TRANSFORM_SECONDS.labels(t.op, self.dataset).observe(time.perf_counter() - t0)
            failed(t.op, res.errors)
            idx = res.index
            data, positions, steps, shard, row = res.batch, positions[idx], steps[idx], shard[idx], row[idx]
            if source is not None:
                source = source[idx]
        counts = {s: 0 for s in step_ids}
        ids, n = np.unique(steps, return_counts=True)
        for s, c in zip(ids.tolist(), n.tolist(), strict=True):
            counts[s] = c
        arrays = list(data.columns) + [pa.array(shard, pa.int32()), pa.array(row, pa.int64())]
        fields = list(data.schema) + [pa.field("_shard", pa.int32()), pa.field("_row", pa.int64())]
        if source is not None:
            arrays.append(pa.array(source, pa.int32()))
            fields.append(pa.field("_source", pa.int32()))
        out = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=data.schema.metadata))
        return out, [StepRows(counts[s], skipped[s]) for s in step_ids]


def _check_output_size(op: str, before: pa.Schema, after: pa.Schema, max_sample_bytes: int) -> None:
    """Refuse a transform whose new fixed-size columns take more than `max_sample_bytes` per row
    (image.decode's pixels, video.frames' frames, audio.decode's samples, text.pack's seq_len,
    rl.windows' window): what one 161-byte request may make a server allocate per sample."""
    new = [f for f in after if f.name not in before.names or not before.field(f.name).equals(f)]
    sizes = [(f, fixed_bytes(f.type)) for f in new]
    total = sum(n for _, n in sizes if n is not None)
    if total > max_sample_bytes:
        parts = ", ".join(f"{f.name}: {f.type} = {n} bytes" for f, n in sizes if n)
        raise InvalidArgumentError(
            f"{op}: its output is {total} bytes per sample ({parts}), over this server's limit of "
            f"{max_sample_bytes} bytes per sample (--max-sample-mib): ask for smaller outputs"
        )


def build_pipeline(
    specs: Sequence[pb.Transform],
    on_error: str,
    schema: pa.Schema,
    describe: Callable[[int, int, int], str],
    *,
    max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES,
) -> Pipeline:
    """Validate the request's transforms against the schema they will see; INVALID_ARGUMENT naming
    the op and parameter on any problem, before a byte is read."""
    on_error = on_error or "fail"
    if on_error not in ON_ERROR:
        raise InvalidArgumentError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    if len(specs) > MAX_TRANSFORMS:
        raise InvalidArgumentError(f"at most {MAX_TRANSFORMS} transforms per request, got {len(specs)}")
    schema = pa.schema([f for f in schema if f.name not in PROVENANCE], metadata=schema.metadata)
    out = []
    keys = []
    for k, spec in enumerate(specs):
        cls = OPS.get(spec.op)
        if cls is None:
            raise InvalidArgumentError(
                f"transform {k}: unknown op {spec.op!r} (known: {', '.join(sorted(OPS))})"
            )
        check_params_json(spec.op, spec.params_json)  # size and depth, before the parser recurses
        try:
            raw = json.loads(spec.params_json or "{}")
        except (ValueError, RecursionError) as exc:  # bad JSON; a number of over 4,300 digits
            raise InvalidArgumentError(f"{spec.op}: parameters are not valid JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise InvalidArgumentError(f"{spec.op}: parameters must be a JSON object, got {raw!r}")
        params = Params(spec.op, raw)
        t = cls(params, schema)
        params.check_unused()
        _check_output_size(spec.op, schema, t.output_schema, max_sample_bytes)
        schema = t.output_schema
        out.append(t)
        keys.append((spec.op, json.dumps(raw, sort_keys=True, separators=(",", ":"))))
    return Pipeline(out, on_error, describe, keys)

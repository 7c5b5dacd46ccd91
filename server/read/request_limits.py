"""The server's own limits on a Read (flags of `shardstream serve`), checked after the ticket is decoded.

The fixed limits — sizes (world, stride, mixture block and epoch, columns, transforms, schedule phases
and skip ranges), ranges (epoch, offsets; a seed may be any uint64: it is hashed) and strings — are
checked by the wire codec when it decodes a request (shardstream/order/read_query.py), one
INVALID_ARGUMENT naming the field and its limit; they are re-exported here. Without them, one 161-byte
request could make a server allocate gigabytes (`mixture_block` 2^32-1 builds 32 GiB of schedule) or
fail with INTERNAL instead of saying what is wrong (`mixture_epoch_samples` 2^64-1 overflows int64 math).
`RequestLimits.check(query)` checks what a server may configure: the batch size.

`check_params_json(op, text)` bounds a transform's JSON parameters by size and nesting depth before
`json.loads` sees them. What a transform may *produce* per sample is bounded where transforms are built
(transforms/pipeline.py, `max_sample_bytes`, its default there); bytes per message where messages are built (build.py).

Pure: no I/O, no gRPC. The limits a server uses come from `ServerConfig` (serving/config.py); the defaults
here are those of `shardstream serve` and are documented in the proto's field comments.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardstream.errors import InvalidArgumentError
from shardstream.order.read_query import (
    MAX_COLUMNS,
    MAX_COUNT,
    MAX_EPOCH,
    MAX_MIXTURE_BLOCK,
    MAX_MIXTURE_EPOCH_SAMPLES,
    MAX_MIXTURE_SOURCES,
    MAX_PARAMS_JSON_BYTES,
    MAX_PARAMS_JSON_DEPTH,
    MAX_REF_CHARS,
    MAX_SHUFFLE_WINDOW,
    MAX_STEP_STRIDE,
    MAX_STRING_CHARS,
    MAX_TRANSFORMS,
    MAX_WORLD_SIZE,
    ReadQuery,
    check_params_json,
)

from ..transforms.pipeline import DEFAULT_MAX_SAMPLE_BYTES

__all__ = [  # the fixed limits are the codec's (read_query.py), re-exported
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MESSAGE_CAP_BYTES",
    "MAX_COLUMNS",
    "MAX_COUNT",
    "MAX_EPOCH",
    "MAX_MIXTURE_BLOCK",
    "MAX_MIXTURE_EPOCH_SAMPLES",
    "MAX_MIXTURE_SOURCES",
    "MAX_PARAMS_JSON_BYTES",
    "MAX_PARAMS_JSON_DEPTH",
    "MAX_REF_CHARS",
    "MAX_SHUFFLE_WINDOW",
    "MAX_STEP_STRIDE",
    "MAX_STRING_CHARS",
    "MAX_TRANSFORMS",
    "MAX_WORLD_SIZE",
    "RequestLimits",
    "check_params_json",
]

DEFAULT_MAX_BATCH_SIZE = 65_536  # rows per rank per step
DEFAULT_MESSAGE_CAP_BYTES = 64 << 20  # the hard cap on one Read message (a larger step is split)


@dataclass(frozen=True)
class RequestLimits:
    """The server-configurable limits (flags of `shardstream serve`); the fixed ones are the codec's."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_message_bytes: int = DEFAULT_MESSAGE_CAP_BYTES
    max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_message_bytes", "max_sample_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    def check(self, query: ReadQuery) -> None:
        """Raise InvalidArgumentError naming the first field of `query` over this server's limits."""
        _at_most("batch_size", query.batch_size, self.max_batch_size, " (this server's --max-batch-size)")
        for i, ph in enumerate(query.batch_schedule):
            _at_most(
                f"batch_schedule[{i}].batch_size",
                ph.batch_size,
                self.max_batch_size,
                " (this server's --max-batch-size)",
            )


def _at_most(field: str, value: int, limit: int, what: str = "") -> None:
    if value > limit:
        raise InvalidArgumentError(f"{field} must be at most {limit}{what}, got {value}")

"""The integer ranges a Read request may carry (protos/shardstream/v1, server/read/request_limits.py), for
the checks made where a value is given — a Loader's arguments, a schedule, a shuffle spec — so that a
value the wire cannot hold, or every server refuses, is one line naming the argument and its range
when the object is built, not a bare `ValueError: Value out of range` from protobuf at the first
batch. Pure: no I/O.

A server's own flags may be stricter (`--max-batch-size`, 65,536 by default): those are its
INVALID_ARGUMENT when a request arrives, since a client cannot know them.
"""

from __future__ import annotations

from shardstream.errors import InvalidArgumentError

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_EPOCH",
    "MAX_MESSAGE_BYTES",
    "MAX_MIXTURE_BLOCK",
    "MAX_MIXTURE_EPOCH_SAMPLES",
    "MAX_POSITION",
    "MAX_SEED",
    "MAX_SHUFFLE_WINDOW",
    "MAX_WORLD_SIZE",
    "check_int",
    "shown",
]

MAX_UINT32 = (1 << 32) - 1
MAX_UINT64 = (1 << 64) - 1

MAX_BATCH_SIZE = MAX_UINT32  # batch_size, BatchPhase.batch_size (a server's --max-batch-size is less)
MAX_SEED = MAX_UINT64  # any uint64: it is hashed
MAX_EPOCH = MAX_UINT32  # ReadRequest.epoch
MAX_WORLD_SIZE = 1 << 20
MAX_SHUFFLE_WINDOW = 1 << 20  # blocks
MAX_POSITION = 1 << 62  # job positions and step counts: offsets, schedule phases, skip ranges
MAX_MIXTURE_BLOCK = 1 << 20  # samples
MAX_MIXTURE_EPOCH_SAMPLES = 1 << 48
MAX_MESSAGE_BYTES = MAX_UINT64  # a server clamps it to its cap


def shown(value: object) -> str:
    """`value` for an error line: a huge integer by its size (its repr could be thousands of digits,
    past what Python converts to text at all), anything else by its repr, cut short."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except ValueError:  # holds an integer too long to write
        return f"a {type(value).__name__}"
    return text if len(text) <= 200 else f"{text[:200]}..."


def check_int(name: str, value: object, low: int, high: int, unit: str = "") -> int:
    """`value` if it is an int (not a bool) in [low, high], else InvalidArgumentError naming `name`
    and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(
            f"{name} must be an integer from {low} to {high}{f' ({unit})' if unit else ''}, got {shown(value)}"
        )
    return value

"""Limits on what one Read request may ask for, checked before anything is planned or read.

`RequestLimits.check(request)` refuses a malformed or absurd request with one INVALID_ARGUMENT that
names the field and its limit: sizes (batch, world, stride, mixture block and epoch, columns,
transforms, schedule phases and skip ranges), ranges (epoch, offsets; a seed may be any uint64: it is hashed) and strings. Without
these, one 161-byte request could make a server allocate gigabytes (`mixture_block` 2^32-1 builds
32 GiB of schedule) or fail with INTERNAL instead of saying what is wrong (`mixture_epoch_samples`
2^64-1 overflows int64 math).

`check_params_json(op, text)` bounds a transform's JSON parameters by size and nesting depth before
`json.loads` sees them (100k nested brackets would otherwise end in a RecursionError). What a
transform may *produce* per sample is bounded where transforms are built (transforms/pipeline.py,
`max_sample_bytes`); bytes per message where messages are built (build.py).

Pure: no I/O, no gRPC. The limits a server uses come from `ServerConfig` (config.py); the defaults
here are those of `shardstream serve` and are documented in the proto's field comments.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardstream.errors import InvalidArgumentError
from shardstream.order.curriculum import MAX_MIXTURE_PHASES
from shardstream.order.schedule import MAX_BATCH_PHASES, MAX_SKIP_RANGES
from shardstream.v1 import shardstream_pb2 as pb

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MAX_SAMPLE_BYTES",
    "DEFAULT_MESSAGE_CAP_BYTES",
    "MAX_PARAMS_JSON_BYTES",
    "MAX_PARAMS_JSON_DEPTH",
    "RequestLimits",
    "check_params_json",
]

DEFAULT_MAX_BATCH_SIZE = 65_536  # rows per rank per step
DEFAULT_MESSAGE_CAP_BYTES = 64 << 20  # the hard cap on one Read message (a larger step is split)
DEFAULT_MAX_SAMPLE_BYTES = 64 << 20  # transform output per sample (fixed-size columns)

MAX_WORLD_SIZE = 1 << 20
MAX_STEP_STRIDE = 1 << 16
MAX_EPOCH = (1 << 32) - 1
MAX_COUNT = 1 << 62  # offsets and step counts
MAX_SHUFFLE_WINDOW = 1 << 20
MAX_MIXTURE_SOURCES = 256
MAX_MIXTURE_BLOCK = 1 << 20  # a block's schedule is ~40 bytes a sample, built per message
MAX_MIXTURE_EPOCH_SAMPLES = 1 << 48
MAX_COLUMNS = 1024
MAX_REF_CHARS = 512  # dataset references and fingerprints
MAX_STRING_CHARS = 1024  # any other string
MAX_TRANSFORMS = 16
MAX_PARAMS_JSON_BYTES = 64 << 10
MAX_PARAMS_JSON_DEPTH = 32


def _too_long(field: str, text: str, limit: int) -> None:
    if len(text) > limit:
        raise InvalidArgumentError(f"{field} is {len(text)} characters long, over the limit of {limit}")


def _at_most(field: str, value: int, limit: int, what: str = "") -> None:
    if value > limit:
        raise InvalidArgumentError(f"{field} must be at most {limit}{what}, got {value}")


@dataclass(frozen=True)
class RequestLimits:
    """The server-configurable limits (flags of `shardstream serve`); the rest are module constants."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_message_bytes: int = DEFAULT_MESSAGE_CAP_BYTES
    max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_message_bytes", "max_sample_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    def check(self, req: pb.ReadRequest) -> None:
        """Raise InvalidArgumentError naming the first field of `req` over its limit."""
        _too_long("dataset", req.dataset, MAX_REF_CHARS)
        _too_long("fingerprint", req.fingerprint, MAX_REF_CHARS)
        _at_most("epoch", req.epoch, MAX_EPOCH)
        _too_long("shuffle.mode", req.shuffle.mode, MAX_STRING_CHARS)
        _at_most("shuffle.window", req.shuffle.window, MAX_SHUFFLE_WINDOW, " blocks")
        _at_most("start_offset", req.start_offset, MAX_COUNT)
        if req.world_size < 1 or req.rank >= req.world_size:
            raise InvalidArgumentError(
                f"rank must be in [0, world_size), got rank={req.rank}, world_size={req.world_size}"
            )
        _at_most("world_size", req.world_size, MAX_WORLD_SIZE)
        if req.batch_schedule:
            if req.batch_size:
                raise InvalidArgumentError(f"batch_size must be 0 with batch_schedule, got {req.batch_size}")
        elif req.batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be >= 1, got {req.batch_size}")
        _at_most("batch_size", req.batch_size, self.max_batch_size, " (this server's --max-batch-size)")
        self._check_schedules(req)
        _at_most("first_step", req.first_step, MAX_COUNT)
        _at_most("num_steps", req.num_steps, MAX_COUNT)
        _at_most("step_stride", req.step_stride, MAX_STEP_STRIDE)
        _at_most("columns", len(req.columns), MAX_COLUMNS, " names")
        for i, name in enumerate(req.columns):
            _too_long(f"columns[{i}]", name, MAX_STRING_CHARS)
        self._check_mixture(req)
        _at_most("transforms", len(req.transforms), MAX_TRANSFORMS, " per request")
        for i, t in enumerate(req.transforms):
            _too_long(f"transforms[{i}].op", t.op, MAX_STRING_CHARS)
            check_params_json(f"transforms[{i}] ({t.op[:64]})", t.params_json)
        _too_long("on_error", req.on_error, MAX_STRING_CHARS)

    def _check_schedules(self, req: pb.ReadRequest) -> None:
        """Sizes and ranges of batch_schedule, skip and mixture_phases (their order and meaning are
        checked where they are parsed: shardstream/order/schedule.py, shardstream/order/curriculum.py)."""
        _at_most("batch_schedule", len(req.batch_schedule), MAX_BATCH_PHASES, " phases")
        for i, ph in enumerate(req.batch_schedule):
            _at_most(f"batch_schedule[{i}].start", ph.start, MAX_COUNT)
            if ph.batch_size < 1:
                raise InvalidArgumentError(
                    f"batch_schedule[{i}].batch_size must be >= 1, got {ph.batch_size}"
                )
            _at_most(
                f"batch_schedule[{i}].batch_size",
                ph.batch_size,
                self.max_batch_size,
                " (this server's --max-batch-size)",
            )
        _at_most("skip", len(req.skip), MAX_SKIP_RANGES, " ranges")
        for i, r in enumerate(req.skip):
            _at_most(f"skip[{i}].end", r.end, MAX_COUNT)
            if r.start >= r.end:
                raise InvalidArgumentError(f"skip[{i}] must have start < end, got [{r.start}, {r.end})")
        _at_most("mixture_phases", len(req.mixture_phases), MAX_MIXTURE_PHASES, " phases")
        if req.mixture_phases and not req.mixture:
            raise InvalidArgumentError("mixture_phases needs the mixture's sources in `mixture`")
        for i, ph in enumerate(req.mixture_phases):
            _at_most(f"mixture_phases[{i}].start", ph.start, MAX_COUNT)
            if len(ph.weights) != len(req.mixture):
                raise InvalidArgumentError(
                    f"mixture_phases[{i}] has {len(ph.weights)} weights for {len(req.mixture)} mixture sources"
                )

    @staticmethod
    def _check_mixture(req: pb.ReadRequest) -> None:
        _at_most("mixture", len(req.mixture), MAX_MIXTURE_SOURCES, " sources")
        for i, s in enumerate(req.mixture):
            _too_long(f"mixture[{i}].dataset", s.dataset, MAX_REF_CHARS)
            _too_long(f"mixture[{i}].fingerprint", s.fingerprint, MAX_REF_CHARS)
        _at_most("mixture_block", req.mixture_block, MAX_MIXTURE_BLOCK, " samples")
        _at_most("mixture_epoch_samples", req.mixture_epoch_samples, MAX_MIXTURE_EPOCH_SAMPLES)
        # Mixture positions are int64 counts from the start of the stream: epoch * L + position.
        if req.mixture and (req.epoch + 1) * req.mixture_epoch_samples > MAX_COUNT:
            raise InvalidArgumentError(
                f"(epoch + 1) * mixture_epoch_samples must be at most {MAX_COUNT}, got "
                f"({req.epoch} + 1) * {req.mixture_epoch_samples}"
            )


def check_params_json(what: str, text: str) -> None:
    """Refuse parameters over MAX_PARAMS_JSON_BYTES or nested deeper than MAX_PARAMS_JSON_DEPTH
    (brackets outside strings, counted in one pass before any parser recurses into them)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_PARAMS_JSON_BYTES:
        raise InvalidArgumentError(
            f"{what}: params_json is {size} bytes, over the limit of {MAX_PARAMS_JSON_BYTES}"
        )
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_PARAMS_JSON_DEPTH:
                    raise InvalidArgumentError(
                        f"{what}: params_json is nested deeper than the limit of {MAX_PARAMS_JSON_DEPTH} levels"
                    )
        elif ch in "]}":
            depth -= 1

"""The wire codec of a Read (DESIGN §5): a `ReadQuery` value, `encode(query) -> ReadRequest` and
`decode(ReadRequest) -> ReadQuery`.

The client builds a ReadQuery (client/spec.py, client/target.py) and encodes it; the server decodes the
ticket once and its planner (server/read/plan.py) plans from the query alone. `decode` refuses a
malformed or absurd request with one InvalidArgumentError naming the wire field and its limit (sizes,
ranges, strings; the server's own configurable limits are checked after it, server/read/request_limits.py);
order and meaning (schedules, mixture names, shuffle modes) are checked where they are parsed, by the
order wing's constructors. Round trip: decode(encode(q)) == q for a valid query, and encode(decode(r)) == r
for any request a client makes (tests/test_read_query.py).

Pure: no I/O, no gRPC; imports the core and the order wing only.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardstream.errors import InvalidArgumentError
from shardstream.limits import (
    MAX_EPOCH,
    MAX_MIXTURE_BLOCK,
    MAX_MIXTURE_EPOCH_SAMPLES,
    MAX_POSITION,
    MAX_SHUFFLE_WINDOW,
    MAX_WORLD_SIZE,
)
from shardstream.v1 import shardstream_pb2 as pb

from .curriculum import MAX_MIXTURE_PHASES
from .schedule import MAX_BATCH_PHASES, MAX_SKIP_RANGES

__all__ = [
    "MAX_PARAMS_JSON_BYTES",
    "MAX_PARAMS_JSON_DEPTH",
    "MAX_TRANSFORMS",
    "BatchPhase",
    "MixturePhase",
    "ReadQuery",
    "SkipRange",
    "Source",
    "Transform",
    "check_params_json",
    "decode",
    "encode",
]

# The ranges a Loader checks at construction (shardstream/limits.py) are the ones decoded here.
MAX_COUNT = MAX_POSITION  # offsets and step counts
MAX_STEP_STRIDE = 1 << 16
MAX_MIXTURE_SOURCES = 256
MAX_COLUMNS = 1024
MAX_REF_CHARS = 512  # dataset references and fingerprints
MAX_STRING_CHARS = 1024  # any other string
MAX_TRANSFORMS = 16
MAX_PARAMS_JSON_BYTES = 64 << 10
MAX_PARAMS_JSON_DEPTH = 32


@dataclass(frozen=True)
class Source:
    """A dataset to read (`name@version`), the fingerprint it is pinned to ("": unpinned) and its
    weight in a mixture (0 for a plain read, and for every source of a mixture with phases)."""

    dataset: str
    fingerprint: str = ""
    weight: float = 0.0


@dataclass(frozen=True)
class MixturePhase:
    start: int  # job position where these weights begin
    weights: tuple[float, ...]  # one per mixture source, in the sources' order


@dataclass(frozen=True)
class BatchPhase:
    start: int  # job position where this batch size begins
    batch_size: int


@dataclass(frozen=True)
class SkipRange:
    start: int  # job positions [start, end) are skipped
    end: int


@dataclass(frozen=True)
class Transform:
    """A named server-side transform and its JSON parameters (server/transforms/)."""

    op: str
    params_json: str = ""


@dataclass(frozen=True)
class ReadQuery:
    """One Read, as both sides mean it: what to read, the order, this rank's slice and the output.

    `sources` is one Source for a plain read (`mixture` False), or the mixture's sources in order."""

    sources: tuple[Source, ...]
    mixture: bool = False
    mixture_phases: tuple[MixturePhase, ...] = ()
    mixture_block: int = 0  # 0: the default block
    mixture_epoch_samples: int = 0  # 0: the sources' natural epoch
    # the order
    seed: int = 0
    epoch: int = 0
    shuffle_mode: str = ""  # "": none
    shuffle_window: int = 0  # 0: the mode's default
    # this rank's slice of the epoch
    start_offset: int = 0
    rank: int = 0
    world_size: int = 1
    batch_size: int = 0  # 0 with a batch_schedule
    batch_schedule: tuple[BatchPhase, ...] = ()
    skips: tuple[SkipRange, ...] = ()
    first_step: int = 0
    step_stride: int = 0  # 0 or 1: every step
    num_steps: int = 0  # 0: to the end of the epoch
    drop_last: bool = False
    # the output
    columns: tuple[str, ...] = ()  # empty: every column
    transforms: tuple[Transform, ...] = ()
    on_error: str = ""
    max_message_bytes: int = 0  # 0: the server's default
    split_steps: bool = False
    movable: bool = False  # the client follows a stream its worker hands to a less busy one
    handover: bool = False  # ... and opens the successor itself when a header says move
    provenance_in_header: bool = False  # `_shard`/`_row` as ReadHeader.provenance (stored order only)
    # balanced steps (balance.py): None or "tokens"; pad_rows pads a rank's rows to the step's largest
    balance: str | None = None  # None, "tokens", "attention" or "cost"
    pad_rows: bool = False
    balance_column: str = ""  # "cost": the cost column

    @property
    def dataset(self) -> str:
        """The plain read's dataset ("" for a mixture)."""
        return "" if self.mixture else self.sources[0].dataset

    @property
    def fingerprint(self) -> str:
        return "" if self.mixture else self.sources[0].fingerprint


def encode(query: ReadQuery) -> pb.ReadRequest:
    """The ReadRequest (a DoGet ticket once serialized) that asks for `query`."""
    req = pb.ReadRequest(
        seed=query.seed,
        epoch=query.epoch,
        shuffle=pb.Shuffle(mode=query.shuffle_mode, window=query.shuffle_window),
        start_offset=query.start_offset,
        rank=query.rank,
        world_size=query.world_size,
        batch_size=query.batch_size,
        first_step=query.first_step,
        num_steps=query.num_steps,
        step_stride=query.step_stride,
        drop_last=query.drop_last,
        columns=list(query.columns),
        max_message_bytes=query.max_message_bytes,
        transforms=[pb.Transform(op=t.op, params_json=t.params_json) for t in query.transforms],
        on_error=query.on_error,
        split_steps=query.split_steps,
        movable=query.movable,
        handover=query.handover,
        provenance_in_header=query.provenance_in_header,
    )
    if query.balance is not None or query.pad_rows:
        req.balance.CopyFrom(
            pb.Balance(mode=_BALANCE_MODES[query.balance], pad_rows=query.pad_rows, cost_column=query.balance_column)
        )
    if query.mixture:
        for s in query.sources:
            req.mixture.add(dataset=s.dataset, fingerprint=s.fingerprint, weight=s.weight)
        for ph in query.mixture_phases:
            req.mixture_phases.add(start=ph.start, weights=list(ph.weights))
        req.mixture_block = query.mixture_block
        req.mixture_epoch_samples = query.mixture_epoch_samples
    else:
        req.dataset = query.sources[0].dataset
        req.fingerprint = query.sources[0].fingerprint
    for bp in query.batch_schedule:
        req.batch_schedule.add(start=bp.start, batch_size=bp.batch_size)
    for r in query.skips:
        req.skip.add(start=r.start, end=r.end)
    return req


def decode(req: pb.ReadRequest) -> ReadQuery:
    """The query `req` asks for; InvalidArgumentError naming the first field over its limit.

    A request with `mixture` reads the mixture (its `dataset`/`fingerprint` are not read); one without
    reads `dataset` (its mixture_block/mixture_epoch_samples are checked, then not read)."""
    _check(req)
    mixture = len(req.mixture) > 0
    if mixture:
        sources = tuple(Source(s.dataset, s.fingerprint, s.weight) for s in req.mixture)
    else:
        sources = (Source(req.dataset, req.fingerprint),)
    return ReadQuery(
        sources=sources,
        mixture=mixture,
        mixture_phases=tuple(MixturePhase(p.start, tuple(p.weights)) for p in req.mixture_phases),
        mixture_block=req.mixture_block if mixture else 0,
        mixture_epoch_samples=req.mixture_epoch_samples if mixture else 0,
        seed=req.seed,
        epoch=req.epoch,
        shuffle_mode=req.shuffle.mode,
        shuffle_window=req.shuffle.window,
        start_offset=req.start_offset,
        rank=req.rank,
        world_size=req.world_size,
        batch_size=req.batch_size,
        batch_schedule=tuple(BatchPhase(p.start, p.batch_size) for p in req.batch_schedule),
        skips=tuple(SkipRange(r.start, r.end) for r in req.skip),
        first_step=req.first_step,
        step_stride=req.step_stride,
        num_steps=req.num_steps,
        drop_last=req.drop_last,
        columns=tuple(req.columns),
        transforms=tuple(Transform(t.op, t.params_json) for t in req.transforms),
        on_error=req.on_error,
        max_message_bytes=req.max_message_bytes,
        split_steps=req.split_steps,
        movable=req.movable,
        handover=req.handover,
        provenance_in_header=req.provenance_in_header,
        balance=_BALANCE_NAMES[req.balance.mode],
        pad_rows=req.balance.pad_rows,
        balance_column=req.balance.cost_column,
    )


_BALANCE_MODES = {
    None: pb.Balance.BALANCE_NONE,
    "tokens": pb.Balance.BALANCE_TOKENS,
    "attention": pb.Balance.BALANCE_ATTENTION,
    "cost": pb.Balance.BALANCE_COST,
}
_BALANCE_NAMES = {v: k for k, v in _BALANCE_MODES.items()}


def _too_long(field: str, text: str, limit: int) -> None:
    if len(text) > limit:
        raise InvalidArgumentError(f"{field} is {len(text)} characters long, over the limit of {limit}")


def _at_most(field: str, value: int, limit: int, what: str = "") -> None:
    if value > limit:
        raise InvalidArgumentError(f"{field} must be at most {limit}{what}, got {value}")


def _check(req: pb.ReadRequest) -> None:
    """Raise InvalidArgumentError naming the first field of `req` over its (fixed) limit."""
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
    _check_schedules(req)
    _at_most("first_step", req.first_step, MAX_COUNT)
    _at_most("num_steps", req.num_steps, MAX_COUNT)
    _at_most("step_stride", req.step_stride, MAX_STEP_STRIDE)
    _at_most("columns", len(req.columns), MAX_COLUMNS, " names")
    for i, name in enumerate(req.columns):
        _too_long(f"columns[{i}]", name, MAX_STRING_CHARS)
    _check_mixture(req)
    _at_most("transforms", len(req.transforms), MAX_TRANSFORMS, " per request")
    for i, t in enumerate(req.transforms):
        _too_long(f"transforms[{i}].op", t.op, MAX_STRING_CHARS)
        check_params_json(f"transforms[{i}] ({t.op[:64]})", t.params_json)
    _too_long("on_error", req.on_error, MAX_STRING_CHARS)


def _check_schedules(req: pb.ReadRequest) -> None:
    """Sizes and ranges of batch_schedule, skip and mixture_phases (their order and meaning are
    checked where they are parsed: shardstream/order/schedule.py, shardstream/order/curriculum.py)."""
    _at_most("batch_schedule", len(req.batch_schedule), MAX_BATCH_PHASES, " phases")
    for i, ph in enumerate(req.batch_schedule):
        _at_most(f"batch_schedule[{i}].start", ph.start, MAX_COUNT)
        if ph.batch_size < 1:
            raise InvalidArgumentError(f"batch_schedule[{i}].batch_size must be >= 1, got {ph.batch_size}")
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
    if req.balance.mode not in _BALANCE_NAMES:
        raise InvalidArgumentError(f"balance.mode {req.balance.mode} is not one this server knows (0 to 3)")
    packed = (pb.Balance.BALANCE_TOKENS, pb.Balance.BALANCE_ATTENTION)
    if req.balance.pad_rows and req.balance.mode not in packed:
        raise InvalidArgumentError("balance.pad_rows pads balanced packed rows: it needs balance.mode tokens or attention")
    _too_long("balance.cost_column", req.balance.cost_column, MAX_STRING_CHARS)
    if (req.balance.mode == pb.Balance.BALANCE_COST) != bool(req.balance.cost_column):
        raise InvalidArgumentError("balance.cost_column names the cost column of balance.mode cost (and only of it)")


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

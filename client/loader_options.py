"""`LoaderOptions`: every option of a `Loader`, written once — its default, its check, its normal form —
and the `ReadSpec` it makes for the prefetch thread (spec.py).

    Loader(["10.0.0.5:7070"], "web@3", batch_size=32, seed=0, shuffle="block")
    # is Loader(endpoints, dataset, **options): the keywords are LoaderOptions' fields

Built once per Loader, before any network call; frozen, so the prefetch thread, the state and the job
cursors all read the same values. A bad value is one InvalidArgumentError line naming the option (the
integer ranges are those a Read request carries: shardstream/limits.py), an unknown keyword one
TypeError line naming the closest option. `tls` files are read here, so a wrong path fails now.

Once built, every field holds its normal form: rank and world_size resolved (the launcher's where
unset, client/launcher.py), `shuffle` a ShuffleSpec holding the window (shuffle_window then None),
`columns` a tuple (None: every column), `transforms` their wire form, `batch_size` an int or its
phases ((position, B), ...), `skip_steps` sorted ranges, `pin_memory` true only where it takes effect
(output="torch" with CUDA). Normalizing again changes nothing, so `dataclasses.replace(options,
seed=1)` is checked the same way.
"""

from __future__ import annotations

import difflib
import inspect
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from shardstream.errors import InvalidArgumentError
from shardstream.limits import (
    MAX_EPOCH,
    MAX_MESSAGE_BYTES,
    MAX_MIXTURE_BLOCK,
    MAX_MIXTURE_EPOCH_SAMPLES,
    MAX_SEED,
    MAX_SHUFFLE_WINDOW,
    MAX_WORLD_SIZE,
    check_int,
    shown,
)
from shardstream.order.balance import BalanceSpec, parse_balance
from shardstream.order.cursor_math import WorkerSplit
from shardstream.order.read_order import ShuffleSpec
from shardstream.order.schedule import Schedule, parse_batch_schedule, parse_ranges
from shardstream.transform_spec import to_wire
from shardstream.v1 import shardstream_pb2 as pb

from .credentials import ChannelSecurity, TlsOption
from .cursors.job import check_job_options
from .cursors.stores import CursorStore
from .launcher import resolve_rank_world
from .spec import DEFAULT_MAX_RETRIES, DEFAULT_STREAM_IDLE_TIMEOUT_S, ReadSpec, RetryPolicy
from .target import Target

__all__ = [
    "DEFAULT_PREFETCH_BATCHES",
    "DEFAULT_REPORT_INTERVAL_S",
    "DEFAULT_TIMEOUT_S",
    "OUTPUTS",
    "LoaderOptions",
    "OptionAttribute",
    "option_names",
    "with_option_attributes",
]

DEFAULT_PREFETCH_BATCHES = 8
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_REPORT_INTERVAL_S = 15.0  # one ~100-byte DoAction per rank per 15 s (a scrape interval)
OUTPUTS = ("numpy", "torch", "arrow")
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """A Loader's options (see the module docstring); `Loader.options` holds its own."""

    # --- what each step holds ----------------------------------------------------------------------
    # Samples per rank per step, or batch-size phases [(job position, B), ...] (schedule_state.py)
    batch_size: int | Sequence[tuple[int, int]]
    rank: int | None = None  # None: the launcher's (torch.distributed, torchrun, SLURM), else 0
    world_size: int | None = None  # None: the launcher's, else 1
    seed: int = 0
    shuffle: bool | str | Mapping[str, Any] | ShuffleSpec = True  # True: the default mode; a mode; a dict
    shuffle_window: int | None = None  # blocks of the "block" shuffle's window
    columns: Sequence[str] | None = None  # None: every column
    epochs: int | None = 1  # None: endless
    drop_last: bool = False  # drop each epoch's short last step (the count is in Loader.dropped)
    skip_steps: Sequence[tuple[int, int]] | None = None  # global steps [a, b) never delivered
    # Server-side transforms (decode, tokenize, pack, windows): names and parameters only
    transforms: Sequence[Mapping[str, Any] | pb.Transform] | None = None
    on_error: str = "fail"  # what a transform does with a sample it cannot take (transform_spec.py)
    mixture_block: int = 0  # samples per block of a mixture (0: 1000, shardstream/order/mixture.py)
    mixture_epoch_samples: int = 0  # samples per mixture epoch (0: the sources' rows together)
    # Balanced steps (shardstream/order/balance.py): None, "tokens" or "attention" (packed text: the
    # step's rows dealt so that every rank gets the same number, within one; "attention" balancing
    # Σ chunk length² too), or {"cost": COLUMN} (samples partitioned by a cost column); pad_rows
    # pads packed rows to the step's largest
    balance: str | Mapping[str, str] | None = None
    pad_rows: bool = False
    # --- what the training loop gets ---------------------------------------------------------------
    output: str = "numpy"  # one of OUTPUTS
    provenance: bool = False  # keep the _shard/_row/_source columns in the batches
    # Page-locked host tensors (copied to the GPU with non_blocking=True, ~2x faster), made in the
    # prefetch thread, off the training loop. Without CUDA there is nothing to pin for.
    pin_memory: bool = False
    prefetch: int = DEFAULT_PREFETCH_BATCHES  # batches decoded ahead of the training loop
    # --- how it reads ------------------------------------------------------------------------------
    # Streams per rank, striped by step over the endpoints (client/striped.py): several server
    # processes build one rank's messages when one stream is bound by a server's CPU.
    streams: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S  # finding a server; a broken stream's retry budget; close()
    max_retries: int = DEFAULT_MAX_RETRIES  # failures in a row before giving up (spec.RetryPolicy)
    max_message_bytes: int = 0  # a message's target size (0: the server's default; its cap clamps it)
    stream_idle_timeout_s: float = DEFAULT_STREAM_IDLE_TIMEOUT_S  # a silent stream is left after this
    # Seconds between stall reports to the server the rank reads from (its wait for data and samples
    # taken: the fleet's scaling signal, client/transport/stall_report.py); 0: none
    report_interval_s: float = DEFAULT_REPORT_INTERVAL_S
    tls: TlsOption = None  # credentials.py
    token: str | None = field(default=None, repr=False)  # None: $SHARDSTREAM_TOKEN; "": none
    # --- job cursors (client/cursors/job.py) -------------------------------------------------------
    job: str | None = None  # the job's name: its ranks' cursors, commit(), resume
    cursor_store: str | CursorStore | None = None  # None: the embedded SQLite store
    resume: str | int | None = None  # "latest" or a committed step
    resume_min_step: int | None = None  # with "latest": the checkpoint's step, which the store must have
    # --- made from the above -----------------------------------------------------------------------
    security: ChannelSecurity = field(init=False, repr=False, compare=False)  # tls and token

    @classmethod
    def of(cls, options: Mapping[str, Any], caller: str = "Loader()") -> LoaderOptions:
        """The options given as keywords; an unknown or missing one is a TypeError line naming it."""
        names = option_names()
        for name in options:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"the options are {', '.join(names)}"
                raise TypeError(f"{caller} got an unknown option {name!r}: {hint}")
        missing = [f.name for f in fields(cls) if f.init and f.default is MISSING and f.name not in options]
        if missing:
            raise TypeError(f"{caller} needs the option {missing[0]!r}")
        return cls(**options)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the normal forms are set here, once
        rank, world_size = self.rank, self.world_size
        if rank is None or world_size is None or world_size == 1:
            for name, value in (("rank", rank), ("world_size", world_size)):
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                    raise InvalidArgumentError(f"{name} must be an integer or None, got {value!r}")
            rank, world_size = resolve_rank_world(rank, world_size)  # the launcher's, else 0 of 1
        # The ranges a Read request can carry (limits.py): a value past them is refused here, naming
        # the argument, rather than by protobuf ("Value out of range") at the first batch.
        for name, value, low, high in (
            ("world_size", world_size, 1, MAX_WORLD_SIZE),
            ("seed", self.seed, 0, MAX_SEED),
            ("prefetch", self.prefetch, 1, sys.maxsize),
            ("streams", self.streams, 1, sys.maxsize),
            ("max_retries", self.max_retries, 0, sys.maxsize),
            ("max_message_bytes", self.max_message_bytes, 0, MAX_MESSAGE_BYTES),
            ("mixture_block", self.mixture_block, 0, MAX_MIXTURE_BLOCK),
            ("mixture_epoch_samples", self.mixture_epoch_samples, 0, MAX_MIXTURE_EPOCH_SAMPLES),
        ):
            check_int(name, value, low, high)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise InvalidArgumentError(f"rank must be in [0, world_size={world_size}), got {shown(rank)}")
        set_(self, "rank", rank)
        set_(self, "world_size", world_size)
        if self.epochs is not None:
            check_int("epochs (None: endless)", self.epochs, 1, MAX_EPOCH + 1)
        if self.shuffle_window is not None:
            check_int("shuffle_window", self.shuffle_window, 1, MAX_SHUFFLE_WINDOW, "blocks")
        output = self.output
        if output not in OUTPUTS:
            raise InvalidArgumentError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if self.pin_memory and output != "torch":
            raise InvalidArgumentError("pin_memory needs output='torch'")
        if output == "torch":
            try:
                import torch  # noqa: F401
            except ImportError as exc:
                raise InvalidArgumentError(
                    "output='torch' needs torch installed (pip install torch)"
                ) from exc
        columns = self.columns
        if columns is not None:
            if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
                raise InvalidArgumentError(f"columns must be a list of column names, got {columns!r}")
            if len(set(columns)) != len(columns):
                raise InvalidArgumentError(f"columns listed twice: {list(columns)}")
            set_(self, "columns", tuple(columns))
        if not self.timeout_s > 0:
            raise InvalidArgumentError(f"timeout_s must be > 0, got {self.timeout_s!r}")
        if not self.stream_idle_timeout_s > 0:
            raise InvalidArgumentError(
                f"stream_idle_timeout_s must be > 0, got {self.stream_idle_timeout_s!r}"
            )
        interval = self.report_interval_s
        if isinstance(interval, bool) or not isinstance(interval, int | float) or not 0 <= interval < float("inf"):
            raise InvalidArgumentError(f"report_interval_s must be a number of seconds >= 0 (0: no reports), got {interval!r}")
        check_job_options(self.job, self.cursor_store, self.resume, self.resume_min_step)
        set_(self, "security", ChannelSecurity.from_options(self.tls, self.token))
        phases = parse_batch_schedule(self.batch_size)
        set_(self, "batch_size", phases[0][1] if len(phases) == 1 else phases)
        set_(self, "skip_steps", parse_ranges(self.skip_steps, "skip_steps"))
        set_(self, "shuffle", ShuffleSpec.parse(self.shuffle, self.shuffle_window))
        set_(self, "shuffle_window", None)  # in `shuffle` now (a dict's own window wins over it)
        transforms = self.transforms
        if isinstance(transforms, tuple | list) and all(isinstance(t, pb.Transform) for t in transforms):
            transforms = [_as_given(t) for t in transforms]  # a normal form given again
        set_(self, "transforms", tuple(to_wire(transforms, self.on_error)))
        balance = parse_balance(self.balance, pad_rows=bool(self.pad_rows))
        if balance.packed and not any(t.op == "text.pack" for t in self.transforms):  # type: ignore[union-attr]
            raise InvalidArgumentError(
                f'balance="{balance.mode}" balances packed rows: add a text.pack transform (with "lengths")'
            )
        set_(self, "balance", balance)
        set_(self, "pad_rows", balance.pad_rows)
        set_(self, "pin_memory", bool(self.pin_memory) and output == "torch" and _cuda_available())

    @property
    def first_batch(self) -> int:
        """The batch size of the first phase (the only one without a batch-size schedule)."""
        return self.batch_size if isinstance(self.batch_size, int) else self.batch_size[0][1]

    @property
    def transforms_as_given(self) -> tuple[dict[str, Any], ...]:
        """The transforms as {"op": ..., parameters...} (as a Loader's state records them)."""
        return tuple(_as_given(t) for t in self.transforms)  # type: ignore[arg-type]

    @property
    def balance_record(self) -> dict[str, Any] | None:
        """balance= as a Loader's state records it (for `explain`), None without it."""
        spec = self.balance
        if not isinstance(spec, BalanceSpec) or spec.mode is None:
            return None
        return {"mode": spec.mode, "column": spec.column, "pad_rows": spec.pad_rows}

    @property
    def retry(self) -> RetryPolicy:
        """How a broken stream is resumed: for at least timeout_s and max_retries failures in a row."""
        return RetryPolicy(
            max_retries=self.max_retries, budget_s=self.timeout_s, idle_timeout_s=self.stream_idle_timeout_s
        )

    def read_spec(
        self,
        *,
        target: Target,
        endpoints: Sequence[str],
        schedule: Schedule | None,
        split: WorkerSplit,
        origin: tuple[int, int],
    ) -> ReadSpec:
        """What one iteration reads: these options and what only the Loader knows — the pinned target,
        its endpoints, the schedule as placed from its cursor, its workers' split, and its cursor."""
        return ReadSpec(
            **{name: getattr(self, name) for name in _AS_THEY_ARE},
            batch_size=self.first_batch,
            columns=self.columns or (),
            job=self.job or "",
            retry=self.retry,
            target=target,
            endpoints=tuple(endpoints),
            schedule=schedule,
            split=split,
            origin=origin,
        )


def option_names() -> list[str]:
    """The keyword options a Loader takes, in order."""
    return [f.name for f in fields(LoaderOptions) if f.init]


class OptionAttribute:
    """An attribute that reads one option of its object's `options`: `loader.seed` is
    `loader.options.seed`, read-only (`convert` makes the value shown, e.g. a list of a tuple)."""

    def __init__(self, convert: Callable[[Any], Any] | None = None) -> None:
        self.name, self.convert = "", convert

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = getattr(obj.options, self.name)
        return value if self.convert is None else self.convert(value)

    def __set__(self, obj: Any, value: object) -> None:
        raise AttributeError(f"{self.name} is an option, fixed when the {type(obj).__name__} is made")


def with_option_attributes(cls: type[T]) -> type[T]:
    """Class decorator for a class that keeps its LoaderOptions as `self.options` and whose __init__
    takes them as `**options`: every option the class does not define itself becomes an
    OptionAttribute (but the token: a secret is no attribute), and `help()` and `inspect.signature`
    show each option as a keyword with its default in place of `**options`."""
    for name in option_names():
        if name not in vars(cls) and name != "token":
            attribute = OptionAttribute()
            attribute.__set_name__(cls, name)
            setattr(cls, name, attribute)
    init = cls.__init__  # type: ignore[misc]
    leading = [p for p in inspect.signature(init).parameters.values() if p.kind != p.VAR_KEYWORD]
    keywords = [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if f.default is MISSING else f.default,
            annotation=f.type,
        )
        for f in fields(LoaderOptions)
        if f.init
    ]
    init.__signature__ = inspect.Signature([*leading, *keywords])
    return cls


# The ReadSpec fields that are options of the same name, taken as they are; read_spec gives the rest.
_AS_THEY_ARE = sorted(
    {f.name for f in fields(ReadSpec)} & set(option_names()) - {"batch_size", "columns", "job"}
)


def _as_given(t: pb.Transform) -> dict[str, Any]:
    return {"op": t.op, **json.loads(t.params_json or "{}")}


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())

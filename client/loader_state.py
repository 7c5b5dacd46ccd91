"""The Loader's resumable state: a small, versioned dict (JSON-safe, sorted keys).

The cursor of a job is one number per epoch — the global sample offset — so a state saved by any
rank after global step t resumes every rank of a new job, with any world size and batch size, at
the same place. World size and batch size are recorded for information, not required to match;
a Loader's schedules — batch-size phases, mixture phases, skip ranges — are checked, under the
"schedule" key only such a Loader writes (schedule_state.py).

So are the rest of what decides a step's samples besides the order — drop_last, the transforms and
on_error, a mixture's block and epoch samples, the columns — and the epochs the job runs, so that
`shardstream explain` and the web's job pages can replay any step of a job from its cursors (and say
when a step is past the job's end). States of older clients lack them and read as the defaults (format 1 still:
older clients ignore them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from shardstream.errors import FailedPreconditionError, InvalidArgumentError
from shardstream.order.balance import BALANCE_MODES

__all__ = ["STATE_FORMAT", "LoaderState"]

STATE_FORMAT = 1
_KIND = "shardstream.Loader"


@dataclass(frozen=True)
class LoaderState:
    dataset: str  # name@version the state was made on
    fingerprint: str
    seed: int
    shuffle: str
    epoch: int  # the epoch the next batch comes from
    offset: int  # global sample offset in that epoch where the next global step starts
    world_size: int
    batch_size: int
    steps: int = 0  # global steps consumed by the job so far (informational)
    # Batch-size phases, mixture phases, skip ranges (schedule_state.py); None: the key is left out
    schedule: Mapping[str, Any] | None = None
    # What else the job's steps depend on (informational, for `shardstream explain`)
    drop_last: bool = False
    transforms: tuple[dict[str, Any], ...] = ()  # [{"op": ..., params...}]
    on_error: str = "fail"
    mixture_block: int = 0  # 0: the default block
    mixture_epoch_samples: int = 0  # 0: the sources' total rows
    # What the job reads and for how long (informational: the web's job links, `explain`'s end of job)
    columns: tuple[str, ...] | None = None  # None: every column
    epochs: int | None = 0  # the epochs the job runs (None: endless; 0: not recorded)
    # balance= (shardstream/order/balance.py) as {"mode", "column", "pad_rows"}: which rank got which of
    # a step's samples, for `explain`; None: the key is left out (no balance, or an older client)
    balance: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["transforms"] = [dict(t) for t in self.transforms]
        d["columns"] = None if self.columns is None else list(self.columns)
        if d["schedule"] is None:  # only a Loader with a schedule writes the key
            del d["schedule"]
        if d["balance"] is None:  # ... and one with balance=
            del d["balance"]
        return {"kind": _KIND, "format": STATE_FORMAT, **d}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LoaderState:
        if not isinstance(d, Mapping):
            raise InvalidArgumentError(f"a Loader state must be a dict, got {type(d).__name__}")
        if d.get("kind") != _KIND:
            raise InvalidArgumentError(f"not a shardstream Loader state (kind={d.get('kind')!r})")
        if d.get("format") != STATE_FORMAT:
            raise InvalidArgumentError(
                f"unsupported Loader state format {d.get('format')!r} (this client reads {STATE_FORMAT})"
            )
        try:
            state = cls(
                dataset=_typed(d, "dataset", str),
                fingerprint=_typed(d, "fingerprint", str),
                seed=_typed(d, "seed", int),
                shuffle=_typed(d, "shuffle", str),
                epoch=_typed(d, "epoch", int),
                offset=_typed(d, "offset", int),
                world_size=_typed(d, "world_size", int),
                batch_size=_typed(d, "batch_size", int),
                steps=int(d.get("steps", 0)),
                schedule=_schedule(d.get("schedule")),
                drop_last=bool(d.get("drop_last", False)),
                transforms=tuple(dict(t) for t in d.get("transforms") or () if isinstance(t, Mapping)),
                on_error=str(d.get("on_error", "fail")),
                mixture_block=int(d.get("mixture_block", 0)),
                mixture_epoch_samples=int(d.get("mixture_epoch_samples", 0)),
                columns=_columns(d.get("columns")),
                epochs=_epochs(d.get("epochs", 0)),
                balance=_balance(d.get("balance")),
            )
        except KeyError as exc:
            raise InvalidArgumentError(f"Loader state is missing {exc.args[0]!r}") from None
        if state.epoch < 0 or state.offset < 0:
            raise InvalidArgumentError(
                f"Loader state has a negative cursor (epoch={state.epoch}, offset={state.offset})"
            )
        return state

    def check_compatible(
        self, *, dataset: str, fingerprint: str, seed: int, shuffle: str, num_rows: int
    ) -> None:
        """Refuse to resume where the order would differ: nothing may be lost or repeated."""
        if fingerprint != self.fingerprint:
            raise FailedPreconditionError(
                f"the state was saved on {self.dataset} (fingerprint {self.fingerprint[:12]}…) but this loader "
                f"reads {dataset} (fingerprint {fingerprint[:12]}…); move the job to the new version explicitly"
            )
        if (seed, shuffle) != (self.seed, self.shuffle):
            raise InvalidArgumentError(
                f"the state was saved with seed={self.seed}, shuffle={self.shuffle!r}; this loader has "
                f"seed={seed}, shuffle={shuffle!r}: resuming would change the order"
            )
        if self.offset > num_rows:
            raise InvalidArgumentError(
                f"the state's offset {self.offset} is past the epoch of {num_rows} samples"
            )


def _columns(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(isinstance(c, str) for c in value):
        raise InvalidArgumentError(f"Loader state field 'columns' must be a list of names, got {value!r}")
    return tuple(value)


def _epochs(value: object) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise InvalidArgumentError(f"Loader state field 'epochs' must be an integer >= 0 or None, got {value!r}")
    return value


def _balance(value: object) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("mode") not in BALANCE_MODES:
        raise InvalidArgumentError(f"Loader state has a bad balance {value!r}")
    return dict(value)


def _schedule(value: object) -> Mapping[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        raise InvalidArgumentError(f"Loader state field 'schedule' must be a dict, got {value!r}")
    return value


def _typed(d: Mapping[str, Any], key: str, typ: type) -> Any:
    value = d[key]
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidArgumentError(f"Loader state field {key!r} must be an integer, got {value!r}")
    if typ is str and not isinstance(value, str):
        raise InvalidArgumentError(f"Loader state field {key!r} must be a string, got {value!r}")
    return value

"""`StepQuery`: everything that decides what one rank receives at one step, as a small value.

Both visualizers hold their state in one `StepQuery`: the web app writes it into every URL (a link
is a shareable "rank 3, step 12,345 of web@3 with seed 7 and these transforms"), the terminal app
changes it with keys. It is the Loader's configuration plus (rank, step, epoch), nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from shardstream.errors import InvalidArgumentError
from shardstream.order.balance import parse_balance
from shardstream.order.read_order import ShuffleSpec
from shardstream.transform_spec import to_wire

__all__ = ["StepQuery", "parse_transforms", "step_of"]

# Keys in URLs (short, stable: links are shared) -> field names.
_URL_KEYS = {
    "d": "dataset",
    "seed": "seed",
    "shuffle": "shuffle",
    "window": "window",
    "ws": "world_size",
    "bs": "batch_size",
    "rank": "rank",
    "step": "step",
    "epoch": "epoch",
    "cols": "columns",
    "tf": "transforms",
    "on_error": "on_error",
    "drop_last": "drop_last",
    "cur": "cursor",
    "bal": "balance",
}
_INTS = ("seed", "window", "world_size", "batch_size", "rank", "step", "epoch")


def step_of(step: int, steps_in_epoch: int, job: bool = False) -> str:
    """How both visualizers say where a step is: 'step 3 of 7 (0..6)' in its epoch (steps count from
    0), or for a job's step 'job step 286 (the epoch's last: job step 299)'."""
    if job:
        return f"job step {step} (the epoch's last: job step {steps_in_epoch - 1})"
    return f"step {step} of {steps_in_epoch} (0..{steps_in_epoch - 1})"


def parse_transforms(text: str) -> tuple[dict[str, Any], ...]:
    """A JSON list of transforms (the Loader's `transforms=`), validated the way the Loader does."""
    if not text.strip():
        return ()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"transforms must be a JSON list of {{'op': ..., ...}}: {exc}") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise InvalidArgumentError(f"transforms must be a JSON list of objects, got {text!r}")
    to_wire(value, "fail")  # the client's own check: op names and JSON parameters
    return tuple(value)


@dataclass(frozen=True)
class StepQuery:
    """One rank's batch at one step: the Loader's options plus (epoch, step, rank)."""

    dataset: str  # name@version (pinned) or a mixture 'a@1:0.7,b@2:0.3'
    seed: int = 0
    shuffle: str = "block"  # none | block | full
    window: int = 0  # blocks per window for "block"; 0 = the default
    world_size: int = 1
    batch_size: int = 8
    rank: int = 0
    step: int = 0
    epoch: int = 0
    columns: str = ""  # comma-separated; empty = every column
    transforms: str = ""  # JSON list, as the Loader's transforms=
    on_error: str = "fail"
    drop_last: bool = False
    # 'S:E:O': a job's cursor (its step S starts at offset O of epoch E). Set, `step` is the job's step
    # (the steps the job took before it) placed from that cursor with this world and batch size, as
    # `explain --job` places it; empty, `step` counts from the start of `epoch`.
    cursor: str = ""
    # balance=: "" (none), "tokens", "attention" or "cost:COLUMN" (shardstream/order/balance.py)
    balance: str = ""

    def __post_init__(self) -> None:
        for name in _INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"{name} must be an integer >= 0, got {value!r}")
        if self.world_size < 1 or self.batch_size < 1:
            raise InvalidArgumentError("world_size and batch_size must be >= 1")
        if not self.rank < self.world_size:
            raise InvalidArgumentError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.on_error not in ("fail", "skip"):
            raise InvalidArgumentError(f"on_error must be 'fail' or 'skip', got {self.on_error!r}")
        self.shuffle_spec  # noqa: B018 - validates the mode and window
        self.job_cursor  # noqa: B018 - validates the cursor
        parse_transforms(self.transforms)
        parse_balance(self.balance_option)

    # --- what the Loader is given -----------------------------------------------------------------
    @property
    def shuffle_spec(self) -> ShuffleSpec:
        return ShuffleSpec.parse(self.shuffle, self.window or None)

    @property
    def column_list(self) -> tuple[str, ...]:
        return tuple(c.strip() for c in self.columns.split(",") if c.strip())

    @property
    def transform_list(self) -> tuple[dict[str, Any], ...]:
        return parse_transforms(self.transforms)

    @property
    def job_cursor(self) -> tuple[int, int, int] | None:
        """(job step, epoch, offset) of `cursor`, or None."""
        if not self.cursor:
            return None
        parts = self.cursor.split(":")
        if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts):
            raise InvalidArgumentError(f"cursor must be STEP:EPOCH:OFFSET (integers >= 0), got {self.cursor!r}")
        step, epoch, offset = map(int, parts)
        return step, epoch, offset

    @property
    def balance_option(self) -> str | dict[str, str] | None:
        """`balance` as the Loader's balance= takes it."""
        if not self.balance:
            return None
        if self.balance.startswith("cost:"):
            return {"cost": self.balance.removeprefix("cost:")}
        return self.balance

    @staticmethod
    def balance_of(record: Mapping[str, Any] | None) -> str:
        """A Loader state's recorded balance= (LoaderState.balance) as the query's `balance`."""
        if not record:
            return ""
        return f"cost:{record.get('column')}" if record.get("mode") == "cost" else str(record.get("mode"))

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size

    @property
    def offset(self) -> int:
        """The global sample offset where this step starts (the Loader's cursor before it), without a
        job cursor (with one, DataSource.place says where the step is)."""
        return self.step * self.global_batch

    def loader_kwargs(self) -> dict[str, Any]:
        """The `Loader(...)` keyword arguments of the job this query looks at."""
        spec = self.shuffle_spec
        return {
            "batch_size": self.batch_size,
            "rank": self.rank,
            "world_size": self.world_size,
            "seed": self.seed,
            "shuffle": spec.mode,
            "shuffle_window": spec.window if spec.mode == "block" else None,
            "columns": list(self.column_list) or None,
            "transforms": [dict(t) for t in self.transform_list] or None,
            "on_error": self.on_error,
            "drop_last": self.drop_last,
            **({"balance": self.balance_option} if self.balance else {}),
        }

    # --- moving around ------------------------------------------------------------------------------
    def moved(self, **changes: Any) -> StepQuery:
        return replace(self, **changes)

    # --- URLs -----------------------------------------------------------------------------------------
    def to_params(self) -> dict[str, str]:
        """URL query parameters; fields at their defaults are left out (short links)."""
        out = {}
        defaults = StepQuery(dataset=self.dataset)
        for key, name in _URL_KEYS.items():
            value = getattr(self, name)
            if name == "dataset" or value != getattr(defaults, name):
                out[key] = str(int(value)) if isinstance(value, bool) else str(value)
        return out

    @classmethod
    def from_params(cls, params: Mapping[str, str], **defaults: Any) -> StepQuery:
        """A query from URL parameters (unknown keys ignored); raises InvalidArgumentError on bad values."""
        values: dict[str, Any] = dict(defaults)
        known = {f.name for f in fields(cls)}
        for key, name in _URL_KEYS.items():
            if key not in params or name not in known:
                continue
            text = params[key]
            if name in _INTS:
                try:
                    values[name] = int(text)
                except ValueError:
                    raise InvalidArgumentError(f"{key} must be an integer, got {text!r}") from None
            elif name == "drop_last":
                values[name] = text in ("1", "true", "yes")
            else:
                values[name] = text
        if "dataset" not in values:
            raise InvalidArgumentError("no dataset given (d=NAME@VERSION)")
        return cls(**values)

    def describe(self) -> str:
        tf = ", ".join(t.get("op", "?") for t in self.transform_list)
        step = f"job step {self.step}" if self.cursor else f"step {self.step}"
        return (
            f"{self.dataset} epoch {self.epoch} {step} rank {self.rank}/{self.world_size} "
            f"batch {self.batch_size} seed {self.seed} shuffle {self.shuffle_spec}"
            f"{' drop_last' if self.drop_last else ''}{f' transforms {tf}' if tf else ''}"
            f"{f' balance={self.balance}' if self.balance else ''}"
        )

"""`TrainingStream`: a Loader read ahead by a framework, its cursor where the training step is.

    stream = TrainingStream(endpoints, "web@3", batch_size=8, epochs=None)   # Loader's arguments
    loader = DataLoader(stream, batch_size=None, num_workers=0)              # what a framework iterates
    for batch in loader:
        train_step(batch)
        stream.handed_over()                # this batch reached the training step: the cursor moves past it
    save({"data": stream.state_dict(), ...})

Frameworks read batches ahead of the training step: Lightning's fetcher holds the next batch to know
whether the current one is the last, accelerate's DataLoaderShard does the same, a DataLoader with
workers holds several. A Loader's own cursor is where the *reading* is, so a checkpoint taken after
step k would save a cursor a batch or more past k, and the resumed run would never train on those
batches. A TrainingStream keeps two Loaders of one stream:

- the reading Loader, iterated by the framework's DataLoader in the training process (num_workers=0:
  the Loader prefetches in its own thread and the servers decode), which notes where each batch's
  step starts;
- the cursor Loader, never iterated: `handed_over()` — which an integration calls as each batch
  reaches the training step — moves it past the oldest step read and not yet handed over, exactly as
  iterating it would have (`Loader.delivered_elsewhere`, ~36 µs a batch measured here; a step out of
  order is DataLossError, never a silent skip).

`state_dict()` is the cursor Loader's: a checkpoint written after step k resumes at step k+1 whatever
the framework had read ahead, with any world size and batch size (as any Loader state). Each new
iteration — a framework's next epoch, a resumed run — starts reading at the cursor, so a second pass
over the stream continues it instead of starting it again; when the Loader's `epochs` are over, a
pass yields nothing. The stream has no `len()`: frameworks stop at their max_steps, or when it ends.

Job cursors (`job=`, `resume=`) are the other way to resume and are refused here: the framework's
checkpoint holds the state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from shardstream.errors import InvalidArgumentError

from ..loader import Loader

__all__ = ["TrainingStream"]

_STATE_KIND = "shardstream.TrainingStream"
_JOB_KEYS = ("job", "cursor_store", "resume", "resume_min_step")


class TrainingStream(IterableDataset):  # type: ignore[type-arg]
    """One rank's batches for a framework's DataLoader (`batch_size=None`, `num_workers=0`), with a
    cursor that `handed_over()` moves (module docstring). Arguments: the Loader's; `output` defaults
    to "torch". They are checked here, before any network call."""

    def __init__(self, endpoints: str | Sequence[str], dataset: Any, **loader_kwargs: Any) -> None:
        super().__init__()
        refused = [k for k in _JOB_KEYS if loader_kwargs.get(k) is not None]
        if refused:
            raise InvalidArgumentError(
                f"{', '.join(refused)}: a TrainingStream's state rides in the framework's checkpoints; "
                "job cursors are for loops that commit their own (Loader(..., job=...))"
            )
        loader_kwargs.setdefault("output", "torch")
        self._args = (endpoints, dataset)
        self._kwargs = loader_kwargs
        Loader(endpoints, dataset, **loader_kwargs).close()  # every argument checked now, no network
        self._cursor: Loader | None = None
        self._pending: Mapping[str, Any] | None = None  # a loaded state, applied when the cursor opens
        self._read: deque[tuple[int, int]] = deque()  # (epoch, start) of steps read, not handed over

    @property
    def cursor(self) -> Loader:
        """The Loader whose position is the training step's (opened on first use: after the launcher
        has set up torch.distributed, so the rank is the process group's)."""
        if self._cursor is None:
            self._cursor = Loader(*self._args, **self._kwargs)
            pending, self._pending = self._pending, None
            if pending is not None:
                self._cursor.load_state_dict(pending)
        return self._cursor

    def __iter__(self) -> Iterator[Any]:
        if get_worker_info() is not None:
            raise InvalidArgumentError(
                "a TrainingStream is read in the training process (DataLoader num_workers=0): its cursor "
                "moves there; the Loader already prefetches in a thread and the servers decode"
            )
        start = self.cursor.state_dict()
        read = self._read = deque()  # a new pass: steps an abandoned pass had read are not handed over
        return self._read_from(start, read)

    def _read_from(self, start: Mapping[str, Any], read: deque[tuple[int, int]]) -> Iterator[Any]:
        with Loader(*self._args, **self._kwargs) as loader:
            loader.load_state_dict(start)
            for batch in loader:
                info = loader.last_batch
                assert info is not None
                read.append((info.epoch, info.global_start))
                yield batch

    def handed_over(self) -> None:
        """The oldest batch read and not yet handed over has reached the training step: move the
        cursor past its step."""
        if not self._read:
            raise RuntimeError("handed_over() with no batch read: call it once per batch the training step takes")
        self.cursor.delivered_elsewhere(*self._read.popleft())

    @property
    def read_ahead(self) -> int:
        """Batches the framework has read and not yet handed to the training step."""
        return len(self._read)

    # --- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The cursor's Loader state: where the batch after the last one handed over starts."""
        return {"kind": _STATE_KIND, "loader": self.cursor.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at `state` (from `state_dict()`, or a Loader's own state): the next pass starts there."""
        if state.get("kind") == _STATE_KIND:
            state = state["loader"]
        self.close()
        self._pending = state
        self._read = deque()

    def close(self) -> None:
        """Close the cursor Loader, keeping its position for a later pass or state_dict() (a pass in
        progress closes its reading Loader when it ends)."""
        cursor, self._cursor = self._cursor, None
        if cursor is not None:
            self._pending = cursor.state_dict()
            cursor.close()

    def __repr__(self) -> str:
        return f"TrainingStream({self._args[1]!r}, {self._kwargs})"

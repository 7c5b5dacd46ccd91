"""torch integration: `ShardStreamDataset`, an IterableDataset of ready batches.

    ds = ShardStreamDataset(["srv:7070"], "web@3", batch_size=32, rank=rank, world_size=world)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)   # batches are made upstream

The servers decode and batch, and a `Loader` already prefetches in a background thread, so
`num_workers=0` is the usual choice. With `num_workers=k` the k workers split this rank's stream —
worker j takes steps j, j+k, j+2k, … — and DataLoader's in-order round robin hands them to the
training loop in the original order: nothing is doubled or skipped. Use a "spawn" or "forkserver"
multiprocessing context for workers: gRPC does not survive fork() of a process that already used it.

State: `state_dict()`/`load_state_dict()` work under torchdata's StatefulDataLoader (which keeps one
state per worker) and on their own; a state saved with one worker (or none) resumes under any
number of workers. Job cursors (`job=`, `commit`) need `num_workers=0`: use `ds.loader`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from shardstream.errors import InvalidArgumentError

from .loader import Loader
from .state import LoaderState

__all__ = ["ShardStreamDataset"]

_STATE_KIND = "shardstream.ShardStreamDataset"


class ShardStreamDataset(IterableDataset):  # type: ignore[type-arg]
    def __init__(
        self, endpoints: Any, dataset: Any, *, pin_memory: bool = False, **loader_kwargs: Any
    ) -> None:
        super().__init__()
        loader_kwargs.setdefault("output", "torch")
        self._args = (endpoints, dataset)
        self._kwargs = {**loader_kwargs, "pin_memory": pin_memory}  # pinned in the Loader's prefetch thread
        self.pin_memory = pin_memory
        Loader(*self._args, **self._kwargs).close()  # validate the arguments now, no network
        self._pending: Mapping[str, Any] | None = None
        self.loader: Loader | None = None  # the live Loader of this process (or worker)
        self._worker = (0, 1)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if workers > 1 and self._kwargs.get("job"):
            raise InvalidArgumentError("job cursors need num_workers=0 (the Loader already prefetches)")
        loader = Loader(*self._args, **self._kwargs)
        self._worker = (worker, workers)
        try:
            self._restore(loader, worker, workers)
            self.loader = loader
            yield from loader
        finally:
            loader.close()

    def _restore(self, loader: Loader, worker: int, workers: int) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            loader.split_steps(worker, workers)  # a fresh worker starts at its own first step
            return
        if pending.get("kind") != _STATE_KIND:
            raise InvalidArgumentError("not a ShardStreamDataset state")
        saved_workers = int(pending.get("num_workers", 1))
        state = LoaderState.from_dict(pending["loader"])
        if saved_workers == workers and int(pending.get("worker", 0)) == worker:
            loader.split_steps(worker, workers)
            loader.load_state_dict(state.to_dict())  # this worker's own cursor
            return
        if saved_workers > 1:
            raise InvalidArgumentError(
                f"this state was saved by worker {pending.get('worker')} of {saved_workers}; resume with "
                f"num_workers={saved_workers} (or from a state saved with num_workers=0)"
            )
        loader.load_state_dict(state.to_dict())
        loader.split_steps(worker, workers)  # a global cursor: this worker's first step is `worker` steps on

    def __len__(self) -> int:
        """This rank's steps per epoch (every DataLoader worker together): what `len(DataLoader(ds,
        batch_size=None))` and an LR scheduler see. TypeError for an endless stream (epochs=None)."""
        with Loader(*self._args, **self._kwargs) as loader:
            return len(loader)

    def state_dict(self) -> dict[str, Any]:
        if self.loader is None:
            if self._pending is not None:
                return dict(self._pending)
            with Loader(*self._args, **self._kwargs) as fresh:
                return {"kind": _STATE_KIND, "worker": 0, "num_workers": 1, "loader": fresh.state_dict()}
        worker, workers = self._worker
        return {
            "kind": _STATE_KIND,
            "worker": worker,
            "num_workers": workers,
            "loader": self.loader.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._pending = state
        self.loader = None

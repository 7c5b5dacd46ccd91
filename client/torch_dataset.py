"""torch integration: `ShardStreamDataset`, an IterableDataset of ready batches.

    ds = ShardStreamDataset(["srv:7070"], "web@3", batch_size=32, rank=rank, world_size=world)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)   # batches are made upstream

The servers decode and batch, and a `Loader` already prefetches in a background thread, so
`num_workers=0` is the usual choice. With `num_workers=k` the k workers split this rank's stream —
worker j takes steps j, j+k, j+2k, … counted across epochs (shardstream/order/cursor_math.py) — and DataLoader's
in-order round robin hands them to the training loop in the original order: nothing is doubled or
skipped. Use a "spawn" or "forkserver" multiprocessing context for workers: gRPC does not survive
fork() of a process that already used it.

State: `state_dict()`/`load_state_dict()` work under torchdata's StatefulDataLoader (which keeps one
state per worker) and on their own; a state saved with one worker (or none) resumes under any
number of workers.

Job cursors (`job=`, `commit`) with workers: iterate `ds.dataloader(num_workers=k, ...)`. Its
workers read their steps as above and tag each batch with where its step starts; the DataLoader
strips the tag in the training process as it hands the batch over and moves the job's cursor past
that step (`Loader.delivered_elsewhere`). So the cursor `ds.commit(step)` writes is the one position
every worker has handed over — the trainer-visible cut in step order, never a step a worker merely
prefetched — and it is the same global cursor a run without workers commits: a job resumes from it
with any number of workers, any world size, nothing lost or repeated. Each iteration of that
DataLoader continues from the training loop's position (the first from `resume=`). A plain
`DataLoader(ds, num_workers=k)` cannot report hand-overs and refuses a job.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from shardstream.errors import InvalidArgumentError

from .cursors.job import DEFAULT_COMMIT_TIMEOUT_S
from .loader import Loader
from .loader_state import LoaderState

__all__ = ["ShardStreamDataset"]

_STATE_KIND = "shardstream.ShardStreamDataset"
_JOB_KEYS = ("job", "cursor_store", "resume", "resume_min_step")


@dataclass(frozen=True)
class _Step:
    """The tag a worker sends with a batch: where its step of the rank's stream starts."""

    epoch: int
    start: int


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
        self._job = self._kwargs.get("job") is not None
        self._main: Loader | None = None  # job + workers: the job's cursor, in the training process
        self._handoff: dict[str, Any] | None = None  # set by dataloader(): where its workers start

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["loader"] = state["_main"] = None  # (channels, threads) stay in this process
        return state

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None and self._job:
            if self._handoff is None:
                raise InvalidArgumentError(
                    "job cursors under DataLoader workers: iterate ds.dataloader(num_workers=k, ...), which "
                    "reports each step handed to the training loop to the job's cursor (or use num_workers=0)"
                )
            yield from self._tagged(worker, workers)
            return
        loader = Loader(*self._args, **self._kwargs)
        self._worker = (worker, workers)
        try:
            self._restore(loader, worker, workers)
            self.loader = loader
            yield from loader
        finally:
            loader.close()

    def _tagged(self, worker: int, workers: int) -> Iterator[tuple[_Step, Any]]:
        """A worker of dataloader(): its steps from the training loop's cursor, each with its tag."""
        assert self._handoff is not None
        kwargs = {k: v for k, v in self._kwargs.items() if k not in _JOB_KEYS}
        with Loader(*self._args, **kwargs) as loader:
            loader.load_state_dict(self._handoff)
            loader.split_steps(worker, workers)
            self.loader, self._worker = loader, (worker, workers)
            for batch in loader:
                info = loader.last_batch
                assert info is not None
                yield _Step(info.epoch, info.global_start), batch

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
        kwargs = {k: v for k, v in self._kwargs.items() if k not in _JOB_KEYS}
        with Loader(*self._args, **kwargs) as loader:
            return len(loader)

    # --- job cursors ---------------------------------------------------------------------------
    def dataloader(self, num_workers: int = 0, **kwargs: Any) -> DataLoader:  # type: ignore[type-arg]
        """A torch DataLoader over this dataset (batch_size=None: batches are made upstream).

        With a job and num_workers > 0, the DataLoader moves the job's cursor as it hands each batch
        to the training loop (module docstring), so `commit` works as with num_workers=0; each
        iteration continues from the training loop's position. Give `multiprocessing_context="spawn"`
        (or "forkserver") with workers; persistent_workers is refused with a job (each iteration
        starts its workers at the cursor)."""
        if kwargs.setdefault("batch_size", None) is not None:
            raise InvalidArgumentError("batches are made upstream: the DataLoader's batch_size must be None")
        if not self._job or num_workers == 0:
            return DataLoader(self, num_workers=num_workers, **kwargs)
        if kwargs.get("persistent_workers"):
            raise InvalidArgumentError(
                "persistent_workers with a job: each iteration must start its workers at the job's cursor"
            )
        return _JobDataLoader(self, num_workers=num_workers, **kwargs)

    def _job_loader(self) -> Loader:
        """The Loader that holds the job's cursor in the training process (workers read the data)."""
        if not self._job:
            raise RuntimeError("commit() needs a job: ShardStreamDataset(..., job='run-42')")
        if self._main is None:
            self._main = Loader(*self._args, **self._kwargs)
            pending, self._pending = self._pending, None
            if pending is not None:
                if pending.get("kind") != _STATE_KIND or int(pending.get("num_workers", 1)) > 1:
                    raise InvalidArgumentError(
                        "a job under dataloader() workers resumes from a global state (one saved by "
                        "ShardStreamDataset.state_dict() in the training process, or with num_workers=0)"
                    )
                self._main.load_state_dict(pending["loader"])
        return self._main

    def _job_cursor(self) -> Loader:
        if self.loader is not None and self.loader.job is not None and self._worker == (0, 1):
            return self.loader  # num_workers=0: the Loader iterating in this process
        return self._job_loader()

    def commit(self, step: int, wait: bool = False, *, timeout_s: float = DEFAULT_COMMIT_TIMEOUT_S) -> None:
        """`Loader.commit` for this rank: the cursor once the batches handed to the training loop so
        far, with num_workers=0 or under `dataloader(num_workers=k)`."""
        self._job_cursor().commit(step, wait, timeout_s=timeout_s)

    def flush_commits(self, timeout_s: float = DEFAULT_COMMIT_TIMEOUT_S) -> None:
        self._job_cursor().flush_commits(timeout_s)

    @property
    def resumed_from(self) -> int | None:
        """The committed step the job resumes at (`resume=`), None otherwise (Loader.resumed_from)."""
        return self._job_cursor().resumed_from

    def close(self) -> None:
        """Write pending commits and close the training process's Loader (raises as Loader.close)."""
        main, self._main = self._main, None
        if main is not None:
            main.close()

    def __enter__(self) -> ShardStreamDataset:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        main, self._main = self._main, None
        if main is not None:
            main.__exit__(exc_type, *exc)

    # --- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._main is not None:  # the job's cursor in the training process: a global state
            return {"kind": _STATE_KIND, "worker": 0, "num_workers": 1, "loader": self._main.state_dict()}
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
        if self._main is not None:
            self._main.close()
            self._main = None


class _JobDataLoader(DataLoader):  # type: ignore[type-arg]
    """`ShardStreamDataset.dataloader` with a job and workers: hands over batches, moves the cursor."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ds = self.dataset
        assert isinstance(ds, ShardStreamDataset)
        main = ds._job_loader()
        ds._handoff = main.state_dict()  # pickled into the workers with the dataset as they start
        try:
            for tag, batch in super().__iter__():
                main.delivered_elsewhere(tag.epoch, tag.start)
                yield batch
        finally:
            ds._handoff = None

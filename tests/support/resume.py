"""The one resume harness: a stateful component resumed from a checkpoint delivers exactly what an
uninterrupted run delivers from that point.

    res = check_resume(make, cuts=[37], epochs=2, item=plain)

`make()` builds the component: an iterable with `state_dict()` / `load_state_dict()` (a Loader, a
ShardStreamDataset, a StatefulDataLoader, a job's ranks), entered as a context manager if it is one.
check_resume runs it once uninterrupted, then for every interruption point k —

- 0, the initial state, taken before iterating at all,
- the mid-epoch points asked for (`cuts`),
- the end of every epoch (the run is `epochs` epochs of equal length), the last one included —

runs a fresh component for k items (which must be the uninterrupted run's first k), takes its state
as a checkpoint stores it (`checkpoint`: a deep copy, or `as_json`), consumes `overrun` items more
(a crash some steps after the checkpoint: they are lost, and the state taken must not move with
them) and abandons it; then a fresh component loads the state and must deliver exactly the
uninterrupted run's items after k. The fresh component is `remake()` (default `make()`) given the
state with `load_state_dict`, or `resume(state)` where restoring is done another way (a job opened
with resume=, a DataLoader over a dataset that loaded the state). A resumed component with another
layout (world size, batch size) delivers the same samples in other groups: `flatten=True` compares
the concatenation of the items.

Modelled on torchdata's test/nodes/utils.py (run_test_save_load_state), with one difference: the
checkpoint is taken by a run of its own that then dies, as in a real restart.

`Ranks` makes a job of W ranks (W Loaders in this process, stepped together) such a component,
`CommittingRanks` the same with job cursors (commit / resume) as its checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardstream.client import Loader

__all__ = ["CommittingRanks", "Ranks", "Resumed", "as_json", "check_resume", "ids", "plain"]

_END = object()


@dataclass
class Resumed:
    """What check_resume checked, for a test's own further assertions."""

    full: list[Any]  # the uninterrupted run's items
    cuts: list[int]  # the interruption points, sorted
    states: dict[int, Any] = field(default_factory=dict)  # the checkpoint taken after k items
    tails: dict[int, list[Any]] = field(default_factory=dict)  # what the component resumed there delivered


def check_resume(
    make: Callable[[], Any],
    *,
    cuts: Iterable[int] | Callable[[int], Iterable[int]] = (),
    epochs: int = 1,
    item: Callable[[Any], Any] = lambda x: x,
    remake: Callable[[], Any] | None = None,
    resume: Callable[[Any], Any] | None = None,
    checkpoint: Callable[[Any], Any] = copy.deepcopy,
    flatten: bool = False,
    overrun: int = 1,
) -> Resumed:
    """Assert that resuming `make()`'s component at 0, at `cuts` and at every epoch's end gives the
    uninterrupted run's remaining items (see the module docstring); return what was seen.

    `cuts` may be a function of the uninterrupted run's length n (a small dataset has few steps)."""
    assert remake is None or resume is None, "remake (then load_state_dict) or resume, not both"
    full = _drain(make(), item)
    n = len(full)
    assert n > 0, "the uninterrupted run delivered nothing"
    assert n % epochs == 0, f"{n} items are not {epochs} epochs of equal length"
    ends = [n // epochs * e for e in range(1, epochs + 1)]
    points = sorted({0, *(cuts(n) if callable(cuts) else cuts), *ends})
    assert all(0 <= k <= n for k in points), f"interruption points {points} outside 0..{n}"
    res = Resumed(full, points)
    for k in points:
        res.states[k] = _interrupted(make(), k, item, full, checkpoint, overrun)
        if resume is None:
            with _opened((remake or make)()) as c:
                c.load_state_dict(checkpoint(res.states[k]))
                tail = [item(x) for x in c]
        else:
            tail = _drain(resume(checkpoint(res.states[k])), item)
        res.tails[k] = tail
        where = f"resumed after {k} of {n} items (epoch ends at {ends})"
        if flatten:
            assert _flat(full[:k]) + _flat(tail) == _flat(full), where
        else:
            assert len(tail) == n - k, f"{where}: {len(tail)} items, expected {n - k}"
            assert tail == full[k:], where
    return res


def _interrupted(
    component: Any,
    k: int,
    item: Callable[[Any], Any],
    full: list[Any],
    checkpoint: Callable[[Any], Any],
    overrun: int,
) -> Any:
    """A run stopped after k items: its state as checkpointed then, after `overrun` more items."""
    with _opened(component) as c:
        it = None
        if k:
            it = iter(c)
            head = [item(next(it)) for _ in range(k)]
            assert head == full[:k], f"a second run differs from the first in its first {k} items"
        raw = c.state_dict()
        state = checkpoint(raw)
        if overrun:
            it = it if it is not None else iter(c)
            for _ in range(overrun):
                if next(it, _END) is _END:
                    break
        assert checkpoint(raw) == state, f"the state taken after {k} items moved with the run"
        close = getattr(it, "close", None)
        if callable(close):
            close()
    return state


@contextlib.contextmanager
def _opened(component: Any) -> Iterator[Any]:
    if hasattr(component, "__enter__"):
        with component as c:
            yield c
    else:
        yield component


def _drain(component: Any, item: Callable[[Any], Any]) -> list[Any]:
    with _opened(component) as c:
        return [item(x) for x in c]


def _flat(items: list[Any]) -> list[Any]:
    return [u for x in items for u in x]


def as_json(state: Any) -> Any:
    """The state as a checkpoint file holds it: through JSON and back."""
    return json.loads(json.dumps(state))


def plain(batch: Any) -> tuple[Any, ...]:
    """A batch (a dict of numpy arrays or CPU tensors) as a value `==` compares exactly: each
    column's name, dtype, shape and bytes (so NaN equals itself), or its values for object arrays."""
    out = []
    for k, v in batch.items():
        a = np.asarray(v)
        out.append((k, a.dtype.str, a.shape, a.tolist() if a.dtype == object else a.tobytes()))
    return tuple(out)


def ids(step: Any) -> list[int]:
    """The sample ids of a batch, or of a Ranks step (rank 0's first)."""
    if isinstance(step, list):
        return [i for batch in step for i in batch["id"].tolist()]
    return step["id"].tolist()


class Ranks:
    """The W ranks of a job as one component: W Loaders in this process, stepped together. Each
    item is a global step, the list of every rank's batch (rank 0's first); every rank takes the same
    number of steps (zip strict). Its state is the one state every rank saves (asserted); loading it
    loads it into every rank, whatever this job's world and batch size."""

    def __init__(self, open_rank: Callable[[int], Loader], world: int) -> None:
        self.open_rank = open_rank
        self.world = world
        self.loaders: list[Loader] = []
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Ranks:
        with contextlib.ExitStack() as stack:
            self.loaders = [stack.enter_context(self.open_rank(r)) for r in range(self.world)]
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def __iter__(self) -> Iterator[list[Any]]:
        for batches in zip(*self.loaders, strict=True):
            yield list(batches)

    def state_dict(self) -> Any:
        states = [ld.state_dict() for ld in self.loaders]
        assert all(s == states[0] for s in states), "every rank saves the same state"
        return states[0]

    def load_state_dict(self, state: Any) -> None:
        for ld in self.loaders:
            ld.load_state_dict(state)


class CommittingRanks(Ranks):
    """Ranks of a job with a cursor store (each Loader opened with job= and cursor_store=): every
    rank commits each `commit_every` steps of this run, flushed (each checkpoint lands before the
    next; with `wait`, each rank's commit(step, wait=True) returns once it is durable), with step
    numbers counted from the job's start. Its state is a checkpoint: every rank
    commits the current step, and the state names it, {"job": ..., "step": ...}; it is resumed by
    a job opened with resume= (`resumed_from`: the step every rank must say it resumes at)."""

    def __init__(
        self,
        open_rank: Callable[[int], Loader],
        world: int,
        *,
        commit_every: int,
        resumed_from: int | None = None,
        wait: bool = False,
    ) -> None:
        super().__init__(open_rank, world)
        self.commit_every = commit_every
        self.wait = wait
        self.resumed_from = resumed_from
        self.step = 0

    def __enter__(self) -> CommittingRanks:
        super().__enter__()
        starts = {ld.resumed_from for ld in self.loaders}
        assert starts == {self.resumed_from}, f"ranks resume at {starts}, expected {self.resumed_from}"
        self.step = self.resumed_from or 0
        return self

    def __iter__(self) -> Iterator[list[Any]]:
        for done, step in enumerate(super().__iter__(), 1):
            self.step += 1
            if done % self.commit_every == 0:
                self._commit()
            yield step

    def _commit(self) -> None:
        for ld in self.loaders:
            ld.commit(self.step, wait=self.wait)
        for ld in self.loaders:
            ld.flush_commits()

    def state_dict(self) -> dict[str, Any]:
        self._commit()
        return {"job": self.loaders[0].job, "step": self.step}

    def load_state_dict(self, state: Any) -> None:
        raise TypeError("a job resumes from its cursor store: open its ranks with resume=")

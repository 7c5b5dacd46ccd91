"""The resume harness itself (tests/support/resume.py): passes a component that resumes exactly, and
fails each way one can resume wrongly — off by one, a state that moves with the run, the initial
state or an epoch's end mishandled, another layout losing samples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .support.resume import as_json, check_resume


class Counter:
    """0..n-1 over `epochs` epochs, in batches of `batch`; its state is the next position."""

    def __init__(self, n: int = 10, epochs: int = 1, batch: int = 1) -> None:
        self.n, self.epochs, self.batch = n, epochs, batch
        self.state = {"pos": 0}

    def __iter__(self) -> Iterator[list[int]]:
        while self.state["pos"] < self.n * self.epochs:
            pos = self.state["pos"]
            end = min(pos + self.batch, (pos // self.n + 1) * self.n)
            self.state = {"pos": end}
            yield [p % self.n + 100 * (p // self.n) for p in range(pos, end)]

    def state_dict(self) -> dict[str, Any]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = dict(state)


class OffByOne(Counter):
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = {"pos": state["pos"] + (state["pos"] > 0)}


class LiveState(Counter):
    """Hands out its own state object, which the run keeps changing."""

    def __init__(self, n: int = 10, epochs: int = 1, batch: int = 1) -> None:
        super().__init__(n, epochs, batch)
        self.live: dict[str, Any] = {}

    def __iter__(self) -> Iterator[list[int]]:
        for item in super().__iter__():
            self.live["pos"] = self.state["pos"]
            yield item

    def state_dict(self) -> dict[str, Any]:
        self.live = dict(self.state)
        return self.live


class RestartsAtEpochEnd(Counter):
    """Resumed at an epoch's end, it plays that epoch again."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pos = state["pos"]
        self.state = {"pos": pos - self.n if pos and pos % self.n == 0 else pos}


class IgnoresInitialState(Counter):
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = {"pos": state["pos"] or 1}


def test_an_exact_component_passes_at_0_mid_epoch_and_every_epoch_end() -> None:
    res = check_resume(lambda: Counter(10, epochs=2), cuts=[3, 13], epochs=2, checkpoint=as_json)
    assert res.cuts == [0, 3, 10, 13, 20]
    assert res.full == [[i] for i in range(10)] + [[100 + i] for i in range(10)]
    assert res.states[13] == {"pos": 13} and res.tails[13] == res.full[13:] and res.tails[20] == []


def test_another_layout_compares_the_samples_with_flatten() -> None:
    res = check_resume(
        lambda: Counter(10, batch=3), cuts=[2], remake=lambda: Counter(10, batch=4), flatten=True
    )
    assert res.tails[2] == [[6, 7, 8, 9]]
    with pytest.raises(AssertionError):  # the same items, grouped otherwise
        check_resume(lambda: Counter(10, batch=3), cuts=[2], remake=lambda: Counter(10, batch=4))


def test_resume_by_construction() -> None:
    def restored(state: dict[str, Any]) -> Counter:
        c = Counter(10)
        c.state = state
        return c

    check_resume(lambda: Counter(10), cuts=[5], resume=restored)


@pytest.mark.parametrize(
    ("component", "cuts", "message"),
    [
        (OffByOne, [4], "resumed after 4"),
        (LiveState, [4], "moved with the run"),
        (RestartsAtEpochEnd, [], "resumed after 10"),
        (IgnoresInitialState, [], "resumed after 0"),
    ],
)
def test_each_way_of_resuming_wrongly_fails(component: type[Counter], cuts: list[int], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_resume(lambda: component(10, epochs=2), cuts=cuts, epochs=2)


def test_a_run_that_differs_from_the_first_fails() -> None:
    runs = iter(range(100))

    def make() -> Counter:
        c = Counter(10)
        c.state = {"pos": next(runs) % 2}
        return c

    with pytest.raises(AssertionError):
        check_resume(make, cuts=[3])


def test_interruption_points_must_lie_in_the_run() -> None:
    with pytest.raises(AssertionError, match="outside"):
        check_resume(lambda: Counter(10), cuts=[11])
    with pytest.raises(AssertionError, match="epochs of equal length"):
        check_resume(lambda: Counter(10), epochs=3)
    check_resume(lambda: Counter(10), cuts=lambda n: [n - 1])

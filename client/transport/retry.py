"""`Attempts`: the failures in a row of one call under a `RetryPolicy` (spec.py) — the one retry count.

Every call the client retries goes through one: a Read stream resumed elsewhere (session.py),
discovery asking the endpoints in turn (fleet.find_dataset) and each checkpoint call (fleet.Fleet.call).
The policy decides, the same way for all three: a call gives up once it has failed more than
`max_retries` times in a row AND the first of those failures is at least `budget_s` old (a few quick
failures do not end a job while a server restarts; a dead fleet is said after about `budget_s`), and
waits the policy's jittered exponential backoff before each next try. Progress (a stream's step)
resets the count. The clock is a parameter: tests count attempts on a fake one, not seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Attempts", "Policy"]


class Policy(Protocol):  # spec.RetryPolicy
    max_retries: int
    budget_s: float
    backoff_max_s: float

    def backoff_s(self, failures: int) -> float: ...


class Attempts:
    """Failures in a row under `policy`: whether to try again, and how long to wait first."""

    def __init__(self, policy: Policy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self.failures = 0  # in a row, without progress
        self._since = 0.0  # when the first of them happened (or the call started: start())
        self._started = False

    def start(self) -> None:
        """Count the budget from now, not from the first failure (a call whose first try may take
        the whole budget: discovery)."""
        self._since = self._clock()
        self._started = True

    def progress(self) -> None:
        """The call moved on: the budget starts afresh."""
        self.failures = 0
        self._started = False

    @property
    def failing_s(self) -> float:
        """Seconds since the first failure in a row (or since start())."""
        return self._clock() - self._since if self.failures or self._started else 0.0

    def failed(self) -> bool:
        """Count one failure; False once the budget is spent (more than max_retries failures in a
        row, the first of them at least budget_s ago): the caller raises then."""
        now = self._clock()
        if self.failures == 0 and not self._started:
            self._since = now
        self.failures += 1
        return not (self.failures > self.policy.max_retries and now - self._since >= self.policy.budget_s)

    def backoff_s(self) -> float:
        """The wait before the next try: the policy's jittered exponential backoff for this failure."""
        return self.policy.backoff_s(self.failures)

"""Discovery (client/transport/fleet.py find_dataset) on the stream session's RetryPolicy, and gRPC's own retry
limited to what only it can do (client/transport/channel.py)."""

from __future__ import annotations

import json

import pytest

from shardstream.client.spec import RetryPolicy
from shardstream.client.transport.channel import CHANNEL_OPTIONS
from shardstream.client.transport.fleet import find_dataset
from shardstream.errors import NotFoundError, UnavailableError
from shardstream.v1 import shardstream_pb2 as pb


class Policy(RetryPolicy):
    """A RetryPolicy that records the backoffs drawn and waits none."""

    def __init__(self, **kw: float) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        object.__setattr__(self, "drawn", [])

    def backoff_s(self, failures: int) -> float:
        self.drawn.append(failures)  # type: ignore[attr-defined]
        return 0.0


def fleet(answers: dict[str, list[Exception | None]]) -> tuple[list[str], object]:
    asked: list[str] = []

    class Conn:
        def __init__(self, target: str) -> None:
            self.target = target

        def get_dataset(self, dataset: str, timeout_s: float) -> pb.DatasetInfo:
            asked.append(self.target)
            error = answers[self.target].pop(0) if answers[self.target] else None
            if error is not None:
                raise error
            return pb.DatasetInfo(name=dataset, version=1)

    return asked, Conn


def test_discovery_asks_the_next_endpoint_after_the_policys_backoff() -> None:
    down = UnavailableError("UNAVAILABLE: down")
    asked, conn = fleet({"a:1": [down, down], "b:2": [down, down]})
    policy = Policy(max_retries=6, budget_s=0.0)
    info = find_dataset("toy", ["a:1", "b:2"], 1, policy, conn)  # type: ignore[arg-type]
    assert info.name == "toy" and asked == ["b:2", "a:1", "b:2", "a:1", "b:2"]  # from the rank's own
    assert policy.drawn == [1, 2, 3, 4]  # type: ignore[attr-defined]


def test_discovery_gives_up_once_max_retries_and_the_budget_are_spent() -> None:
    asked, conn = fleet({"a:1": [UnavailableError("UNAVAILABLE: down")] * 100})
    policy = Policy(max_retries=3, budget_s=0.0)
    with pytest.raises(UnavailableError, match=r"no shardstream server reachable at a:1 within 0 s"):
        find_dataset("toy", ["a:1"], 0, policy, conn)  # type: ignore[arg-type]
    assert len(asked) == 4  # the first try, then max_retries more


def test_discovery_hands_on_any_other_error_at_once() -> None:
    asked, conn = fleet({"a:1": [NotFoundError("no toy")], "b:2": []})
    with pytest.raises(NotFoundError):
        find_dataset("toy", ["a:1", "b:2"], 0, Policy(), conn)  # type: ignore[arg-type]
    assert asked == ["a:1"]


def test_grpc_keeps_load_balancing_but_retries_nothing_itself() -> None:
    options = dict(CHANNEL_OPTIONS)
    config = json.loads(str(options["grpc.service_config"]))
    assert config == {"loadBalancingConfig": [{"round_robin": {}}]}  # no methodConfig retryPolicy

"""The save path's stops, each visited once (issue #40) — without a server (fakes, a fake clock).

Discovery: a Checkpointer finds the data plane with ListDatasets(data_plane_only), which reads no
manifest (a plain ListDatasets, `shardstream datasets list`'s, still lists them). The store is the
domain boundary: it checks step, rank, world size and save id for every caller (the data plane only
says who may). follow() retries a failed look in the transport's one retry layer (Fleet.call), under
its own longer budget.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.flight as flight
import pytest

from shardstream.checkpoint_format import FORMAT, PART_KIND, chunk_key
from shardstream.client.checkpoint import Checkpointer
from shardstream.client.checkpoint.checkpointer import FOLLOW_BACKOFF_S
from shardstream.client.spec import RetryPolicy
from shardstream.client.transport import fleet
from shardstream.client.transport.channel import Connection
from shardstream.errors import InvalidArgumentError, UnavailableError
from shardstream.server.checkpoints import open_checkpoint_store
from shardstream.server.serving.control_plane import ShardStreamService
from shardstream.v1 import shardstream_pb2 as pb

from .support.fake_clock import Clock


# --- discovery ------------------------------------------------------------------------------------
def _service(listed: list[str]) -> ShardStreamService:
    def listing() -> Any:
        listed.append("listing")
        return SimpleNamespace(manifests=[], bad=[])

    runtime = SimpleNamespace(registry=SimpleNamespace(listing=listing), data_port=9001, grants=None)
    return ShardStreamService(runtime)  # type: ignore[arg-type]


def test_list_datasets_for_the_data_plane_only_reads_no_manifest() -> None:
    listed: list[str] = []
    service = _service(listed)
    answer = asyncio.run(service.list_datasets(pb.ListDatasetsRequest(data_plane_only=True)))
    assert answer.data_port == 9001 and not answer.datasets and listed == []
    answer = asyncio.run(service.list_datasets(pb.ListDatasetsRequest()))  # the CLI's, an old client's
    assert answer.data_port == 9001 and listed == ["listing"]


def test_a_checkpoint_call_discovers_with_data_plane_only_and_a_read_with_get_dataset() -> None:
    conn = Connection("127.0.0.1:7070")
    asked: list[Any] = []

    def list_(request: pb.ListDatasetsRequest, **_: Any) -> pb.ListDatasetsResponse:
        asked.append(request)
        return pb.ListDatasetsResponse(data_port=9000)

    conn._list = list_  # type: ignore[method-assign]
    try:
        assert conn.data_plane(None).target == "127.0.0.1:9000"
        assert [r.data_plane_only for r in asked] == [True]
    finally:
        conn.close()


# --- the store checks every value, for every caller ------------------------------------------------
def _part(job: str, step: int, rank: int, world: int, data: bytes) -> dict[str, Any]:
    h = hashlib.sha256(data).hexdigest()
    tensors = {"0": {"path": "w", "kind": "numpy", "dtype": "uint8", "shape": [len(data)], "nbytes": len(data), "chunks": [[h, len(data)]]}}
    return {"kind": PART_KIND, "format": FORMAT, "job": job, "step": step, "rank": rank, "world_size": world,
            "save_id": "s", "tensors": tensors, "objects": None, "loader": None}  # fmt: skip


@pytest.mark.parametrize("rank", [True, -1, 1 << 20, "0", None])
def test_the_store_refuses_a_rank_that_is_none(tmp_path: Path, rank: Any) -> None:
    store = open_checkpoint_store(tmp_path)
    with pytest.raises(InvalidArgumentError, match="rank"):
        store.put_part("job", 1, rank, _part("job", 1, 1, 2, b"x"))
    assert not list(tmp_path.rglob("*.json"))


@pytest.mark.parametrize(
    ("step", "world", "save_id", "field"),
    [
        (-1, 1, "s", "step"),
        (True, 1, "s", "step"),
        (1, 0, "s", "world_size"),
        (1, True, "s", "world_size"),
        (1, "3", "s", "world_size"),
        (1, 10**7, "s", "world_size"),
        (1, 1, "", "save_id"),
        (1, 1, "x" * 257, "save_id"),
        (1, 1, 7, "save_id"),
    ],
)
def test_the_store_refuses_a_commit_whose_values_are_none(tmp_path: Path, step: Any, world: Any, save_id: Any, field: str) -> None:
    store = open_checkpoint_store(tmp_path)
    with pytest.raises(InvalidArgumentError, match=field):
        store.commit("job", step, world, save_id)


def test_a_commit_finds_a_chunk_removed_since_has_said_it_was_there(tmp_path: Path) -> None:
    """The commit's own look at the chunks is the safety net against a gc or an abort in between."""
    store = open_checkpoint_store(tmp_path)
    data = b"tensor bytes"
    h = hashlib.sha256(data).hexdigest()
    assert store.put_chunk("job", h, data) and store.has_chunks("job", [h]) == [h]
    store.put_part("job", 1, 0, _part("job", 1, 0, 1, data))
    store.storage.delete(chunk_key("job", h))  # another save's abort, or a gc
    assert store.commit("job", 1, 1, "s") == {"committed": False, "waiting_for": [], "missing": [h]}
    assert store.put_chunk("job", h, data)
    assert store.commit("job", 1, 1, "s")["committed"]


# --- follow(): the transport's one retry layer -------------------------------------------------------


def _scripted(monkeypatch: pytest.MonkeyPatch, down: int) -> list[str]:
    """A fleet whose data plane is down for the first `down` looks, then answers steps [1, 2]."""
    asked: list[str] = []

    class Client:
        def do_action(self, action: Any, options: Any) -> Any:
            return iter([flight.Result(b'{"steps": [1, 2]}')])

    class Plane:
        client = Client()
        target = "a:9000"

        def options(self, signed: bytes, timeout_s: float | None) -> None:
            return None

    class Conn:
        def __init__(self, target: str, security: Any) -> None:
            self.target = target

        def data_plane(self, dataset: str | None) -> Plane:
            asked.append(self.target)
            if len(asked) <= down:
                raise UnavailableError("UNAVAILABLE: scripted restart")
            return Plane()

        def forget_data_port(self) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(fleet, "Connection", Conn)
    return asked


def _checkpointer(clock: Clock) -> Checkpointer:
    ck = Checkpointer(["a:1"], job="follow")
    ck._session.fleet._clock, ck._session.fleet._sleep = clock, clock.sleep
    return ck


def test_follow_rides_out_a_restart_longer_than_a_save_s_budget_in_one_retry_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _scripted(monkeypatch, down=40)
    clock = Clock()
    with _checkpointer(clock) as ck:
        assert list(ck.follow(start=0, poll_s=0, timeout_s=-1)) == [2]
    assert len(asked) == 40 + 2  # one try per failure, then two looks answered
    # every wait is the transport's (the fake clock's), on follow()'s policy: past a save's budget, and
    # backoffs longer than a save's longest (full jitter up to FOLLOW_BACKOFF_S[1])
    assert len(clock.sleeps) == 40 and clock.now > RetryPolicy().budget_s
    assert RetryPolicy().backoff_max_s < max(clock.sleeps) <= FOLLOW_BACKOFF_S[1]


def test_follow_gives_up_after_unavailable_s_without_an_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, down=10**6)
    clock = Clock()
    with _checkpointer(clock) as ck, pytest.raises(UnavailableError, match="scripted"):
        next(ck.follow(start=0, unavailable_s=30.0))
    assert 30.0 <= clock.now <= 30.0 + FOLLOW_BACKOFF_S[1]


def test_steps_outside_follow_keep_the_checkpointer_s_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, down=10**6)
    clock = Clock()
    with _checkpointer(clock) as ck, pytest.raises(UnavailableError):
        ck.steps()
    assert clock.now <= RetryPolicy().budget_s + RetryPolicy().backoff_max_s

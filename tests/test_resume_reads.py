"""What a resume reads from the cursor store: rank 0 every rank's record of the step (and checks them
all), any other rank only its own and rank 0's — so W ranks restarting at once read ~2W records, not
W² (the restart storm of `python -m loadtest.scale`). On every kind of store."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from shardstream.client.cursors.records import CursorRecord
from shardstream.client.cursors.resume import committed_state
from shardstream.client.cursors.stores import open_store
from shardstream.client.loader_state import LoaderState
from shardstream.errors import CorruptCursorError, NoCommittedStepError

FINGERPRINT = "f" * 64
STATE = LoaderState("toy@1", FINGERPRINT, 0, "block(window=16)", 0, 40, 3, 10)
TARGET: Any = SimpleNamespace(fingerprint=FINGERPRINT, label="toy@1")


def _write_step(store: Any, job: str, step: int, world: int, bad_rank: int | None = None) -> None:
    key = CursorRecord(job, 0, step, STATE).key
    for r in range(world):
        record = b"garbage" if r == bad_rank else CursorRecord(job, r, step, STATE, 1.0).to_bytes()
        store.write(job, step, key, r, world, record)


class CountingStore:
    """A store that counts the records each read hands back (everything else passes through)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.records_read = 0
        self.url = store.url

    def read(self, job: str, step: int) -> dict[int, bytes]:
        out: dict[int, bytes] = self.store.read(job, step)
        self.records_read += len(out)
        return out

    def read_ranks(self, job: str, step: int, ranks: list[int]) -> dict[int, bytes]:
        out: dict[int, bytes] = self.store.read_ranks(job, step, ranks)
        self.records_read += len(out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_read_ranks_returns_the_committed_records_asked_for(store_url: str) -> None:
    store = open_store(store_url)
    try:
        _write_step(store, "j", 4, 3)
        assert store.read_ranks("j", 4, [2, 0]) == {r: store.read("j", 4)[r] for r in (0, 2)}
        assert store.read_ranks("j", 4, [7]) == {}  # a rank the step does not have
        assert store.read_ranks("j", 4, []) == {}
        assert store.read_ranks("j", 5, [0]) == {}  # not committed
        key = CursorRecord("j", 0, 6, STATE).key
        store.write("j", 6, key, 0, 3, CursorRecord("j", 0, 6, STATE, 1.0).to_bytes())  # 1 of 3 ranks
        assert store.read_ranks("j", 6, [0]) == {}
    finally:
        store.close()


@pytest.mark.parametrize("resume", ["latest", 4])
def test_a_rank_other_than_0_reads_two_records_and_resumes_alike(store_url: str, resume: str | int) -> None:
    world = 50
    store = open_store(store_url)
    try:
        _write_step(store, "j", 4, world)
        reads = []
        for rank in (0, 1, 7, world - 1, world + 3):  # world + 3: a rank of a larger world on resume
            counting = CountingStore(store)
            state, step = committed_state(counting, "j", resume, TARGET, rank=rank)
            assert (step, state) == (4, STATE)
            reads.append(counting.records_read)
        per_check = 1 if resume == "latest" else 2  # a numeric step is first checked to be committed
        assert reads[0] == world * per_check  # rank 0 reads them all
        assert reads[1:] == [2 * per_check, 2 * per_check, 2 * per_check, 1 * per_check]
        with pytest.raises(NoCommittedStepError):
            committed_state(store, "j", 5, TARGET, rank=3)
    finally:
        store.close()


def test_a_corrupt_record_stops_rank_0_and_its_own_rank(store_url: str) -> None:
    store = open_store(store_url)
    try:
        _write_step(store, "j", 4, 4, bad_rank=2)
        for rank in (0, 2):
            with pytest.raises(CorruptCursorError, match="rank 2"):
                committed_state(store, "j", "latest", TARGET, rank=rank)
        # Rank 3 never reads rank 2's record; rank 0's failure stops the job (its launcher tears it down).
        assert committed_state(store, "j", "latest", TARGET, rank=3) == (STATE, 4)
    finally:
        store.close()

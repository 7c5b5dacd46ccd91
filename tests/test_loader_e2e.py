"""The Loader against real server processes: exactly-once, resume, determinism, bad input."""

from __future__ import annotations

import random
import threading
import time

import grpc
import numpy as np
import pyarrow.flight as flight
import pytest

from shardstream.client import Loader
from shardstream.client.transport.channel import Connection
from shardstream.errors import (
    FailedPreconditionError,
    FlightStatus,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from shardstream.v1 import shardstream_pb2 as pb

from .support.data import N_ROWS
from .support.resume import Ranks, as_json, check_resume, ids
from .support.servers import unused_port


def run_epoch(endpoints: list[str], world: int, batch: int, **kw) -> list[list[np.ndarray]]:  # type: ignore[no-untyped-def]
    """ids[rank][step] for one epoch, every rank a Loader of its own."""
    out = []
    for rank in range(world):
        with Loader(endpoints, "toy@1", batch_size=batch, rank=rank, world_size=world, **kw) as ld:
            out.append([b["id"].copy() for b in ld])
    return out


def global_order(per_rank: list[list[np.ndarray]]) -> list[int]:
    steps = len(per_rank[0])
    assert all(len(r) == steps for r in per_rank), "every rank takes the same number of steps"
    return [int(i) for t in range(steps) for r in per_rank for i in r[t]]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_exactly_once_over_an_epoch(endpoints: list[str], world: int, batch: int, shuffle: bool) -> None:
    order = global_order(run_epoch(endpoints, world, batch, shuffle=shuffle, seed=11))
    assert sorted(order) == list(range(N_ROWS))
    if not shuffle:
        assert order == list(range(N_ROWS))
    else:
        assert order != list(range(N_ROWS))


@pytest.mark.parametrize("world,batch", [(2, 32), (3, 7)])
def test_drop_last_drops_the_short_step_and_reports_it(endpoints: list[str], world: int, batch: int) -> None:
    order = global_order(run_epoch(endpoints, world, batch, shuffle=True, drop_last=True))
    kept = N_ROWS - N_ROWS % (world * batch)
    assert len(order) == len(set(order)) == kept
    full = global_order(run_epoch(endpoints, world, batch, shuffle=True))
    assert order == full[:kept]  # the documented prefix, never padded
    with Loader(endpoints, "toy@1", batch_size=batch, world_size=world, drop_last=True) as ld:
        for _ in ld:
            pass
        assert ld.dropped == {0: N_ROWS % (world * batch)}


def test_order_is_independent_of_world_size(endpoints: list[str]) -> None:
    a = global_order(run_epoch(endpoints, 1, 64, seed=5))
    b = global_order(run_epoch(endpoints, 4, 9, seed=5))
    assert a == b


def test_determinism_same_seed_same_batches_other_seed_differs(endpoints: list[str]) -> None:
    a = run_epoch(endpoints, 2, 16, seed=1)
    b = run_epoch(endpoints, 2, 16, seed=1)
    c = run_epoch(endpoints, 2, 16, seed=2)
    assert all(
        np.array_equal(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=False)
    )
    assert global_order(a) != global_order(c)


def test_epochs_have_their_own_order_and_endless_streams_continue(endpoints: list[str]) -> None:
    with Loader(endpoints, "toy@1", batch_size=100, epochs=2) as ld:
        ids = np.concatenate([b["id"] for b in ld]).tolist()
        assert ld.epoch == 2 and ld.offset == 0
    first, second = ids[:N_ROWS], ids[N_ROWS:]
    assert sorted(first) == sorted(second) == list(range(N_ROWS)) and first != second
    with Loader(endpoints, "toy@1", batch_size=100, epochs=None) as ld:
        it = iter(ld)
        seen = np.concatenate([next(it)["id"] for _ in range(20)]).tolist()
    assert seen == ids[: len(seen)]  # endless = epoch after epoch, same orders


@pytest.mark.parametrize("case", range(6))
def test_resume_from_state_dict_with_other_world_and_batch_size(endpoints: list[str], case: int) -> None:
    rng = random.Random(case)
    w1, b1 = rng.choice([1, 2, 3, 4]), rng.choice([5, 16, 33])
    w2, b2 = rng.choice([1, 2, 3, 5]), rng.choice([1, 8, 40])
    uninterrupted = global_order(run_epoch(endpoints, 1, 50, seed=case))
    steps_total = -(-N_ROWS // (w1 * b1))
    stop_after = rng.randrange(1, steps_total)

    def job(world: int, batch: int) -> Ranks:
        return Ranks(
            lambda rank: Loader(endpoints, "toy@1", batch_size=batch, rank=rank, world_size=world, seed=case),
            world,
        )

    # Saved by w1 ranks of b1 (every rank saves the same state), resumed by w2 ranks of b2.
    res = check_resume(
        lambda: job(w1, b1),
        cuts=[stop_after],
        remake=lambda: job(w2, b2),
        item=ids,
        flatten=True,
        checkpoint=as_json,
    )
    assert res.states[stop_after]["offset"] == stop_after * w1 * b1
    assert [i for step in res.full for i in step] == uninterrupted


def test_state_at_epoch_end_and_initial_state(endpoints: list[str]) -> None:
    res = check_resume(
        lambda: Loader(endpoints, "toy@1", batch_size=300, epochs=2),
        cuts=[2, 5],
        epochs=2,
        item=ids,
        checkpoint=as_json,
    )
    assert res.cuts == [0, 2, 4, 5, 8]  # 1009 rows / 300 = 4 steps: the epoch's end
    initial, at_end = res.states[0], res.states[4]
    assert (initial["epoch"], initial["offset"]) == (0, 0)
    assert (at_end["epoch"], at_end["offset"]) == (1, 0)
    rest = res.tails[4]
    assert len(rest) == 4 and sorted(i for b in rest for i in b) == list(range(N_ROWS))
    assert res.tails[8] == []


def test_state_from_another_version_is_refused(endpoints: list[str]) -> None:
    with Loader(endpoints, "toy@1", batch_size=10) as ld:
        state = ld.state_dict()
    with Loader(endpoints, "toy@2", batch_size=10) as ld:
        with pytest.raises(FailedPreconditionError, match="toy@1.*toy@2"):
            ld.load_state_dict(state)
    with Loader(endpoints, "toy@1", batch_size=10, seed=9) as ld:
        with pytest.raises(InvalidArgumentError, match="seed"):
            ld.load_state_dict(state)
        for garbage in ({}, {"kind": "other"}, {**state, "offset": "12"}, {**state, "format": 99}, None):
            with pytest.raises(InvalidArgumentError):
                ld.load_state_dict(garbage)  # type: ignore[arg-type]


def test_outputs_and_provenance(endpoints: list[str]) -> None:
    import torch

    with Loader(
        endpoints, "toy@1", batch_size=10, output="torch", provenance=True, columns=["x", "id"]
    ) as ld:
        b = next(iter(ld))
        assert list(b) == ["x", "id", "_shard", "_row"]
        assert isinstance(b["x"], torch.Tensor) and b["x"].shape == (10, 3) and b["x"].dtype == torch.float32
        assert torch.equal(b["x"][:, 0].long(), b["id"])
        info = ld.last_batch
        assert info is not None and (info.position_start, info.position_end) == (0, 10)
        np.testing.assert_array_equal(info.shards, b["_shard"].numpy())
    with Loader(endpoints, "toy@1", batch_size=10, output="arrow", shuffle=False) as ld:
        b = next(iter(ld))
        assert b.schema.names == ["id", "x", "label", "text"]
        assert b.column("text").to_pylist()[:2] == ["sample-0", "sample-1"]


def test_tiny_dataset_with_more_ranks_than_rows(endpoints: list[str]) -> None:
    per_rank = []
    for rank in range(3):
        with Loader(endpoints, "tiny", batch_size=4, rank=rank, world_size=3) as ld:
            per_rank.append([len(b["id"]) for b in ld])
    assert per_rank == [[0], [0], [1]]  # same step count everywhere, one sample total


# --- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(rank=2, world_size=2),
        dict(rank=-1),
        dict(batch_size=0),
        dict(batch_size=-3),
        dict(world_size=0),
        dict(epochs=0),
        dict(output="pandas"),
        dict(shuffle="sideways"),
        dict(columns="id"),
        dict(columns=["id", "id"]),
    ],
)
def test_bad_arguments_fail_before_any_network_call(kwargs: dict) -> None:  # type: ignore[type-arg]
    # Nothing listens on this port: a network call would fail differently (UnavailableError).
    args = dict(batch_size=4) | kwargs
    with pytest.raises(ValueError):
        Loader([f"127.0.0.1:{unused_port()}"], "toy", **args)


@pytest.mark.parametrize("endpoints_arg", [[], ["nohost"], ["h:notaport"], "", [""]])
def test_bad_endpoints(endpoints_arg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="endpoint"):
        Loader(endpoints_arg, "toy", batch_size=1)


def test_unknown_dataset_and_version_are_not_found(endpoints: list[str]) -> None:
    with (
        Loader(endpoints, "nope", batch_size=1) as ld,
        pytest.raises(NotFoundError, match="no dataset named 'nope'"),
    ):
        iter(ld)
    with Loader(endpoints, "toy@9", batch_size=1) as ld, pytest.raises(NotFoundError, match="no version 9"):
        iter(ld)


def test_unknown_column_fails_before_streaming(endpoints: list[str]) -> None:
    with Loader(endpoints, "toy", batch_size=1, columns=["id", "colour"]) as ld:
        with pytest.raises(
            InvalidArgumentError, match="unknown column.*'colour'.*columns are: id, x, label, text"
        ):
            iter(ld)


def test_no_server_reachable_is_one_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dead = [f"127.0.0.1:{unused_port()}", f"127.0.0.1:{unused_port()}"]
    t0 = time.monotonic()
    with Loader(dead, "toy", batch_size=1, timeout_s=2) as ld:
        with pytest.raises(UnavailableError, match="no shardstream server reachable"):
            iter(ld)
    assert time.monotonic() - t0 < 60  # bounded, not a hang (generous: not a timing assertion)


def raw_read(target: str, **fields) -> list:  # type: ignore[no-untyped-def]
    """A Read stream as a plain Flight client sees it: (ReadHeader, rows) per message."""
    port = Connection(target).get_dataset("toy@1", 30).data_port
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    req = dict(dataset="toy@1", world_size=1, batch_size=4, shuffle=pb.Shuffle(mode="none")) | fields
    try:
        reader = client.do_get(flight.Ticket(pb.ReadRequest(**req).SerializeToString()))
        return [(pb.ReadHeader.FromString(c.app_metadata.to_pybytes()), c.data) for c in reader]
    except flight.FlightError as exc:
        raise FlightStatus.of(exc) from exc
    finally:
        client.close()


@pytest.mark.parametrize("shuffle", ["none", "block"])
def test_a_stored_order_stream_carries_its_provenance_in_the_headers(endpoints: list[str], shuffle: str) -> None:
    """ReadRequest.provenance_in_header (the Loader sets it unless provenance=True): unshuffled, no
    message has `_shard`/`_row` columns, its header names its rows' provenance as runs, and every
    batch's BatchInfo says what the columns say; shuffled, the columns come as before."""
    raw = raw_read(endpoints[0], provenance_in_header=True, shuffle=pb.Shuffle(mode=shuffle), batch_size=7)
    plain = raw_read(endpoints[0], shuffle=pb.Shuffle(mode=shuffle), batch_size=7)
    assert raw and all(h.HasField("provenance") == (shuffle == "none") for h, _ in raw)
    assert all(("_shard" in rows.schema.names) == (shuffle != "none") for _, rows in raw)
    assert all("_shard" in rows.schema.names and not h.HasField("provenance") for h, rows in plain)

    def batches(**kw) -> list:  # type: ignore[no-untyped-def]
        out = []
        with Loader(endpoints, "toy@1", batch_size=7, world_size=2, rank=1, shuffle=shuffle != "none", **kw) as ld:
            for b in ld:
                info = ld.last_batch
                assert info is not None
                out.append((info.shards, info.rows, b))
        return out

    bare, full = batches(), batches(provenance=True)
    assert len(bare) == len(full) > 3
    for (shards, rows, b), (shards2, rows2, b2) in zip(bare, full, strict=True):
        assert "_shard" not in b and list(b2)[-2:] == ["_shard", "_row"]
        np.testing.assert_array_equal(b["id"], b2["id"])
        np.testing.assert_array_equal(shards, b2["_shard"])
        np.testing.assert_array_equal(rows, b2["_row"])
        np.testing.assert_array_equal(shards2, shards)
        np.testing.assert_array_equal(rows2, rows)


@pytest.mark.parametrize(
    ("fields", "code", "text"),
    [
        (dict(columns=["colour"]), grpc.StatusCode.INVALID_ARGUMENT, "unknown column"),
        (dict(rank=3, world_size=2), grpc.StatusCode.INVALID_ARGUMENT, "rank"),
        (dict(batch_size=0), grpc.StatusCode.INVALID_ARGUMENT, "batch_size"),
        (dict(start_offset=N_ROWS + 1), grpc.StatusCode.INVALID_ARGUMENT, "outside the epoch"),
        (dict(shuffle=pb.Shuffle(mode="bogus")), grpc.StatusCode.INVALID_ARGUMENT, "unknown shuffle mode"),
        (dict(dataset="ghost@1"), grpc.StatusCode.NOT_FOUND, "ghost"),
        (dict(dataset="bad name"), grpc.StatusCode.INVALID_ARGUMENT, "invalid dataset name"),
        (dict(fingerprint="0" * 64), grpc.StatusCode.FAILED_PRECONDITION, "fingerprint"),
    ],
)
def test_raw_requests_get_the_right_status(endpoints: list[str], fields, code, text) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        raw_read(endpoints[0], **fields)
    assert err.value.code() == code and text in err.value.details()


def test_raw_read_resumes_at_first_step(endpoints: list[str]) -> None:
    msgs = raw_read(endpoints[0], first_step=250, batch_size=4)
    steps = [s for h, _ in msgs for s in h.steps]
    assert [s.step for s in steps] == [250, 251, 252]
    assert steps[-1].position_end == N_ROWS and msgs[-1][0].end_of_epoch


def test_the_exit_hook_cancels_every_abandoned_stream_before_it_waits_for_any(
    endpoints: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loaders iterated and never closed: the interpreter's exit hook cancels all their streams first,
    then joins their threads within one deadline in all (not one per thread, which would make an
    exit with N abandoned Loaders wait up to N times as long)."""
    from shardstream.client import prefetch

    before = set(prefetch._LIVE)
    loaders = [Loader(endpoints, "toy@1", batch_size=4, seed=s, prefetch=1) for s in range(3)]
    its = [iter(ld) for ld in loaders]  # iterated, never run to the end
    for it in its:
        next(it)
    producers = sorted(set(prefetch._LIVE) - before, key=id)
    assert len(producers) == 3
    events: list[tuple[str, int, float]] = []

    class Joins:  # the thread, with its joins on record
        def __init__(self, i: int, thread: threading.Thread) -> None:
            self.i, self.thread = i, thread

        def join(self, timeout: float | None = None) -> None:
            events.append(("join", self.i, timeout or 0.0))
            self.thread.join(timeout)

        def is_alive(self) -> bool:
            return self.thread.is_alive()

    for i, p in enumerate(producers):
        cancel = p.cancel
        monkeypatch.setattr(p, "cancel", lambda i=i, cancel=cancel: (events.append(("cancel", i, 0.0)), cancel()))
        monkeypatch.setattr(p, "_thread", Joins(i, p._thread))
    prefetch._stop_live_producers()
    kinds = [e[0] for e in events]
    assert kinds == ["cancel"] * 3 + ["join"] * 3, events
    assert all(0 < e[2] <= prefetch._EXIT_JOIN_S for e in events[3:])
    assert not any(p._thread.is_alive() for p in producers) and not set(producers) & set(prefetch._LIVE)
    for ld in loaders:  # their own close afterwards is harmless
        ld.close()


def test_the_exit_hook_waits_for_a_stream_still_opening(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DoGet still in Flight's C++ at exit (a stream opened just before its Loader was abandoned):
    the exit hook waits for it within its deadline, as for the prefetch threads, since its thread
    asking for the GIL back during finalization can abort the process."""
    from shardstream.client import prefetch
    from shardstream.client.transport import flight_call

    entered, release = threading.Event(), threading.Event()

    class Reader:
        def cancel(self) -> None:
            pass

    class Client:  # a DoGet the server answers only when the test says so
        def do_get(self, ticket: object, options: object) -> Reader:
            entered.set()
            release.wait(30)
            return Reader()

    call = flight_call.FlightCall(Client(), b"ticket", None)  # type: ignore[arg-type]
    assert entered.wait(30)
    (opener,) = [t for t in flight_call.opening() if t.is_alive()]
    monkeypatch.setattr(prefetch, "_EXIT_JOIN_S", 30.0)
    hook = threading.Thread(target=prefetch._stop_live_producers)
    hook.start()
    hook.join(0.2)
    assert hook.is_alive() and opener.is_alive()  # waiting for the DoGet
    release.set()
    hook.join(30)
    assert not hook.is_alive() and not opener.is_alive() and opener not in flight_call.opening()
    call.cancel()

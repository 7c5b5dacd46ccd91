"""Loader(streams=K): a rank read over K streams striped by step delivers exactly what one stream does.

Same steps in the same order, same bytes, same provenance, same cursor after every batch, same
dropped counts — across world sizes, batch sizes, shuffle modes, drop_last, epochs, resume and
a server killed mid-epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from shardstream.client import Loader, striped
from shardstream.client.decode import decode_message
from shardstream.client.prefetch import AHEAD_STEPS
from shardstream.client.transport.fleet import Fleet
from shardstream.errors import InvalidArgumentError
from shardstream.v1 import shardstream_pb2 as pb

from .support.data import N_ROWS
from .support.resume import as_json, check_resume
from .support.servers import unused_port


def observed(ld: Loader) -> Iterator[Any]:
    """Everything a training loop can observe, batch by batch."""
    for batch in ld:
        info = ld.last_batch
        assert info is not None
        yield (
            info.epoch,
            info.step,
            info.position_start,
            info.position_end,
            {k: (v.dtype.str, v.shape, v.tolist()) for k, v in batch.items()},
            info.shards.tolist(),
            info.rows.tolist(),
            ld.state_dict(),
        )


def trace(
    endpoints: list[str], state: dict[str, Any] | None = None, steps: int | None = None, **kw: Any
) -> Any:
    out = []
    with Loader(endpoints, "toy@1", provenance=True, **kw) as ld:
        if state is not None:
            ld.load_state_dict(state)
        for seen in observed(ld):
            out.append(seen)
            if steps is not None and len(out) == steps:
                break
        return out, dict(ld.dropped)


class Observed:
    """A Loader whose items are what `observed` sees: a component for the resume harness."""

    def __init__(self, endpoints: list[str], **kw: Any) -> None:
        self.loader = Loader(endpoints, "toy@1", provenance=True, **kw)

    def __enter__(self) -> Observed:
        self.loader.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loader.__exit__(*exc)

    def __iter__(self) -> Iterator[Any]:
        return observed(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


@pytest.mark.parametrize(
    "world,batch,shuffle,drop_last",
    [
        (1, 7, "none", False),
        (3, 5, "block", False),
        (2, 32, "full", True),
        (5, 100, "block", False),
        (2, 600, "none", False),
    ],
)
@pytest.mark.parametrize("streams", [2, 3])
def test_striped_streams_deliver_exactly_what_one_stream_does(
    endpoints: list[str], world: int, batch: int, shuffle: str, drop_last: bool, streams: int
) -> None:
    for rank in range(world):
        kw = dict(
            batch_size=batch, rank=rank, world_size=world, shuffle=shuffle, drop_last=drop_last, epochs=2
        )
        one = trace(endpoints, **kw)
        assert trace(endpoints, streams=streams, max_message_bytes=1 if rank % 2 else 0, **kw) == one


def test_striped_resume_mid_epoch(endpoints: list[str]) -> None:
    kw: dict[str, Any] = dict(batch_size=9, world_size=2, rank=1, shuffle="block", seed=5, epochs=2)
    # Saved from 2 streams, resumed over 3, at 0, mid-epoch, at each epoch's end (57 steps an epoch):
    # everything observed but `step`, which counts from where the stream started (client/batch.py),
    # so a resumed stream numbers its steps from 0 (the positions say which global step it is).
    res = check_resume(
        lambda: Observed(endpoints, streams=2, **kw),
        cuts=[37, 80],
        epochs=2,
        remake=lambda: Observed(endpoints, streams=3, **kw),
        item=lambda seen: seen[:1] + seen[2:],
        checkpoint=as_json,
    )
    assert res.cuts == [0, 37, 57, 80, 114]
    state = res.full[36][-1]
    assert res.states[37] == state  # the state a training loop sees after the 37th batch
    assert trace(endpoints, state=state, streams=3, **kw) == trace(endpoints, state=state, **kw)


def test_striped_streams_fail_over(server_factory) -> None:  # type: ignore[no-untyped-def]
    a, b = server_factory(), server_factory()
    dead = f"127.0.0.1:{unused_port()}"
    kw = dict(batch_size=5, seed=3, shuffle="block")
    with Loader([b.target], "toy@1", **kw) as ref:
        expected = np.concatenate([x["id"] for x in ref]).tolist()
    # Stream 1 starts on a dead endpoint; server a is killed mid-epoch: both streams move on.
    with Loader([a.target, dead, b.target], "toy@1", streams=2, prefetch=2, max_message_bytes=1, **kw) as ld:
        it = iter(ld)
        got = [next(it)["id"] for _ in range(10)]
        a.kill()
        got += [x["id"] for x in it]
    ids = np.concatenate(got).tolist()
    assert ids == expected and sorted(ids) == list(range(N_ROWS))


@pytest.mark.parametrize("message_bytes", [1, 2000])  # a step a message; several, the epoch's last ones short
def test_the_next_epochs_streams_are_opened_before_the_epoch_ends(
    endpoints: list[str], monkeypatch: pytest.MonkeyPatch, message_bytes: int
) -> None:
    """Make before break (client/striped.py): epoch 1's K streams are all opened while the rank still
    has AHEAD_STEPS steps and a message's span (its steps x K) of epoch 0 to read — their servers
    plan them and build their first messages meanwhile — and the read is still every sample once an
    epoch, in order."""
    events: list[tuple[str, int, int]] = []
    open_read = Fleet.open_read
    spans: list[int] = []  # the rank's steps each message of epoch 0 reaches over

    def recorded(self: Fleet, endpoint: str, request: pb.ReadRequest, timeout_s: float | None = None) -> Any:
        events.append(("open", int(request.epoch), int(request.first_step)))
        return open_read(self, endpoint, request, timeout_s)

    def measured(spec: Any, epoch: int, layout: Any, first: int, stride: int, header: pb.ReadHeader, rows: Any) -> Any:
        if epoch == 0:
            spans.append(len(header.steps) * stride)
        return decode_message(spec, epoch, layout, first, stride, header, rows)

    monkeypatch.setattr(Fleet, "open_read", recorded)
    monkeypatch.setattr(striped, "decode_message", measured)
    k, steps = 2, -(-N_ROWS // 8)
    got: list[int] = []
    with Loader(endpoints, "toy@1", batch_size=8, shuffle="none", epochs=2, streams=k, output="arrow",
                columns=["id"], max_message_bytes=message_bytes, prefetch=1) as loader:  # fmt: skip
        for b in loader:
            assert loader.last_batch is not None
            events.append(("got", loader.last_batch.epoch, loader.last_batch.step))
            got += b.column("id").to_pylist()
    assert got == list(range(N_ROWS)) * 2
    opens = [e for e in events if e[0] == "open"]
    assert sorted(opens) == [("open", e, j) for e in (0, 1) for j in range(k)]  # K streams an epoch, no retry
    assert message_bytes == 1 or max(spans) > k, spans
    before = events.index(("got", 0, steps - AHEAD_STEPS - max(spans)))
    assert all(events.index(("open", 1, j)) < before for j in range(k)), (events, spans)


def test_streams_must_be_a_positive_integer() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="streams"):
            Loader(["127.0.0.1:1"], "toy", batch_size=1, streams=bad)  # type: ignore[arg-type]

"""A stream's message target grows while the server's buffer budget has room (message_steps.py
`grown_target`, data_plane.py): gathered streams that named no size get messages of several large
steps, the same steps and rows as at the default; the budget still holds every stream's messages;
a client's own `max_message_bytes` is kept. In the stored order a message is cut at its row group's
end, so a larger target never makes one straddle two row groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.client import Loader
from shardstream.ipc import read_ipc
from shardstream.server.backends.roots import open_registry
from shardstream.server.read.build import MessageBuilder
from shardstream.server.read.message_steps import GROWN_MESSAGE_BYTES, MessageSteps, grown_target
from shardstream.server.read.plan import DEFAULT_MAX_MESSAGE_BYTES, ReadPlanner
from shardstream.server.read.reader import new_row_group_cache
from shardstream.v1 import shardstream_pb2 as pb

from .support.data import write_dataset
from .support.doget import wire_messages_on
from .support.servers import Servers
from .support.stalls import write_blobs

MIB = 1 << 20


@settings(max_examples=300, deadline=None)
@given(
    target=st.integers(1, 16 * MIB),
    cap=st.integers(1, 128 * MIB),
    budget=st.integers(1, 4 << 30),
    streams=st.integers(0, 5000),
)
def test_the_grown_target_stays_within_the_budget_the_cap_and_its_bounds(
    target: int, cap: int, budget: int, streams: int
) -> None:
    got = grown_target(target, cap, budget, streams)
    assert got >= target  # never under the default
    if got > target:  # grown: within the cap and the largest size, every stream's messages within the budget
        assert got <= min(cap, GROWN_MESSAGE_BYTES)
        assert 4 * max(1, streams) * got <= budget
    assert grown_target(target, cap, budget, streams + 1) <= got  # more streams, never larger


@pytest.fixture(scope="module")
def planner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReadPlanner]:
    root = tmp_path_factory.mktemp("target") / "root"
    write_dataset(root, "toy", 997, row_group_rows=50, shard_rows=300)
    with open_registry(str(root)) as registry:
        yield ReadPlanner(registry, new_row_group_cache(64 << 20))


def _request(mode: str, **kw: object) -> pb.ReadRequest:
    return pb.ReadRequest(
        dataset="toy@1", seed=5, epoch=1, shuffle=pb.Shuffle(mode=mode), rank=1, world_size=3, batch_size=23, **kw
    )


def test_streams_that_named_no_size_grow(planner: ReadPlanner) -> None:
    assert planner.plan(_request("block")).target_grows
    assert planner.plan(_request("full")).target_grows
    assert planner.plan(_request("none")).target_grows  # cut at row-group ends (build.py `_in_group`)
    assert not planner.plan(_request("full", max_message_bytes=4096)).target_grows  # the client's own size


@pytest.mark.parametrize("mode", ["block", "full", "none"])
@pytest.mark.parametrize("targets", [[700], [20_000], [1, 50_000, 2_000, 10**9, 3_000]])
def test_a_grown_target_makes_larger_messages_of_the_same_steps_and_rows(
    planner: ReadPlanner, mode: str, targets: list[int]
) -> None:
    """Messages sized for any target, changed between any builds, carry the default stream's steps,
    in order, with the same rows and provenance."""
    plan = planner.plan(_request(mode, max_message_bytes=1200))  # ~2 steps of 23 rows a message
    builder = MessageBuilder()

    def stream(set_target: bool) -> tuple[list[int], pa.Table, int]:
        builds = 0

        def before(steps: MessageSteps) -> None:
            nonlocal builds
            if set_target:
                steps.target = targets[builds % len(targets)]
            builds += 1

        messages = [m for built in builder.builds(plan, before) for m in built]
        steps = [s.step for m in messages for s in m.header.steps]
        rows = pa.Table.from_batches([m.batch for m in messages])
        return steps, rows, len(messages)

    want_steps, want_rows, want_messages = stream(False)
    got_steps, got_rows, got_messages = stream(True)
    assert got_steps == want_steps == list(range(len(want_steps)))
    assert got_rows.equals(want_rows)
    if min(targets) >= 20_000:  # (the default's messages hold ~2 steps; these ~20 and more)
        assert got_messages < want_messages / 4


# --- against real servers ------------------------------------------------------------------------
ROWS, ROW_BYTES, BATCH = 256, 64 << 10, 16  # 1 MiB steps: one a message at the default 2 MiB target


@pytest.fixture(scope="module")
def blobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("target-blobs") / "root"
    write_blobs(root, "blobs", ROWS, ROW_BYTES)
    return root


def _steps_per_message(
    server_data_port: int, mode: str, batch: int = BATCH, **kw: object
) -> tuple[list[int], list[int]]:
    """(steps a message, ids) of a plain Flight client's read of rank 0 of 1's epoch."""
    request = pb.ReadRequest(
        dataset="blobs@1", seed=1, epoch=0, shuffle=pb.Shuffle(mode=mode), world_size=1, batch_size=batch, **kw
    )
    messages = wire_messages_on(server_data_port, request)
    per = [len(pb.ReadHeader.FromString(header).steps) for header, _ in messages]
    ids = [i for _, rows in messages for i in read_ipc(pa.py_buffer(rows)).column("id").to_pylist()]
    return per, ids


def test_a_server_with_room_sends_several_large_steps_a_message_and_one_without(blobs: Path) -> None:
    with Servers(blobs) as servers:
        roomy = servers.start()
        tight = servers.start(extra_args=("--stream-buffer-mib", "8"))  # 8 MiB / 4: the default 2 MiB
        with Loader([roomy.target], "blobs@1", batch_size=BATCH, shuffle="block", seed=1, output="numpy",
                    world_size=1, rank=0, epochs=1) as ld:
            want = [int(i) for b in ld for i in b["id"]]
        assert sorted(want) == list(range(ROWS))

        grown, ids = _steps_per_message(roomy.info()["data_port"], "block")
        assert ids == want
        assert grown[0] == 1 and max(grown) >= 4  # the first alone (a quick first batch), then ~7 a message
        assert sum(grown) == ROWS // BATCH

        kept, ids = _steps_per_message(tight.info()["data_port"], "block")
        assert ids == want and kept == [1] * (ROWS // BATCH)

        asked, ids = _steps_per_message(
            roomy.info()["data_port"], "block", max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES
        )
        assert ids == want and asked == [1] * (ROWS // BATCH)  # the client's size is kept

        stored, ids = _steps_per_message(roomy.info()["data_port"], "none")
        assert ids == list(range(ROWS))
        assert stored == [1] * (ROWS // BATCH)  # a row group (16 rows) is a step: a message each

        # steps of 4 rows (256 KiB), 4 a row group: the first alone, then the rest of its row group,
        # then a row group a message, never two (a message straddling them would be copied)
        stored, ids = _steps_per_message(roomy.info()["data_port"], "none", batch=4)
        assert ids == list(range(ROWS))
        assert stored == [1, 3] + [4] * (ROWS // 16 - 1)

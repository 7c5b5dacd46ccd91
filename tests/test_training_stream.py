"""TrainingStream (client/integrations/handover.py), what both framework integrations stand on: its
state is the position after the last batch handed to the training step, whatever was read ahead.
Through the session's real servers, in this process (torch only)."""

from __future__ import annotations

from typing import Any

import pytest

from shardstream.client import Loader
from shardstream.client.integrations.handover import TrainingStream
from shardstream.errors import InvalidArgumentError

torch = pytest.importorskip("torch")

KW: dict[str, Any] = {"batch_size": 6, "columns": ["id"], "epochs": None, "seed": 11}


def _ids(batch: dict[str, Any]) -> list[int]:
    return [int(i) for i in batch["id"]]


def _reference(endpoints: list[str], n: int) -> list[list[int]]:
    with Loader(endpoints, "toy@1", **KW) as loader:
        it = iter(loader)
        return [_ids(next(it)) for _ in range(n)]


@pytest.mark.parametrize("read_ahead", [0, 1, 3])
@pytest.mark.parametrize("handed", [0, 1, 170])  # 170 steps of 6: past the end of the first epoch (1009 rows)
def test_the_state_resumes_after_the_last_batch_handed_over(
    endpoints: list[str], handed: int, read_ahead: int
) -> None:
    expected = _reference(endpoints, handed + read_ahead + 2)
    stream = TrainingStream(endpoints, "toy@1", **KW)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=0)
    it = iter(loader)
    got = [_ids(next(it)) for _ in range(handed + read_ahead)]
    for _ in range(handed):
        stream.handed_over()
    assert stream.read_ahead == read_ahead
    state = stream.state_dict()
    stream.close()

    resumed = TrainingStream(endpoints, "toy@1", **KW)
    resumed.load_state_dict(state)
    first = _ids(next(iter(torch.utils.data.DataLoader(resumed, batch_size=None))))
    resumed.close()
    assert got == expected[: handed + read_ahead]
    assert first == expected[handed]  # the batch after the last one trained, not after the last one read


def test_a_new_pass_continues_from_the_cursor(endpoints: list[str]) -> None:
    expected = _reference(endpoints, 5)
    stream = TrainingStream(endpoints, "toy@1", **KW)
    it = iter(stream)
    assert [_ids(next(it)) for _ in range(3)] == expected[:3]
    stream.handed_over()
    stream.handed_over()  # the third was read ahead and never trained
    it.close()  # (an abandoned pass closes its Loader when collected; here at once)
    again = iter(stream)  # a framework's next epoch, or a pass after close()
    assert _ids(next(again)) == expected[2]
    stream.handed_over()
    stream.close()  # keeps the position
    assert _ids(next(iter(stream))) == expected[3]
    stream.close()


def test_misuse_is_refused_in_one_line(endpoints: list[str]) -> None:
    with pytest.raises(InvalidArgumentError, match="job"):
        TrainingStream(endpoints, "toy@1", job="j", cursor_store="memory://", **KW)
    with pytest.raises(ValueError):
        TrainingStream(endpoints, "toy@1", batch_size=0)  # the Loader's own checks, before any network call
    stream = TrainingStream(endpoints, "toy@1", **KW)
    with pytest.raises(RuntimeError, match="no batch read"):
        stream.handed_over()
    stream.close()

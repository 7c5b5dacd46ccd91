"""A job's step time, explained: what each rank's cursor record carries after a real run.

Two ranks of a balanced job (balance={"cost": "id"}) read from a real server with a checkpoint root and
commit twice; rank 0 saves a checkpoint (Checkpointer.save with loader=) between the commits. Each
record's "timings" say the steps since the previous commit, the time waited for data, the mean cost
ratio of those steps (what the Loader handed over says it) and the checkpoint stall (the save's
handle says it). Records without timings, or with malformed ones, still read (and resume).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardstream.client import CursorRecord, Loader, open_store
from shardstream.client.checkpoint import Checkpointer
from shardstream.viz.step_time import explain

from .support.data import N_ROWS, write_dataset
from .support.servers import Servers


def test_each_ranks_record_carries_its_step_time_since_the_previous_commit(tmp_path: Path) -> None:
    root = tmp_path / "registry"
    write_dataset(root, "toy", N_ROWS)
    (tmp_path / "ck").mkdir()
    store = f"sqlite:///{tmp_path / 'cursors.db'}"
    kw = dict(batch_size=4, world_size=2, seed=3, job="timed", cursor_store=store, balance={"cost": "id"})
    ratios: dict[int, list[list[float]]] = {0: [[], []], 1: [[], []]}
    with Servers(root) as servers:
        server = servers.start(extra_args=("--checkpoint-root", str(tmp_path / "ck")))
        loaders = [Loader([server.target], "toy@1", rank=r, **kw) for r in range(2)]  # type: ignore[arg-type]
        try:
            with Checkpointer([server.target], job="timed", rank=0, world_size=1) as ck:
                its = [iter(loader) for loader in loaders]
                for interval, steps in enumerate((3, 5)):
                    for _ in range(steps):
                        for r, it in enumerate(its):
                            next(it)
                            info = loaders[r].last_batch
                            assert info is not None and info.step_cost > 0
                            ratios[r][interval].append(info.cost * 2 / info.step_cost)
                    if interval == 1:
                        handle = ck.save(
                            8, {"w": np.zeros(4096, np.float32)}, loader=loaders[0], blocking=True
                        )
                    for loader in loaders:
                        loader.commit(3 + 5 * interval, wait=True)
        finally:
            for loader in loaders:
                loader.close()
    st = open_store(store)
    try:
        records = {
            step: {r: CursorRecord.from_bytes(raw, where="test") for r, raw in st.read("timed", step).items()}
            for step in (3, 8)
        }
    finally:
        st.close()
    for step, interval, steps in ((3, 0, 3), (8, 1, 5)):
        for r in range(2):
            t = records[step][r].timings
            assert t is not None, (step, r)
            assert t.steps == steps
            assert 0 < t.data_wait_s <= t.interval_s
            assert t.cost_ratio == pytest.approx(float(np.mean(ratios[r][interval])), rel=1e-5)
            saved = r == 0 and step == 8
            assert t.checkpoints == (1 if saved else 0)
            assert t.checkpoint_stall_s == (pytest.approx(handle.stall_s, abs=1e-6) if saved else 0.0)
    # explained per rank: the rank with the larger share waits for nobody, the other for it
    for step in (3, 8):
        explained = dict(explain([rec.describe() for rec in records[step].values()]))
        top = max(explained, key=lambda r: explained[r].cost_ratio)  # type: ignore[arg-type, return-value]
        for r, e in explained.items():
            assert e is not None
            assert e.slowest_wait_s == (
                0.0
                if r == top
                else pytest.approx(
                    (explained[top].cost_ratio - e.cost_ratio) / explained[top].cost_ratio * e.step_s  # type: ignore[operator]
                )
            )
            assert e.rest_s >= 0 and e.step_s == pytest.approx(records[step][r].timings.interval_s / e.steps)  # type: ignore[union-attr]


def test_a_record_without_timings_or_with_malformed_ones_still_reads() -> None:
    from shardstream.client.loader_state import LoaderState
    from shardstream.client.step_timings import StepTimings

    state = LoaderState("toy@1", "f" * 16, 0, "full", 0, 12, 2, 2, 3)
    old = CursorRecord("j", 1, 3, state, 1.0)
    raw = json.loads(old.to_bytes())
    assert "timings" not in raw  # a record without them is written as before
    assert CursorRecord.from_bytes(old.to_bytes(), where="t").timings is None
    assert "timings" not in old.describe()
    t = StepTimings(
        interval_s=2.0, steps=4, data_wait_s=0.5, checkpoint_stall_s=0.25, checkpoints=1, cost_ratio=1.2
    )
    new = CursorRecord.from_bytes(CursorRecord("j", 1, 3, state, 1.0, timings=t).to_bytes(), where="t")
    assert new.timings == t and new.state == state
    for bad in ({"steps": -1, "interval_s": 1, "data_wait_s": 0}, "x", {"interval_s": float("nan")}):
        raw["timings"] = bad
        assert CursorRecord.from_bytes(json.dumps(raw).encode(), where="t").timings is None
    # the page's reading: nothing recorded is None, a rank without balance has no slowest-rank estimate
    plain = StepTimings(interval_s=2.0, steps=4, data_wait_s=0.5).to_dict()
    assert explain([{"rank": 0}, {"rank": 1, "timings": plain}]) == [
        (0, None),
        (1, explain([{"rank": 1, "timings": plain}])[0][1]),
    ]
    ((_, e),) = explain([{"rank": 1, "timings": plain}])
    assert (
        e is not None
        and e.slowest_wait_s is None
        and e.step_s == 0.5
        and e.data_wait_s == 0.125
        and e.rest_s == 0.375
    )

"""`shardstream view` and its data source: what the panes show is what a Loader received.

A real server process over a registry with one dataset per modality (tests/support/viz_data.py,
real media that installed packages ship); the textual app driven by `App.run_test()`.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from shardstream.client import Loader
from shardstream.registry import Registry
from shardstream.viz.query import StepQuery, step_of
from shardstream.viz.source import DataSource
from shardstream.viz.tui.step_screen import SamplePane, StepScreen
from shardstream.viz.tui.tui_app import DatasetsScreen, VersionsScreen, ViewApp

from .support.servers import Servers
from .support.viz_data import MIXTURE, make_viz_registry

PACK = json.dumps([{"op": "text.tokenize", "column": "text"}, {"op": "text.pack", "column": "text", "seq_len": 96}])
DECODE = json.dumps([{"op": "image.decode", "column": "image", "size": [48, 40], "crop": "random", "hflip": True}])
AUDIO = json.dumps([{"op": "audio.decode", "column": "audio", "sample_rate": 8000, "seconds": 0.5}])
VIDEO = json.dumps([{"op": "video.frames", "column": "video", "num_frames": 4, "stride": 3, "size": [24, 32]}])
RL = json.dumps([{"op": "rl.windows", "window": 12, "stride": 8, "n_step": 2, "gamma": 0.9}])


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataSource]:
    root = make_viz_registry(tmp_path_factory.mktemp("viz") / "root")
    with Servers(root) as servers:
        server = servers.start()
        with DataSource([server.target], registry=Registry(root)) as src:
            yield src


def loader_step(src: DataSource, q: StepQuery) -> tuple[dict[str, Any], Any]:
    """The batch (and its BatchInfo) a Loader streaming epoch q.epoch from its start hands over at q.step."""
    kwargs = q.loader_kwargs()
    with Loader(src.endpoints, q.dataset, **kwargs, epochs=q.epoch + 1, prefetch=2) as loader:
        if q.epoch:
            loader.load_state_dict({**src.loader_state(q), "offset": 0, "steps": 0})
        for i, batch in enumerate(loader):
            if i == q.step:
                return batch, loader.last_batch
    raise AssertionError(f"the Loader ended before step {q.step}")


def assert_same(got: dict[str, np.ndarray], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for name, value in want.items():
        if value.dtype == object:
            assert [np.asarray(v).tolist() for v in got[name]] == [np.asarray(v).tolist() for v in value], name
        else:
            np.testing.assert_array_equal(got[name], value, err_msg=name)


# --- the data source ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dataset", "transforms", "world", "batch", "rank", "step", "epoch"),
    [
        ("text@1", "", 3, 4, 2, 3, 0),
        ("text@1", PACK, 2, 5, 1, 4, 1),
        ("photos@1", DECODE, 4, 3, 3, 2, 0),
        ("episodes@1", RL, 2, 3, 1, 5, 0),
        (MIXTURE, "", 2, 4, 1, 6, 0),
        ("notes@2", "", 5, 2, 4, 5, 0),  # the epoch's short last step
    ],
)
def test_a_step_is_what_a_loader_streamed_from_zero_received(
    source: DataSource, dataset: str, transforms: str, world: int, batch: int, rank: int, step: int, epoch: int
) -> None:
    label = source.target(StepQuery(dataset)).label
    q = StepQuery(label, world_size=world, batch_size=batch, rank=rank, step=step, epoch=epoch, transforms=transforms)
    sb = source.read_step(q)
    want, info = loader_step(source, q)
    assert_same(sb.arrays, want)
    np.testing.assert_array_equal(sb.info.shards, info.shards)
    np.testing.assert_array_equal(sb.info.rows, info.rows)
    assert (sb.info.position_start, sb.info.position_end) == (info.position_start, info.position_end)
    if info.sources is not None:
        np.testing.assert_array_equal(sb.info.sources, info.sources)


def test_the_loader_state_of_a_step_resumes_a_loader_there(source: DataSource) -> None:
    q = StepQuery("photos@1", world_size=2, batch_size=4, rank=1, step=3, transforms=DECODE)
    with Loader(source.endpoints, q.dataset, **q.loader_kwargs()) as loader:
        loader.load_state_dict(source.loader_state(q))
        first = next(iter(loader))
    assert_same(source.read_step(q).arrays, first)


def test_a_step_past_the_epoch_is_refused_naming_the_steps(source: DataSource) -> None:
    with pytest.raises(ValueError, match=r"text@1 has 6 steps"):
        source.read_step(StepQuery("text@1", step=6))


# --- the terminal app -----------------------------------------------------------------------------
async def settle(pilot: Any, screen: StepScreen, timeout_s: float = 60.0) -> None:
    """Wait until the step screen has shown what it was reading (a condition, not a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    await pilot.pause()
    while screen.pending:
        assert time.monotonic() < deadline, "the step screen never showed its step"
        await asyncio.sleep(0.02)
        await pilot.pause()


def shown(screen: StepScreen) -> tuple[list[dict[str, Any]], list[str]]:
    panes = list(screen.query(SamplePane))
    texts = []
    for pane in panes:
        console = Console(width=220, record=True, file=io.StringIO(), color_system=None)
        console.print(pane.drawn)
        texts.append(console.export_text())
    return [p.summary for p in panes], texts


def expected(source: DataSource, q: StepQuery) -> dict[str, Any]:
    batch, info = loader_step(source, q)
    return {"batch": batch, "info": info, "rows": len(next(iter(batch.values())))}


MODALITIES = [
    ("text@1", PACK, "packed"),
    ("photos@1", DECODE, "image"),
    ("sounds@1", AUDIO, "audio"),
    ("clips@1", VIDEO, "video"),
    ("episodes@1", RL, "rl"),
]


@pytest.mark.parametrize(("dataset", "transforms", "kind"), MODALITIES)
def test_the_step_browser_shows_what_a_loader_received(
    source: DataSource, dataset: str, transforms: str, kind: str
) -> None:
    start = StepQuery(dataset, world_size=2, batch_size=2, rank=0, step=1, transforms=transforms)

    async def run() -> None:
        app = ViewApp(source, start)
        async with app.run_test(size=(200, 60)) as pilot:
            screen = app.screen
            assert isinstance(screen, StepScreen)
            for key, q in (
                (None, start),
                ("right", start.moved(step=2)),
                ("down", start.moved(step=2, rank=1)),
                ("left", start.moved(step=1, rank=1)),
            ):
                if key:
                    await pilot.press(key)
                await settle(pilot, screen)
                assert screen.step_query == q
                summaries, texts = shown(screen)
                want = expected(source, q)
                batch = want["batch"]
                assert len(summaries) == want["rows"]
                for row, (summary, text) in enumerate(zip(summaries, texts, strict=True)):
                    assert f"#{row}  {dataset}" in text
                    assert f"row {int(want['info'].rows[row])}" in text
                    check_pane(kind, batch, row, summary, text)

    asyncio.run(run())


def check_pane(kind: str, batch: dict[str, Any], row: int, summary: dict[str, Any], text: str) -> None:
    if kind == "packed":
        tokens = int((batch["document_ids"][row] >= 0).sum())
        assert summary["tokens"] == tokens
        assert f"input_ids: {tokens} tokens of 96" in text
    elif kind == "image":
        shape = tuple(batch["image"].shape[1:])
        assert summary["id"] == int(batch["id"][row]) and summary["image"] == shape
        assert "image: 48 x 40 x 3 uint8" in text and "▀" in text
    elif kind == "audio":
        assert summary["id"] == int(batch["id"][row])
        assert summary["audio"] == (int(batch["audio_length"][row]), 8000)
        assert f"4000 samples ({int(batch['audio_length'][row])} real) at 8000 Hz = 0.500 s" in text
    elif kind == "video":
        assert summary["id"] == int(batch["id"][row]) and summary["video"] == (4, 24, 32, 3)
        assert f"video: 4 frames ({int(batch['video_frames'][row])} real) of 24 x 32" in text
    elif kind == "rl":
        valid = int(batch["valid"][row].sum())
        assert summary["valid_steps"] == valid
        assert f"{valid} steps of episode {int(batch['episode_id'][row])} from t={int(batch['t0'][row])}" in text


def test_datasets_versions_then_steps_and_the_keys(source: DataSource) -> None:
    async def run() -> None:
        app = ViewApp(source, defaults={"world_size": 4, "batch_size": 2})
        async with app.run_test(size=(200, 60)) as pilot:
            await pilot.pause()
            assert isinstance(app.screen, DatasetsScreen)
            table = app.screen.query_one("#datasets")
            names = [str(k.value) for k in table.rows]
            assert names == ["clips", "episodes", "notes", "photos", "sounds", "text"]
            table.move_cursor(row=names.index("notes"))
            await pilot.press("enter")
            await pilot.pause()
            assert isinstance(app.screen, VersionsScreen)
            detail = str(app.screen.query_one("#detail-text").render())
            assert "notes@2" in detail and "append" in detail and "rows 48 -> 56" in detail
            await pilot.press("enter")
            screen = app.screen
            assert isinstance(screen, StepScreen)
            await settle(pilot, screen)
            assert screen.step_query.dataset == "notes@2" and screen.step_query.world_size == 4
            assert "text.tokenize" in screen.step_query.transforms  # the modality's default
            await pilot.press("e")
            await settle(pilot, screen)
            assert screen.step_query.epoch == 1
            await pilot.press("slash")
            await pilot.pause()
            await pilot.press(*"@13", "enter")  # global position 13 = step 1, rank 2 (batch 2 x 4 ranks)
            await settle(pilot, screen)
            assert (screen.step_query.step, screen.step_query.rank) == (1, 2)
            await pilot.press("t")
            await pilot.pause()
            prompt = app.screen.query_one("#prompt")
            prompt.value = ""
            await pilot.press("enter")
            await settle(pilot, screen)
            assert screen.step_query.transforms == ""
            summaries, texts = shown(screen)
            want = expected(source, screen.step_query)
            assert [s["id"] for s in summaries] == want["batch"]["id"].tolist()

    asyncio.run(run())


# --- quitting, an unreachable server, the step count ----------------------------------------------
def test_q_quits_on_every_screen(source: DataSource) -> None:
    async def quit_on(depth: int) -> type:
        app = ViewApp(source, defaults={"batch_size": 2})
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.pause()
            for _ in range(depth):  # datasets -> versions -> steps
                await pilot.press("enter")
                await pilot.pause()
            screen = app.screen
            if isinstance(screen, StepScreen):
                await settle(pilot, screen)
                status = str(screen.query_one("#status").render())
                assert step_of(screen.step_query.step, source.steps_in_epoch(screen.step_query)) in status
            assert app.return_code is None  # still running
            await pilot.press("q")
            await pilot.pause()
            assert app.return_code == 0, type(screen)
        return type(screen)

    screens = [asyncio.run(quit_on(depth)) for depth in range(3)]
    assert screens == [DatasetsScreen, VersionsScreen, StepScreen]


@pytest.mark.parametrize("command", ["view", "web"])
def test_an_unreachable_server_is_one_line_and_exit_1(command: str, tmp_path: Any) -> None:
    from .support.processes import run_cli
    from .support.servers import unused_port

    target = f"127.0.0.1:{unused_port()}"
    proc = run_cli(command, "--server", target, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"shardstream: error: no shardstream server reachable: {target}: nothing listens there (connection refused)"]

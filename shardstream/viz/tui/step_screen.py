"""The step browser: one rank's batch at one step, a pane per row; keys move through steps and ranks.

    ← →  step        ↑ ↓  rank        e / E  next / previous epoch
    t    edit the transforms (JSON, as Loader(transforms=...))
    /    jump: a step number, or @P for the sample at global position P
    esc  back to the versions        q  quit

A step is read in a worker thread (the fleet may take a moment); the panes show what the read
returned, and `SamplePane.summary` states it (ids, token counts, image sizes) for tests and the
status line.
"""

from __future__ import annotations

from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, Label, Static

from shardstream.errors import ShardstreamError
from shardstream.order.read_order import StepLayout

from ..catalog import Catalog
from ..query import StepQuery, step_of
from ..samples import row_summary, views
from ..source import DataSource, StepBatch
from .panes import render_row

__all__ = ["PromptScreen", "SamplePane", "StepScreen"]


class SamplePane(Static):
    """One row of the step: its provenance and its panes."""

    DEFAULT_CSS = "SamplePane { border: round $primary-background; padding: 0 1; margin: 0 0 1 0; }"

    def __init__(self, renderable: Any, summary: dict[str, Any]) -> None:
        super().__init__(renderable)
        self.drawn = renderable  # what the pane draws (a Rich renderable)
        self.summary = summary


class PromptScreen(ModalScreen[str | None]):
    """One line of input; dismissed with its text (Enter) or None (Esc)."""

    DEFAULT_CSS = "PromptScreen { align: center middle; } PromptScreen > Vertical { width: 90; height: auto; border: thick $accent; background: $surface; padding: 1; }"
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, title: str, value: str) -> None:
        super().__init__()
        self.title_text, self.value = title, value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text)
            yield Input(value=self.value, id="prompt")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class StepScreen(Screen[None]):
    BINDINGS = [
        Binding("left", "step(-1)", "step −", priority=True),
        Binding("right", "step(1)", "step +", priority=True),
        Binding("up", "rank(-1)", "rank −", priority=True),
        Binding("down", "rank(1)", "rank +", priority=True),
        Binding("e", "epoch(1)", "epoch +"),
        Binding("E", "epoch(-1)", "epoch −", show=False),
        Binding("t", "transforms", "transforms"),
        Binding("slash", "jump", "jump"),
        Binding("escape", "app.pop_screen", "back"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self, source: DataSource, catalog: Catalog, query: StepQuery) -> None:
        super().__init__()
        self.source, self.catalog, self.step_query = source, catalog, query
        self.step_batch: StepBatch | None = None
        self.steps_in_epoch = 0
        self.pending = 0

    def compose(self) -> ComposeResult:
        yield Static("", id="status")
        yield VerticalScroll(id="samples")
        yield Footer()

    def on_mount(self) -> None:
        self.show(self.step_query)

    # --- reading --------------------------------------------------------------------------------
    def show(self, query: StepQuery) -> None:
        self.pending += 1
        self.query_one("#status", Static).update(f"reading {query.describe()} …")
        self._read(query)

    @work(thread=True, exclusive=True, group="read")
    def _read(self, query: StepQuery) -> None:
        try:
            sb = self.source.read_step(query)
            result: StepBatch | str = sb
        except (ShardstreamError, ValueError) as exc:
            result = f"{type(exc).__name__}: {exc}"
        self.app.call_from_thread(self._shown, query, result)

    def _shown(self, query: StepQuery, result: StepBatch | str) -> None:
        self.pending -= 1
        status = self.query_one("#status", Static)
        if isinstance(result, str):
            status.update(f"[red]{result}[/red]\n{self.step_query.describe()}")
            return
        self.step_query, self.step_batch = query, result
        self.steps_in_epoch = result.steps_in_epoch
        box = self.query_one("#samples", VerticalScroll)
        box.remove_children()
        column_views = views(result)
        panes = []
        for row in range(result.num_rows):
            shard = self.catalog.shard_name(result.source_label(row), int(result.info.shards[row]))
            panes.append(SamplePane(render_row(result, column_views, row, shard), row_summary(result, row)))
        box.mount_all(panes)
        info = result.info
        skipped = f", {len(info.skipped)} skipped by a transform" if info.skipped else ""
        status.update(
            f"[b]{query.dataset}[/b]  epoch {query.epoch}  {step_of(query.step, self.steps_in_epoch, bool(query.cursor))}  "
            f"rank {query.rank}/{query.world_size}  batch {query.batch_size}  seed {query.seed}  "
            f"shuffle {query.shuffle_spec}\npositions [{info.position_start}, {info.position_end}) of global "
            f"[{info.global_start}, {info.global_end}); {result.num_rows} row(s){skipped}\n"
            f"transforms {query.transforms or 'none (as stored)'}"
        )

    # --- keys -------------------------------------------------------------------------------------
    def _go(self, **changes: Any) -> None:
        try:
            self.show(self.step_query.moved(**changes))
        except (ShardstreamError, ValueError) as exc:
            self.notify(str(exc), severity="error")

    def action_step(self, delta: int) -> None:
        target = self.step_query.step + delta
        if 0 <= target < max(1, self.steps_in_epoch):
            self._go(step=target)

    def action_rank(self, delta: int) -> None:
        if 0 <= self.step_query.rank + delta < self.step_query.world_size:
            self._go(rank=self.step_query.rank + delta)

    def action_epoch(self, delta: int) -> None:
        if self.step_query.epoch + delta >= 0:
            self._go(epoch=self.step_query.epoch + delta)

    def action_transforms(self) -> None:
        def apply(text: str | None) -> None:
            if text is not None:
                self._go(transforms=text.strip())

        self.app.push_screen(PromptScreen("transforms (JSON list; empty = as stored)", self.step_query.transforms), apply)

    def _locate(self, position: int) -> dict[str, int]:
        """The (step, rank) whose batch holds global position `position` (the plan's own layout)."""
        q = self.step_query
        layout = StepLayout(self.source.target(q).num_rows, 0, q.world_size, q.batch_size, q.drop_last)
        step = position // q.global_batch
        for rank in range(q.world_size):
            start, end = layout.rank_range(step, rank)
            if start <= position < end:
                return {"step": step, "rank": rank}
        raise ValueError(f"position {position} is outside the epoch's steps")

    def action_jump(self) -> None:
        def apply(text: str | None) -> None:
            if text is None or not text.strip():
                return
            text = text.strip()
            try:
                if text.startswith("@"):
                    self._go(**self._locate(int(text[1:])))
                else:
                    self._go(step=int(text.removeprefix("step").strip()))
            except ValueError:
                self.notify(f"not a step or @position: {text!r}", severity="error")

        self.app.push_screen(PromptScreen("jump to a step (e.g. 12) or the sample at a global position (@4096)", ""), apply)

"""`shardstream view`: datasets -> versions (history, diff, schema, modality) -> the step browser."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from ..catalog import Catalog, VersionRow, default_transforms
from ..query import StepQuery
from ..source import DataSource
from .step_screen import StepScreen

__all__ = ["ViewApp"]


class DatasetsScreen(Screen[None]):
    BINDINGS = [Binding("q", "app.quit", "quit")]

    def __init__(self, catalog: Catalog, defaults: dict[str, Any]) -> None:
        super().__init__()
        self.catalog, self.defaults = catalog, defaults

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="datasets", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "datasets"
        table = self.query_one(DataTable)
        table.add_columns("dataset", "latest", "modality", "rows", "shards", "fields")
        for r in self.catalog.datasets():
            table.add_row(r.name, r.ref, r.modality, f"{r.rows:,}", str(r.shards), ", ".join(n for n, _ in r.fields), key=r.name)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.app.push_screen(VersionsScreen(self.catalog, str(event.row_key.value), self.defaults))


class VersionsScreen(Screen[None]):
    """Every version of a dataset; the highlighted one's schema, modality, lineage and diff."""

    BINDINGS = [Binding("escape", "app.pop_screen", "back"), Binding("q", "app.quit", "quit")]
    DEFAULT_CSS = "#versions { width: 50%; } #detail { width: 50%; padding: 0 1; }"

    def __init__(self, catalog: Catalog, name: str, defaults: dict[str, Any]) -> None:
        super().__init__()
        self.catalog, self.dataset, self.defaults = catalog, name, defaults
        self.rows: dict[str, VersionRow] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield DataTable(id="versions", cursor_type="row")
            with VerticalScroll(id="detail"):
                yield Static(id="detail-text")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"{self.dataset}: versions (enter: browse steps)"
        table = self.query_one(DataTable)
        table.add_columns("version", "parent", "change", "rows", "created", "tags")
        for r in self.catalog.versions(self.dataset):
            self.rows[r.ref] = r
            table.add_row(r.ref, str(r.parent or ""), r.change, f"{r.rows:,}", r.created[:19], ", ".join(r.tags), key=r.ref)

    def detail(self, r: VersionRow) -> Text:
        out = Text(f"{r.ref}\n", style="bold")
        out.append(f"modality {r.modality}; {r.rows:,} rows in {r.shards} shards ({r.bytes:,} bytes)\n")
        out.append(f"fingerprint {r.fingerprint[:16]}…\n")
        if r.change:
            out.append(f"{r.change}{f' of version {r.parent}' if r.parent else ''}  {r.created}\n")
        out.append("\nschema\n", style="bold")
        for n, t in r.fields:
            out.append(f"  {n}: {t}\n")
        if r.parent:
            d = self.catalog.diff(f"{r.name}@{r.parent}", r.ref)
            out.append(f"\ndiff from {d['old']}\n", style="bold")
            out.append(f"  change {d['change']}; rows {d['rows_before']:,} -> {d['rows_after']:,}; shards "
                       f"+{len(d['shards_added'])} -{len(d['shards_removed'])}\n")
            for key, sign in (("fields_added", "+"), ("fields_removed", "-")):
                for f in d[key]:
                    out.append(f"  {sign} {f['name']}: {f['type']}\n")
            for f in d["fields_renamed"]:
                out.append(f"  ~ {f['old']} -> {f['new']}\n")
        out.append(f"\nopens with transforms: {default_transforms(r) or 'none (as stored)'}\n", style="italic")
        return out

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        row = self.rows.get(str(event.row_key.value))
        if row is not None:
            self.query_one("#detail-text", Static).update(self.detail(row))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        row = self.rows[str(event.row_key.value)]
        query = StepQuery(row.ref, transforms=default_transforms(row), **self.defaults)
        self.app.push_screen(StepScreen(self.catalog.source, self.catalog, query))


class ViewApp(App[None]):
    """The terminal visualizer over a DataSource; `start` opens the step browser at once."""

    TITLE = "shardstream view"

    def __init__(self, source: DataSource, start: StepQuery | None = None, defaults: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.source = source
        self.catalog = Catalog(source)
        self.start = start
        self.defaults = defaults or {}

    def on_mount(self) -> None:
        self.push_screen(DatasetsScreen(self.catalog, self.defaults))
        if self.start is not None:
            self.push_screen(StepScreen(self.source, self.catalog, self.start))

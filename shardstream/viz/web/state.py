"""What every handler of the web app reads, kept on `app.state.viz`."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.templating import Jinja2Templates

from ..catalog import Catalog
from ..fleet_status import FleetMonitor
from ..source import DataSource

__all__ = ["Viz", "viz_of"]


@dataclass
class Viz:
    """What every handler reads: the data source, the catalog, the cursor store, the fleet monitor."""

    source: DataSource
    catalog: Catalog
    store: str | None
    fleet: FleetMonitor
    templates: Jinja2Templates

    def page(self, request: Request, template: str, status_code: int = 200, **context: object) -> HTMLResponse:
        return self.templates.TemplateResponse(request, template, context, status_code=status_code)


def viz_of(request: Request) -> Viz:
    return request.app.state.viz  # type: ignore[no-any-return]

"""The web app: routes, the state its pages share, and errors shown as pages.

`create_app(source, store=...)` returns a Starlette application; `shardstream web` serves it with
uvicorn. Handlers are plain functions (Starlette runs them in its thread pool): a step read blocks on
the fleet, not the event loop.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from shardstream import __version__
from shardstream.errors import InvalidArgumentError, NotFoundError, ShardstreamError

from ..catalog import Catalog
from ..fleet_status import FleetMonitor
from ..query import step_of
from ..source import DataSource
from . import links, media, pages, step_page
from .state import Viz

__all__ = ["create_app"]

HERE = Path(__file__).parent


def create_app(source: DataSource, *, store: str | None = None) -> Starlette:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals.update(links=links, version=__version__, step_of=step_of)
    viz = Viz(source, Catalog(source), store, FleetMonitor(source.endpoints, source.metrics_urls, source.security), templates)

    async def on_error(request: Request, exc: Exception) -> Response:
        status = 404 if isinstance(exc, NotFoundError | LookupError) else 400
        if not isinstance(exc, ShardstreamError | ValueError | LookupError):
            status = 500
        return viz.page(request, "error.html", status_code=status, message=str(exc))

    routes = [
        Route("/", pages.datasets),
        Route("/d/{name}", pages.versions),
        Route("/v/{ref}", pages.version),
        Route("/diff", pages.diff),
        Route("/jobs", pages.jobs),
        Route("/jobs/{job}", pages.job),
        Route("/fleet", pages.fleet),
        Route("/step", step_page.step),
        Route("/mixture", step_page.mixture),
        Route("/stats", step_page.stats),
        Route("/m/image", media.image),
        Route("/m/original", media.original),
        Route("/m/frames", media.frames),
        Route("/m/wav", media.audio_wav),
        Route("/m/waveform", media.waveform),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={ShardstreamError: on_error, InvalidArgumentError: on_error, ValueError: on_error, LookupError: on_error},
    )
    app.state.viz = viz
    return app

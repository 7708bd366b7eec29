"""Assembles the one ASGI app: collector ingest, REST API, web dashboard, alert silences.

Each part owns a router module exposing ``router`` and, when it has background work,
``lifespan(app)`` (an async context manager). This module only wires them together, so the
parts stay independent of each other.

``create_app`` returns the FastAPI app (tests drive it with TestClient). Server processes serve
``serving_app``: the same app behind ``collector.front.IngestFront``, which answers the ingest
hot path without the FastAPI/Starlette request cycle."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import ModuleType
from typing import TYPE_CHECKING

from fastapi import FastAPI

from gpufleet import __version__
from gpufleet.settings import ServerSettings
from gpufleet.storage.db import make_engine

if TYPE_CHECKING:
    from gpufleet.collector.front import IngestFront


def _parts() -> list[ModuleType]:
    from gpufleet.alerts import routes as alert_routes
    from gpufleet.api import routes as api_routes
    from gpufleet.api import web
    from gpufleet.collector import routes as collector_routes
    from gpufleet.collector.export import routes as export_routes
    from gpufleet.collector.remote_write import routes as remote_write_routes

    # remote write and export after the API: their lifespans add counters to its /metrics registry
    return [collector_routes, api_routes, alert_routes, web, remote_write_routes, export_routes]


def create_app(settings: ServerSettings | None = None, *, extra_lifespans: list | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    url = settings.resolved_database_url()
    parts = _parts()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for part in parts:
                if hasattr(part, "lifespan"):
                    await stack.enter_async_context(part.lifespan(app))
            for extra in extra_lifespans or []:
                await stack.enter_async_context(extra(app))
            yield
        app.state.engine.dispose()

    app = FastAPI(
        title="gpufleet",
        version=__version__,
        description="GPU fleet telemetry and goodput: which jobs waste GPUs, why, how much, and what to do.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.database_url = url
    app.state.engine = make_engine(url)
    for part in parts:
        app.include_router(part.router)
    return app


def serving_app(settings: ServerSettings | None = None, *, extra_lifespans: list | None = None) -> IngestFront:
    """What a server process (``gpufleet serve``, ``gpufleet up``) hands to uvicorn: ``create_app``
    behind the ingest front. Lifespan, the API, the web UI and non-POST ingest requests reach the
    FastAPI app unchanged."""
    from gpufleet.collector.front import IngestFront

    return IngestFront(create_app(settings, extra_lifespans=extra_lifespans))


def create_app_from_env() -> IngestFront:
    """Factory for uvicorn (``--workers``): settings from GPUFLEET_* environment variables.
    Runs once in each server process, so it also applies the server's GC settings there
    (``gpufleet.gctune``)."""
    from gpufleet.gctune import tune_gc_for_server

    app = serving_app(ServerSettings())
    tune_gc_for_server()
    return app

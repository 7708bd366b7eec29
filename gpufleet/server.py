"""Assembles the one ASGI app: collector ingest, REST API, web dashboard, alert silences.

Each part owns a router module exposing ``router`` and, when it has background work,
``lifespan(app)`` (an async context manager). This module only wires them together, so the
parts stay independent of each other.

``create_app`` returns the FastAPI app (tests drive it with TestClient). Server processes serve
``serving_app``: the same app behind ``collector.front.IngestFront``, which answers the ingest
hot path without the FastAPI/Starlette request cycle."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI

from gpufleet import __version__
from gpufleet.settings import Settings
from gpufleet.storage.db import make_engine

if TYPE_CHECKING:
    from gpufleet.collector.front import IngestFront

Lifespan = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[Any]]


def _parts() -> list[ModuleType]:
    from gpufleet.alerts import routes as alert_routes
    from gpufleet.api import routes as api_routes
    from gpufleet.api import web, web_serving
    from gpufleet.api.auth import routes as auth_routes
    from gpufleet.collector import routes as collector_routes
    from gpufleet.collector import serving_routes
    from gpufleet.collector.export import routes as export_routes
    from gpufleet.collector.remote_write import routes as remote_write_routes

    # remote write and export after the API: their lifespans add counters to its /metrics registry
    return [collector_routes, serving_routes, api_routes, alert_routes, web, web_serving, remote_write_routes,
            export_routes, auth_routes]


def create_app(settings: Settings | None = None, *, extra_lifespans: list[Lifespan] | None = None) -> FastAPI:
    from gpufleet.api.schemas import Message

    settings = settings or Settings.from_env()
    url = settings.database_url()
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
        docs_url=None, redoc_url=None,  # api/web.py serves both from local assets (no CDN)
        # WebGuard (below) answers any request without an Authorization header whose Host the
        # server does not answer to: every operation can return it, so every one documents it.
        responses={421: {"model": Message, "description": "Host is not one this server answers to, and the request "
                                                          "has no Authorization header (GPUFLEET_ALLOWED_HOSTS; "
                                                          "protects against DNS rebinding)"}},
    )
    app.state.settings = settings
    app.state.database_url = url
    app.state.engine = make_engine(url)
    for part in parts:
        app.include_router(part.router)
    from gpufleet.api.auth.middleware import WebGuard
    from gpufleet.api.validation_errors import install as install_validation_errors

    install_validation_errors(app)  # a 422 that echoes hostile input must not become a 500
    from gpufleet.api.database_unavailable import install as install_database_unavailable

    install_database_unavailable(app)  # database down: a JSON 503 + Retry-After, not a 500 per request
    # Host/Origin checks, session or SSO identity, CSRF (api/auth); serving_app puts the same
    # guard ahead of the ingest front too, and it runs once per request.
    app.add_middleware(WebGuard, state_app=app)
    return app


def serving_app(settings: Settings | None = None, *, extra_lifespans: list[Lifespan] | None = None) -> IngestFront:
    """What a server process (``gpufleet serve``, ``gpufleet up``) hands to uvicorn: ``create_app``
    behind the ingest front. Lifespan, the API, the web UI and non-POST ingest requests reach the
    FastAPI app unchanged."""
    from gpufleet.api.auth.middleware import WebGuard
    from gpufleet.api.http_timeouts import BodyTimeout, ReadTimeouts
    from gpufleet.collector.front import IngestFront

    app = create_app(settings, extra_lifespans=extra_lifespans)
    # Outermost: a stalled request body gets 408 before any part waits on it (slowloris); then
    # the Host/Origin guard, for the ingest front's requests as well.
    return BodyTimeout(WebGuard(IngestFront(app), state_app=app),  # type: ignore[return-value]
                       ReadTimeouts.from_settings(app.state.settings))


def server_process_app(settings: Settings) -> IngestFront:
    """``serving_app`` for a process that does nothing else (a ``serve`` worker): also applies
    the server's GC settings to the process (``gpufleet.gctune``)."""
    from gpufleet.gctune import tune_gc_for_server

    app = serving_app(settings)
    tune_gc_for_server(settings.gc.threshold)
    return app


def create_app_from_env() -> IngestFront:
    """Factory for a plain ``uvicorn --factory gpufleet.server:create_app_from_env``: settings
    from the environment. ``gpufleet serve`` hands its own Settings to each worker instead."""
    return server_process_app(Settings.from_env())


class SettingsConfig(uvicorn.Config):
    """uvicorn's Config for a ``gpufleet serve`` process, loading the app from the Settings it
    carries. With ``--workers N`` uvicorn pickles its Config into each spawned worker, so the
    Settings travel with it (as JSON): nothing is handed over through environment variables."""

    def __init__(self, settings: Settings, **kw: Any) -> None:
        self.settings_json = settings.model_dump_json()
        # An import string: uvicorn refuses anything else with workers > 1 (never imported here).
        super().__init__("gpufleet.server:create_app_from_env", factory=True, **kw)

    def load_app(self) -> Any:
        settings = Settings.model_validate_json(self.settings_json)
        return lambda: server_process_app(settings)

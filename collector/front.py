"""``IngestFront``: the pure-ASGI app a server process serves in front of the FastAPI app.

``POST /api/v1/ingest`` is the hot path (thousands of requests per second per process). Through
FastAPI/Starlette each request pays for the middleware stack, routing, ``Request`` and
``Response`` objects (measured ~123 us of server CPU per request vs ~67 us for a bare ASGI
callable under the same uvicorn). The front answers exactly that method and path itself with
``routes.handle_ingest`` (the same core the Starlette endpoint wraps, so both answer the same),
and ``POST /api/v1/write`` (Prometheus remote write) with ``remote_write.routes.handle_write``
the same way (326 -> 191 us of CPU per 2,000-sample body), and hands everything else, lifespan
and websockets included, to the wrapped app unchanged."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.datastructures import State
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from gpufleet.collector.remote_write.routes import handle_write
from gpufleet.collector.routes import collector_for, handle_ingest, internal_error, wanted_headers

log = logging.getLogger(__name__)

INGEST_PATH = "/api/v1/ingest"
WRITE_PATH = "/api/v1/write"


_JSON = (b"content-type", b"application/json")


def _route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    # Match the route the way Starlette's router does (get_route_path): behind a root_path
    # the server may put it in front of the path, and the route is relative to it.
    if root and path.startswith(root + "/"):
        path = path[len(root):]
    return path


class IngestFront:
    """Answers ``POST /api/v1/ingest`` and ``POST /api/v1/write`` directly; delegates every
    other scope to ``app``."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        # Requests this front answered itself: lets tests (and a debugger) see that served
        # ingest traffic really bypasses the Starlette route.
        self.handled = 0
        self.handled_writes = 0  # the same for remote-write requests

    @property
    def state(self) -> State:
        """The wrapped app's state, so code holding the served app (e.g. the tests' live
        server) reaches ``state.collector`` without knowing about the front."""
        return self.app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = _route_path(scope)
            if path == INGEST_PATH:
                await self._ingest(scope, receive, send)
                return
            if path == WRITE_PATH:
                await self._write(scope, receive, send)
                return
        # other methods get FastAPI's 405, other paths its routing, lifespan its parts
        await self.app(scope, receive, send)

    async def _ingest(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.handled += 1

        def read_body() -> AsyncIterator[bytes]:
            return _BodyChunks(receive)

        try:
            status, body, extra = await handle_ingest(collector_for(self.app), wanted_headers(scope["headers"]),
                                                      read_body)
        except ClientDisconnect:
            return  # the client is gone mid-body: nobody to answer, and uvicorn closes the connection
        except Exception:
            # handle_ingest answers its own failures; this is for the front's own code (collector
            # creation, headers). Answer like the endpoint instead of dropping the connection.
            log.exception("ingest front failed")
            status, body, extra = internal_error()
        await _answer(send, status, body, extra)

    async def _write(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.handled_writes += 1
        try:
            status, body, extra = await handle_write(self.app, scope["headers"], lambda: _BodyChunks(receive),
                                                     scope.get("query_string", b""))
        except ClientDisconnect:
            return  # as for ingest: nobody left to answer
        await _answer(send, status, body, extra)


async def _answer(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    # Same header order as Starlette's Response (content-length, content-type, extra).
    headers = [(b"content-length", str(len(body)).encode("latin-1")), _JSON, *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _BodyChunks:
    """The request body from ASGI ``http.request`` messages, as Starlette's Request.stream
    reads it (ClientDisconnect on ``http.disconnect``), without creating a Request. A plain
    async iterator, not an async generator: a generator per request also registers with the
    event loop's async-generator hooks, a measurable cost at thousands of requests/s."""

    __slots__ = ("done", "receive")

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.done = False

    def __aiter__(self) -> _BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        while not self.done:
            message = await self.receive()
            kind = message["type"]
            if kind == "http.request":
                self.done = not message.get("more_body", False)
                chunk: bytes = message.get("body", b"")
                if chunk:
                    return chunk
            elif kind == "http.disconnect":
                raise ClientDisconnect()
        raise StopAsyncIteration

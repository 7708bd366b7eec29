"""Read timeouts for the HTTP server (slowloris): a client must finish its request headers within
``header_timeout_s`` of connecting (or of the previous response on a keep-alive connection), and
its body must keep arriving (``body_idle_s`` at most between chunks, and, once ``body_grace_s``
has passed, at least ``body_min_rate`` bytes/s on average).

uvicorn has neither: its keep-alive timer stops at the first byte of a request, so a client that
sends one header byte every few seconds holds a connection (and a file descriptor) for ever.

* Headers: ``TimedH11Protocol`` / ``TimedHttpToolsProtocol`` (uvicorn's own protocols plus a
  timer) close the connection when the deadline passes; pass one as uvicorn's ``http=``.
  ``http_protocol()`` picks the one matching uvicorn's "auto" choice.
* Body: ``BodyTimeout``, an ASGI middleware around the app, answers 408 and closes the connection;
  the app sees a disconnect and stops reading.

The limits come from the settings' ``http`` section (``GPUFLEET_HTTP_HEADER_TIMEOUT_S``,
``GPUFLEET_HTTP_BODY_IDLE_S``, ``GPUFLEET_HTTP_BODY_MIN_RATE``, ``GPUFLEET_HTTP_BODY_GRACE_S``):
``server.serving_app`` builds ``BodyTimeout`` from them, which also sets the header deadline of the
process it runs in (each ``serve --workers N`` worker builds its own app).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional for uvicorn
    HttpToolsProtocol = None  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class ReadTimeouts:
    header_timeout_s: float = 10.0
    body_idle_s: float = 30.0
    body_min_rate: float = 1024.0  # bytes/s on average once body_grace_s has passed
    body_grace_s: float = 60.0

    @classmethod
    def from_settings(cls, settings: Any) -> ReadTimeouts:
        """From the settings' ``http`` section; from the environment when it predates these fields."""
        http = getattr(settings, "http", None)
        if http is None or not hasattr(http, "header_timeout_s"):
            return cls.from_env()
        return cls(header_timeout_s=http.header_timeout_s, body_idle_s=http.body_idle_s,
                   body_min_rate=http.body_min_rate, body_grace_s=http.body_grace_s)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ReadTimeouts:
        e = os.environ if env is None else env
        d = cls()

        def f(name: str, default: float) -> float:
            raw = e.get(name)
            if raw is None or not raw.strip():
                return default
            try:
                v = float(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number of seconds / bytes per second") from None
            if v <= 0:
                raise ValueError(f"{name} must be > 0 (got {v})")
            return v

        return cls(header_timeout_s=f("GPUFLEET_HTTP_HEADER_TIMEOUT_S", d.header_timeout_s),
                   body_idle_s=f("GPUFLEET_HTTP_BODY_IDLE_S", d.body_idle_s),
                   body_min_rate=f("GPUFLEET_HTTP_BODY_MIN_RATE", d.body_min_rate),
                   body_grace_s=f("GPUFLEET_HTTP_BODY_GRACE_S", d.body_grace_s))


# --- headers -------------------------------------------------------------------------------


class _HeaderDeadline:
    """Mixin over a uvicorn HTTP protocol. The timer runs while the server waits for a request's
    headers; it is cancelled as soon as they are complete (a request cycle exists)."""

    header_timeout_s: float = ReadTimeouts().header_timeout_s  # set_header_timeout() changes it per process
    _header_timer: asyncio.TimerHandle | None = None
    _got_bytes = False  # of a request, since the timer was armed
    timed_out = 0  # connections closed for slow headers, all protocols of this process

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        super().data_received(data)  # type: ignore[misc]
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not cycle.response_complete:
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        transport = getattr(self, "transport", None)
        if transport is not None and not transport.is_closing():
            self._arm_header_timer()  # the next request on this keep-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._got_bytes = False
        loop: asyncio.AbstractEventLoop = self.loop  # type: ignore[attr-defined]
        self._header_timer = loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        transport: asyncio.Transport = self.transport  # type: ignore[attr-defined]
        cycle = getattr(self, "cycle", None)
        if transport.is_closing() or (cycle is not None and not cycle.response_complete):
            return
        _HeaderDeadline.timed_out += 1
        # An idle connection is just closed (uvicorn's keep-alive timer would close it too); a
        # request cut short mid-headers gets 408 so the client knows why.
        if self._got_bytes:
            transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                            b"connection: close\r\ncontent-length: 38\r\n\r\nrequest headers took too long; closed\n")
        transport.close()


class TimedH11Protocol(_HeaderDeadline, H11Protocol):
    pass


if HttpToolsProtocol is not None:
    class TimedHttpToolsProtocol(_HeaderDeadline, HttpToolsProtocol):  # type: ignore[misc,valid-type]
        pass
else:  # pragma: no cover - httptools missing
    TimedHttpToolsProtocol = None  # type: ignore[assignment,misc]


def http_protocol(timeouts: ReadTimeouts | None = None) -> type[asyncio.Protocol]:
    """The timed twin of what uvicorn's ``http="auto"`` would choose (httptools when installed).
    ``timeouts`` sets this process's header deadline (``serving_app`` does, in every worker)."""
    if timeouts is not None:
        set_header_timeout(timeouts.header_timeout_s)
    return TimedHttpToolsProtocol if TimedHttpToolsProtocol is not None else TimedH11Protocol


def set_header_timeout(seconds: float) -> None:
    _HeaderDeadline.header_timeout_s = seconds


# --- body ----------------------------------------------------------------------------------


class BodyTimeout:
    """ASGI middleware: a request body that stalls gets 408 (connection closed) and the app a
    disconnect, so neither a worker task nor a connection waits on a slow client for ever."""

    def __init__(self, app: Any, timeouts: ReadTimeouts | None = None) -> None:
        self.app = app
        self.t = timeouts or ReadTimeouts.from_env()
        self.timed_out = 0
        set_header_timeout(self.t.header_timeout_s)  # one process, one set of limits

    def __getattr__(self, name: str) -> Any:  # state, router, ... of the wrapped app (tests use them)
        return getattr(self.app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t = self.t
        started = time.monotonic()
        got = 0
        done = False
        answered = False  # we sent the 408
        response_started = False

        async def timed_receive() -> dict[str, Any]:
            nonlocal got, done, answered
            if answered:
                return {"type": "http.disconnect"}
            if done:  # the body is in; what follows is the wait for a disconnect, no deadline
                return await receive()
            try:
                async with asyncio.timeout(t.body_idle_s):  # no extra task, unlike wait_for
                    msg = await receive()
            except TimeoutError:
                return await too_slow(f"no request body bytes for {t.body_idle_s:g} s")
            if msg["type"] == "http.request":
                got += len(msg.get("body", b""))
                if not msg.get("more_body", False):
                    done = True
                else:
                    elapsed = time.monotonic() - started
                    if elapsed > t.body_grace_s and got / elapsed < t.body_min_rate:
                        return await too_slow(f"request body arrives at {got / elapsed:.0f} B/s, under "
                                              f"{t.body_min_rate:g} B/s")
            return msg

        async def too_slow(why: str) -> dict[str, Any]:
            nonlocal answered
            self.timed_out += 1
            if not response_started:
                answered = True
                body = json.dumps({"detail": f"request timeout: {why}; connection closed"}).encode()
                await send({"type": "http.response.start", "status": 408,
                            "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
            return {"type": "http.disconnect"}

        async def guarded_send(msg: dict[str, Any]) -> None:
            nonlocal response_started
            if answered:
                return  # the client has its 408; whatever the app still says goes nowhere
            if msg["type"] == "http.response.start":
                response_started = True
            await send(msg)

        await self.app(scope, timed_receive, guarded_send)

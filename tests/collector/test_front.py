"""The ingest front (collector/front.py) against the FastAPI route it bypasses: both served by
real uvicorn servers on one real database (SQLite and PostgreSQL), answering the same requests
with the same status, JSON body and headers; and proof that served ingest really takes the front."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gpufleet import protocol
from gpufleet.collector import front as front_mod
from gpufleet.collector import routes
from gpufleet.collector.front import IngestFront
from gpufleet.collector.routes import internal_error
from gpufleet.collector.writer import Overloaded
from gpufleet.server import create_app, serving_app
from gpufleet.settings import Settings
from gpufleet.storage import tokens
from gpufleet.storage.db import make_engine

from .conftest import make_batch

LIMIT = 64 * 1024  # max_body_bytes of both servers: a real batch fits, the oversize bodies do not
INGEST = "/api/v1/ingest"


def shape(r: httpx.Response) -> tuple[Any, ...]:
    """Everything a client may depend on in an answer."""
    return (r.status_code, r.json(), r.headers.get("content-type"), r.headers.get("retry-after"),
            r.headers.get("www-authenticate"), r.headers.get("allow"))


class Pair:
    """The same request to the front (as served by `gpufleet serve`) and to the bare FastAPI app."""

    def __init__(self, front_url: str, route_url: str) -> None:
        self.front = httpx.Client(base_url=front_url, timeout=30)
        self.route = httpx.Client(base_url=route_url, timeout=30)

    def both(self, method: str, path: str, **kw: Any) -> tuple[httpx.Response, httpx.Response]:
        # Streamed bodies are single-use: a factory gives each side its own.
        body = kw.pop("content_factory", None)
        a = self.front.request(method, path, **({"content": body()} if body else {}), **kw)
        b = self.route.request(method, path, **({"content": body()} if body else {}), **kw)
        return a, b

    def same(self, method: str, path: str, **kw: Any) -> tuple[Any, ...]:
        a, b = self.both(method, path, **kw)
        assert shape(a) == shape(b), (a.text, b.text)
        return shape(a)

    def close(self) -> None:
        self.front.close()
        self.route.close()


@pytest.fixture
def pair(database_url: str, live_server: Callable[..., Any]) -> Iterator[tuple[Pair, Any, Any, dict[str, str]]]:
    settings = {"allow_anonymous": False, "max_body_bytes": LIMIT}
    fsrv = live_server(database_url, **settings)
    rsrv = live_server(database_url, front=False, **settings)
    assert isinstance(_front(fsrv.app), IngestFront) and not isinstance(_front(rsrv.app), IngestFront)
    e = make_engine(database_url)
    toks = {role: tokens.create_token(e, f"t-{role}", role) for role in ("agent", "viewer")}
    toks["scoped"] = tokens.create_token(e, "t-scoped", "agent", node="elsewhere")
    e.dispose()
    p = Pair(fsrv.url, rsrv.url)
    yield p, fsrv, rsrv, toks
    p.close()


def _front(app: Any) -> Any:
    """The ingest front under serving_app's outer layers (read timeouts, Host/Origin guard)."""
    while not isinstance(app, IngestFront) and "app" in vars(app):
        app = vars(app)["app"]
    return app


def bearer(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


def test_front_and_route_answer_alike(pair, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    p, fsrv, rsrv, toks = pair
    agent = bearer(toks["agent"])
    start = time.time() - 30

    # Valid batches, then the agent's retry of each: one batch per side (same shape, other node),
    # since a batch the first side stored would be a duplicate for the second.
    bodies = {side: protocol.encode(make_batch(f"{side}-n1", seq=1, start=start)) for side in ("front", "route")}
    for want in ({"stored": 80, "duplicate": False}, {"stored": 0, "duplicate": True}):
        a = p.front.post(INGEST, content=bodies["front"][0], headers={**bodies["front"][1], **agent})
        b = p.route.post(INGEST, content=bodies["route"][0], headers={**bodies["route"][1], **agent})
        assert shape(a) == shape(b) and a.json() == want, (a.text, b.text)
        assert a.headers["content-type"] == "application/json"
    body, hdrs = bodies["front"]

    msgpack = {"Content-Type": protocol.MSGPACK, **agent}
    assert p.same("POST", INGEST, content=b"\xc1 not msgpack", headers=msgpack)[0] == 400
    assert p.same("POST", INGEST, content=b"x", headers={"Content-Type": "text/plain", **agent})[0] == 415
    assert p.same("POST", INGEST, content=b"x", headers={"Content-Encoding": "br", **msgpack})[0] == 415
    # Over the size limit, announced by Content-Length (refused before reading) and chunked
    # (refused while streaming): both say 413 with their own message.
    big = b"\x00" * (LIMIT + 1)
    with_cl = p.same("POST", INGEST, content=big, headers=msgpack)
    assert with_cl[0] == 413 and f"body of {LIMIT + 1} bytes" in with_cl[1]["detail"]
    chunked = p.same("POST", INGEST, content_factory=lambda: iter([b"\x00" * 16384] * 5), headers=msgpack)
    assert chunked[0] == 413 and "body exceeds the limit" in chunked[1]["detail"]
    # Auth: no token, a bad one, a wrong scheme (401 + WWW-Authenticate), a node-scoped one (403).
    assert p.same("POST", INGEST, content=body, headers=hdrs)[:5] == (
        401, {"detail": "missing bearer token; create one with `gpufleet token create`"}, "application/json",
        None, "Bearer")
    assert p.same("POST", INGEST, content=body, headers={**hdrs, **bearer("nope")})[0] == 401
    assert p.same("POST", INGEST, content=body, headers={**hdrs, "Authorization": "Basic eDp5"})[0] == 401
    assert p.same("POST", INGEST, content=body, headers={**hdrs, **bearer(toks["scoped"])})[0] == 403
    # Other methods are FastAPI's: 405 with its Allow header, even though the front owns POST.
    assert p.same("GET", INGEST, headers=agent)[:2] == (405, {"detail": "Method Not Allowed"})
    assert p.same("PUT", INGEST, content=body, headers=agent)[0] == 405
    # A full write queue (503 + Retry-After) and a failure nobody foresaw (500, JSON, logged).
    fresh = {s: protocol.encode(make_batch(f"{s}-n2", seq=1, start=start)) for s in ("front", "route")}

    def overloaded(prep: object) -> None:
        raise Overloaded("write queue full (123 rows waiting)")

    def broken(prep: object) -> None:
        raise RuntimeError("boom")

    for fail, status in ((overloaded, 503), (broken, 500)):
        with monkeypatch.context() as m:
            for srv in (fsrv, rsrv):
                m.setattr(srv.app.state.collector.writer, "submit", fail)
            a = p.front.post(INGEST, content=fresh["front"][0], headers={**fresh["front"][1], **agent})
            b = p.route.post(INGEST, content=fresh["route"][0], headers={**fresh["route"][1], **agent})
        assert shape(a) == shape(b) and a.status_code == status, (a.text, b.text)
    assert int(a.headers.get("retry-after") or 0) == 0  # the 500 carries none
    assert p.front.post(INGEST, content=fresh["front"][0], headers={**fresh["front"][1], **agent}).json() == {
        "stored": 80, "duplicate": False}  # after the refusals, the same batch is simply stored

    # Everything else goes through the front to FastAPI unchanged.
    assert p.same("GET", "/healthz")[:2] == (200, {"status": "ok"})
    jobs = p.same("GET", "/api/v1/jobs", headers=bearer(toks["viewer"]))
    assert jobs[0] == 200
    assert p.front.get("/").status_code == p.route.get("/").status_code
    # The front answered every ingest POST it got, and only those.
    assert fsrv.app.handled == 14


def test_served_ingest_bypasses_the_starlette_route(database_url, live_server,
                                                   monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Break the Starlette endpoint (it looks ``handle_ingest`` up at call time; the front holds
    its own reference): served ingest still works, so the endpoint never ran."""
    srv = live_server(database_url)

    async def refuse(*args: object) -> None:
        raise AssertionError("the Starlette ingest endpoint ran")

    monkeypatch.setattr(routes, "handle_ingest", refuse)
    body, headers = protocol.encode(make_batch("n1", seq=1, start=time.time() - 30))
    r = httpx.post(srv.url + INGEST, content=body, headers=headers, timeout=30)
    assert r.status_code == 200 and r.json() == {"stored": 80, "duplicate": False}, r.text
    assert srv.app.handled == 1
    # ... while the same app without the front does reach the (broken) endpoint. (No `with`: the
    # server's lifespan already runs this app's collector; a second lifespan would replace it.)
    client = TestClient(_front(srv.app).app, raise_server_exceptions=False)
    assert client.post(INGEST, content=body, headers=headers).status_code == 500


def test_front_failure_is_a_json_500_and_the_connection_lives(sqlite_url, live_server, monkeypatch,
                                                              caplog) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(sqlite_url)
    body, headers = protocol.encode(make_batch("n1", seq=1, start=time.time() - 30))

    def no_collector(app: object) -> None:
        raise RuntimeError("front boom")

    with httpx.Client(base_url=srv.url, timeout=30) as c:
        with monkeypatch.context() as m, caplog.at_level(logging.ERROR, logger="gpufleet.collector.front"):
            m.setattr(front_mod, "collector_for", no_collector)
            r = c.post(INGEST, content=body, headers=headers)
        status, want, _ = internal_error()
        assert r.status_code == status == 500 and r.content == want
        assert r.headers["content-type"] == "application/json"
        assert any("ingest front failed" in rec.getMessage() and rec.exc_info for rec in caplog.records)
        r = c.post(INGEST, content=body, headers=headers)  # same keep-alive client
        assert r.json() == {"stored": 80, "duplicate": False}


def test_disconnect_mid_body_sends_nothing(sqlite_url) -> None:
    front = serving_app(Settings.of({"database": {"url": sqlite_url}, "auth": {"allow_anonymous": True}}))
    messages = iter([{"type": "http.request", "body": b"\x82", "more_body": True}, {"type": "http.disconnect"}])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": INGEST, "root_path": "",
             "headers": [(b"content-type", protocol.MSGPACK.encode())]}
    try:
        asyncio.run(front(scope, receive, send))
    finally:
        front.state.collector.stop()  # created on demand: no lifespan ran
    assert sent == [] and front.handled == 1


def test_without_lifespan_and_behind_a_root_path(sqlite_url) -> None:
    """TestClient with no lifespan: the front creates the collector on demand, as the route does;
    behind a root_path the route path is relative to it, as Starlette's router matches it."""
    front = serving_app(Settings.of({"database": {"url": sqlite_url}, "auth": {"allow_anonymous": True}}))
    body, headers = protocol.encode(make_batch("n1", seq=1, start=time.time() - 30))
    client = TestClient(front, root_path="/gf")
    try:
        r = client.post("/gf" + INGEST, content=body, headers=headers)
        assert r.json() == {"stored": 80, "duplicate": False}, r.text
        assert front.handled == 1 and front.state.collector is front.app.state.collector
        assert client.get("/gf/healthz").json() == {"status": "ok"}
    finally:
        front.state.collector.stop()


def test_create_app_stays_the_fastapi_app(sqlite_url) -> None:
    s = Settings.of({"database": {"url": sqlite_url}})
    assert not isinstance(create_app(s), IngestFront)
    served = serving_app(s)
    assert isinstance(_front(served), IngestFront) and served.state is _front(served).app.state


WRITE = "/api/v1/write"


def _rw_body(t0_ms: int) -> bytes:
    """Three scrapes of the real dcgm-exporter captures, as a snappy remote-write body."""
    from gpufleet.collector.remote_write import wire
    from tests.prometheus.captures import DUMPS, body, capture_series

    series = [(lab, [(t0_ms + k * 15_000, v) for k in range(3)])
              for name in DUMPS for lab, v, _ in capture_series(name, instance=f"{name[:6]}:9400")]
    return wire.snappy(body(series))


def test_remote_write_through_the_front_answers_as_the_route(pair, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """POST /api/v1/write taken by the front (below FastAPI's stack) answers what the Starlette
    route answers: stored, the retry a duplicate, bad bodies and missing tokens refused; and the
    front really took it (the route's handler broken on the front's server changes nothing)."""
    from gpufleet.collector.remote_write import routes as rw_routes

    p, fsrv, _rsrv, toks = pair
    rw = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
          "X-Prometheus-Remote-Write-Version": "0.1.0", **bearer(toks["agent"])}
    now_ms = int(time.time() * 1000)
    bodies = {"front": _rw_body(now_ms - 120_000), "route": _rw_body(now_ms - 60_000)}  # other rows, same shape

    async def refuse(*args: object) -> None:
        raise AssertionError("the Starlette remote-write endpoint ran")

    for attempt in range(2):  # the first stores, the very same bytes again store nothing
        with monkeypatch.context() as m:
            m.setattr(rw_routes, "handle_write", refuse)  # what the route looks up; the front holds its own
            a = p.front.post(WRITE, content=bodies["front"], headers=rw)
        b = p.route.post(WRITE, content=bodies["route"], headers=rw)
        assert shape(a) == shape(b) and a.status_code == 200, (a.text, b.text)
        assert a.json()["stored"] == (18 if attempt == 0 else 0)
        assert (a.json()["duplicate_batches"] > 0) == (attempt == 1)
    assert p.same("POST", WRITE, content=b"not snappy", headers=rw)[0] == 400
    no_token = {k: v for k, v in rw.items() if k != "Authorization"}
    assert p.same("POST", WRITE, content=bodies["front"], headers=no_token)[:2] == (
        401, {"detail": "missing bearer token; create one with `gpufleet token create`"})
    assert p.same("GET", WRITE, headers=rw)[0] == 405  # other methods stay FastAPI's
    front = _front(fsrv.app)
    assert front.handled_writes == 4 and front.handled == 0

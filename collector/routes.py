"""The collector's HTTP surface: ``POST /api/v1/ingest`` (protocol v1 batches from agents)
and ``POST /api/v1/import`` (NDJSON files), plus ``lifespan(app)`` running this process's
group-commit writer and maintenance loop.

The ingest handler is a plain Starlette endpoint, not a FastAPI one with dependency
injection: it is the hot path (thousands of requests per second per process) and reads a
raw body anyway. Its contract is in docs/collector.md and docs/architecture.md."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from fastapi import APIRouter, FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from gpufleet import protocol
from gpufleet.collector.config import CollectorConfig
from gpufleet.collector.fastdecode import decode_prepared
from gpufleet.collector.validate import check_batch
from gpufleet.collector.writer import GroupWriter, Overloaded, Unavailable
from gpufleet.storage import retention, tokens
from gpufleet.storage.writes import BatchRejected, close_stale_jobs, prepare

log = logging.getLogger(__name__)
router = APIRouter()
_json = msgspec.json.Encoder()
_AUTH_TTL_S = 5.0


def _reply(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(_json.encode(body), status, headers=headers, media_type="application/json")


def _error(status: int, detail: str, retry_after: int | None = None) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return _reply(status, {"detail": detail}, headers)


class Collector:
    """Per-process state: the writer, config, and a small auth cache in front of
    ``tokens.authorize`` so the event loop does not query the database per request."""

    def __init__(self, app: FastAPI, config: CollectorConfig | None = None) -> None:
        self.app = app
        self.engine = app.state.engine
        self.settings = app.state.settings
        self.config = config or CollectorConfig.from_env()
        self.writer = GroupWriter(self.engine, queue_rows=self.config.queue_rows, group_rows=self.config.group_rows)
        self._auth: dict[tuple[str | None, str], tuple[float, tokens.TokenInfo | tokens.AuthError]] = {}
        self._stop = threading.Event()
        self._maint = threading.Thread(target=self._maintenance, name="gpufleet-maintenance", daemon=True)
        self._started = False

    def start(self) -> None:
        self.writer.start()
        self._maint.start()
        self._started = True

    def stop(self) -> None:
        self._stop.set()
        self.writer.stop()
        self._maint.join(10)

    async def authorize(self, header: str | None, role: str) -> tokens.TokenInfo:
        allow = bool(getattr(self.settings, "allow_anonymous", False))
        if header is None:
            return tokens.authorize(self.engine, None, role, allow)  # no database access
        key = (header, role)
        now = time.monotonic()
        hit = self._auth.get(key)
        if hit is None or now - hit[0] > _AUTH_TTL_S:
            try:
                res: tokens.TokenInfo | tokens.AuthError = await run_in_threadpool(
                    tokens.authorize, self.engine, header, role, allow)
            except tokens.AuthError as e:
                res = e
            if len(self._auth) > 50_000:
                self._auth.clear()
            self._auth[key] = hit = (now, res)
        if isinstance(hit[1], tokens.AuthError):
            raise hit[1]
        return hit[1]

    def _maintenance(self) -> None:
        """Partitions ahead, stale jobs ended, retention: cheap and idempotent, so every
        collector process may run it without coordination."""
        last_retention = 0.0
        while not self._stop.is_set():
            now = time.time()
            try:
                retention.ensure_ahead(self.engine, now)
                with self.engine.begin() as c:
                    close_stale_jobs(c, now, self.config.stale_job_s)
                if now - last_retention >= self.config.retention_s:
                    retention.apply_retention(self.engine, now, self.config.raw_days, self.config.rollup_days)
                    last_retention = now
            except Exception as e:  # the database may be down; try again next round
                log.warning("maintenance: %s", str(e).splitlines()[0] if str(e) else type(e).__name__)
            self._stop.wait(self.config.maintenance_s)


def _collector(request: Request) -> Collector:
    coll: Collector | None = getattr(request.app.state, "collector", None)
    if coll is None:  # app used without its lifespan (e.g. a bare TestClient)
        coll = request.app.state.collector = Collector(request.app)
        coll.start()
    return coll


async def _read_body(request: Request, limit: int, cl: str | None) -> bytes | Response:
    if cl is not None:
        try:
            if int(cl) > limit:
                return _error(413, f"body of {cl} bytes exceeds the limit of {limit}")
        except ValueError:
            return _error(400, "invalid Content-Length")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return _error(413, f"body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


_WANTED = {b"authorization", b"content-encoding", b"content-type", b"content-length"}


def _headers(request: Request) -> dict[bytes, str]:
    # One pass over the raw header list: Starlette's Headers.get raises and catches a
    # KeyError for every absent header, which shows up in profiles at thousands of req/s.
    return {k: v.decode("latin-1") for k, v in request.scope["headers"] if k in _WANTED}


async def ingest(request: Request) -> Response:
    coll = _collector(request)
    h = _headers(request)
    try:
        who = await coll.authorize(h.get(b"authorization"), "agent")
    except tokens.AuthError as e:
        return _error(e.status, e.detail)
    limit = int(coll.settings.max_body_bytes)
    body = await _read_body(request, limit, h.get(b"content-length"))
    if isinstance(body, Response):
        return body
    ctype = h.get(b"content-type")
    prep = None
    try:
        raw = protocol.decompress(body, h.get(b"content-encoding"), max_size=limit)
        prep = decode_prepared(raw, ctype)
        batch = prep.batch if prep is not None else protocol.decode(raw, ctype)
    except protocol.ProtocolError as e:
        msg = str(e)
        status = 415 if msg.startswith("unsupported") else 413 if "exceeds" in msg else 400
        return _error(status, msg)
    try:
        tokens.check_scope(who, batch.agent.cluster, batch.agent.node)
    except tokens.AuthError as e:
        return _error(e.status, e.detail)
    cfg = coll.config
    try:
        if prep is None:  # the generic path names what is wrong
            prep = prepare(batch)
        check_batch(batch, prep, time.time(), max_rows=int(coll.settings.max_rows_per_batch),
                    max_age_s=cfg.max_age_s, max_future_s=cfg.max_future_s)
        fut = coll.writer.submit(prep)
    except BatchRejected as e:
        return _error(e.status, e.detail)
    except Overloaded as e:
        return _error(503, str(e), cfg.retry_after_s)
    except Unavailable as e:
        return _error(503, str(e), cfg.retry_after_s)
    try:
        res = await fut
    except BatchRejected as e:
        return _error(e.status, e.detail)
    except Unavailable as e:
        return _error(503, str(e), cfg.retry_after_s)
    except Exception:
        log.exception("ingest failed")
        return _error(500, "internal error storing the batch (logged on the collector)")
    return _reply(200, {"stored": res.stored, "duplicate": res.duplicate})


async def import_ndjson(request: Request) -> Response:
    """NDJSON upload (``?cluster=C``): validated completely, then stored in one transaction."""
    from gpufleet.collector.ndjson import ImportError_, import_file

    coll = _collector(request)
    try:
        await coll.authorize(request.headers.get("authorization"), "operator")
    except tokens.AuthError as e:
        return _error(e.status, e.detail)
    cluster = request.query_params.get("cluster") or None
    limit = coll.config.import_max_bytes
    enc = (request.headers.get("content-encoding") or "identity").lower()
    if enc not in ("identity", "", "gzip", "zstd"):
        return _error(415, f"unsupported Content-Encoding {enc!r}: use gzip, zstd or none")
    fd, path = tempfile.mkstemp(prefix="gpufleet-import-", suffix=".ndjson")
    try:
        size = 0
        # Spool to disk (bounded memory) so the file can be read twice: validate, then write.
        with os.fdopen(fd, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    return _error(413, f"import body exceeds {limit} bytes (GPUFLEET_IMPORT_MAX_BYTES)")
                f.write(chunk)
        try:
            res = await run_in_threadpool(import_file, coll.engine, path, cluster=cluster, encoding=enc,
                                          max_bytes=limit)
        except ImportError_ as e:
            return _error(e.status, e.detail)
        return _reply(200, res.as_dict())
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


router.add_route("/api/v1/ingest", ingest, methods=["POST"], include_in_schema=False)
router.add_route("/api/v1/import", import_ndjson, methods=["POST"], include_in_schema=False)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    coll = Collector(app)
    app.state.collector = coll
    coll.start()
    try:
        yield
    finally:
        # Drain the queue off the event loop so waiting requests still get their answer.
        await asyncio.get_running_loop().run_in_executor(None, coll.stop)

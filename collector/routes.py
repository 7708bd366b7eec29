"""The collector's HTTP surface: ``POST /api/v1/ingest`` (protocol v1 batches from agents)
and ``POST /api/v1/import`` (NDJSON files), plus ``lifespan(app)`` running this process's
group-commit writer and maintenance loop.

The ingest logic is ``handle_ingest``, independent of the HTTP framework: it is the hot path
(thousands of requests per second per process), so server processes reach it through the
pure-ASGI ``collector.front.IngestFront`` (no Starlette request cycle); the Starlette endpoint
``ingest`` is a thin wrapper over the same core, mounted on the app for TestClient users and
anything served without the front. Its contract is in docs/collector.md and
docs/architecture.md."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import msgspec
from fastapi import APIRouter, FastAPI
from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gpufleet import protocol
from gpufleet.collector.answers import Answer, BodyReader, answer, read_limited_body
from gpufleet.collector.columns import prepare
from gpufleet.collector.errors import BatchRejected, from_protocol
from gpufleet.collector.fastdecode import decode_prepared
from gpufleet.collector.intake_schema import refused_json
from gpufleet.collector.node_scope import screen_node_scope
from gpufleet.collector.validate import check_batch
from gpufleet.collector.writer import GroupWriter, Overloaded, Unavailable, WriterMetrics
from gpufleet.settings import CollectorSettings
from gpufleet.storage import scope, tokens
from gpufleet.storage.errors import is_transient, is_unreachable
from gpufleet.storage.maintenance import MaintenanceLoop

log = logging.getLogger(__name__)
router = APIRouter()
_json = msgspec.json.Encoder()
_AUTH_TTL_S = 5.0






def _to_response(answer: Answer) -> Response:
    status, body, extra = answer
    resp = Response(body, status, media_type="application/json")
    # raw_headers, not the headers= mapping: the names are already lower-case bytes.
    resp.raw_headers.extend(extra)
    return resp


def _reply(status: int, body: dict[str, Any]) -> Response:
    return Response(_json.encode(body), status, media_type="application/json")


def _error(status: int, detail: str, retry_after: int | None = None) -> Response:
    return _to_response(answer(status, detail, retry_after))


class Collector:
    """Per-process state: the writer, config, and a small auth cache in front of
    ``tokens.authorize`` so the event loop does not query the database per request."""

    def __init__(self, app: FastAPI, config: CollectorSettings | None = None) -> None:
        self.app = app
        self.engine = app.state.engine
        self.settings = app.state.settings
        self.config = config or self.settings.collector
        self.writer = GroupWriter(self.engine, queue_rows=self.config.queue_rows, group_rows=self.config.group_rows)
        self._auth: dict[tuple[str | None, str], tuple[float, tokens.TokenInfo | tokens.AuthError]] = {}
        self._maint = MaintenanceLoop(self.engine, self.settings.maintenance)
        self._started = False
        self.refused_records = 0  # side records refused by the intake schema (partial acceptance)
        self.node_facts = scope.NodeFactsCache()  # what node-scoped tokens may write for (storage.scope)

    def start(self) -> None:
        self.writer.start()
        self._maint.start()
        self._started = True

    def stop(self) -> None:
        self.writer.stop()
        self._maint.stop()

    async def authorize(self, header: str | None, role: str) -> tokens.TokenInfo:
        allow = self.settings.auth.allow_anonymous
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


def collector_for(app: FastAPI) -> Collector:
    """This process's Collector, created on first use when the app's lifespan did not run
    (e.g. a bare TestClient): the endpoint and the front must find the same one."""
    coll: Collector | None = getattr(app.state, "collector", None)
    if coll is None:
        coll = app.state.collector = Collector(app)
        coll.start()
    return coll




_WANTED = {b"authorization", b"content-encoding", b"content-type", b"content-length"}


def wanted_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[bytes, str]:
    """The request headers ingest reads, from an ASGI scope's raw (lower-case) header list."""
    # One pass over the raw header list: Starlette's Headers.get raises and catches a
    # KeyError for every absent header, which shows up in profiles at thousands of req/s.
    return {k: v.decode("latin-1") for k, v in raw if k in _WANTED}


async def handle_ingest(coll: Collector, headers: dict[bytes, str], read_body: BodyReader) -> Answer:
    """The whole ingest request, transport-independent. ``headers`` holds only the lower-cased
    names in ``_WANTED``. Raises only ClientDisconnect (nobody left to answer); every other
    failure is an answer, so the endpoint and the front cannot diverge on errors."""
    try:
        return await _ingest(coll, headers, read_body)
    except ClientDisconnect:
        raise
    except Exception:
        log.exception("ingest failed")
        return internal_error()


_last_unavailable_log = 0.0


def database_unavailable(e: BaseException, retry_after_s: int) -> Answer:
    """The answer while the database cannot be reached: 503 + Retry-After (the agent keeps the
    batch and retries). Logged as one line at most every 10 s per process, not a traceback per
    request: during an outage every request fails the same way."""
    global _last_unavailable_log
    now = time.monotonic()
    if now - _last_unavailable_log >= 10.0:
        _last_unavailable_log = now
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        log.warning("database unavailable (answering 503 + Retry-After): %s", first)
    return answer(503, "database unavailable, retry later", retry_after_s)


def internal_error() -> Answer:
    """The answer to an unexpected failure; the details go to the log, not to the client."""
    return answer(500, "internal error handling the batch (logged on the collector)")


async def _ingest(coll: Collector, h: dict[bytes, str], read_body: BodyReader) -> Answer:
    try:
        who = await coll.authorize(h.get(b"authorization"), "agent")
    except tokens.AuthError as e:
        return answer(e.status, e.detail)
    except DBAPIError as e:
        if not (is_transient(e) or is_unreachable(e)):
            raise
        return database_unavailable(e, coll.config.retry_after_s)
    limit = coll.settings.http.max_body_bytes
    body = await read_limited_body(read_body, limit, h.get(b"content-length"))
    if not isinstance(body, bytes):
        return body
    ctype = h.get(b"content-type")
    prep = None
    try:
        raw = protocol.decompress(body, h.get(b"content-encoding"), max_size=limit)
        prep = decode_prepared(raw, ctype)
        batch = prep.batch if prep is not None else protocol.decode(raw, ctype)
    except protocol.ProtocolError as e:
        r = from_protocol(e)
        return answer(r.status, r.detail)
    try:
        tokens.check_scope(who, batch.agent.cluster, batch.agent.node)
    except tokens.AuthError as e:
        return answer(e.status, e.detail)
    cfg = coll.config
    try:
        fast = prep is not None  # the fast decoder has checked the gpus and jobs lists already
        if prep is None:  # the generic path names what is wrong
            prep = prepare(batch)
        refused = check_batch(batch, prep, time.time(), max_rows=coll.settings.http.max_rows_per_batch,
                              max_age_s=cfg.max_age_s, max_future_s=cfg.max_future_s, dims_checked=fast)
        if who.node is not None:  # records of jobs not on its GPUs refused by themselves (storage.scope)
            refused += await screen_node_scope(coll.engine, coll.node_facts, prep)
        fut = coll.writer.submit(prep)
    except BatchRejected as e:
        return answer(e.status, e.detail)
    except Overloaded as e:
        return answer(503, str(e), cfg.retry_after_s)
    except Unavailable as e:
        return answer(503, str(e), cfg.retry_after_s)
    try:
        res = await fut
    except BatchRejected as e:
        return answer(e.status, e.detail)
    except Unavailable as e:
        return answer(503, str(e), cfg.retry_after_s)
    except Exception:
        log.exception("ingest failed")
        return answer(500, "internal error storing the batch (logged on the collector)")
    if refused:
        # Partial acceptance: the rest of the batch is stored; the agent dead-letters these.
        coll.refused_records += len(refused)
        return 200, _json.encode({"stored": res.stored, "duplicate": res.duplicate,
                                  "refused": refused_json(refused), "refused_count": len(refused)}), []
    return 200, _json.encode({"stored": res.stored, "duplicate": res.duplicate}), []


async def ingest(request: Request) -> Response:
    """The Starlette face of ``handle_ingest`` (served processes normally answer through
    ``collector.front.IngestFront`` before this route is reached)."""
    answer = await handle_ingest(collector_for(request.app), wanted_headers(request.scope["headers"]),
                                 request.stream)
    return _to_response(answer)


async def import_ndjson(request: Request) -> Response:
    """NDJSON upload (``?cluster=C``): validated completely, then stored in one transaction."""
    from gpufleet.collector.ndjson import ImportError_, import_file

    coll = collector_for(request.app)
    try:
        await coll.authorize(request.headers.get("authorization"), "operator")
    except tokens.AuthError as e:
        return _error(e.status, e.detail)
    except DBAPIError as e:
        if not (is_transient(e) or is_unreachable(e)):
            raise
        return _to_response(database_unavailable(e, coll.config.retry_after_s))
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
    # /metrics: the API part's lifespan, after this one, registers what is left here
    app.state.metrics_collectors = [*getattr(app.state, "metrics_collectors", ()), WriterMetrics(coll.writer)]
    coll.start()
    try:
        yield
    finally:
        # Drain the queue off the event loop so waiting requests still get their answer.
        await asyncio.get_running_loop().run_in_executor(None, coll.stop)

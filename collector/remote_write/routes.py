"""Mounts ``POST /api/v1/write`` (a thin wrapper over ``receiver.Receiver``) and exposes its
counters on the app's /metrics registry (``app.state.metrics_registry``, when the API part
created one)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from urllib.parse import parse_qsl

from fastapi import APIRouter, FastAPI
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gpufleet.collector.answers import Answer, BodyReader, answer
from gpufleet.collector.export import encode as export_encode
from gpufleet.collector.routes import collector_for

from . import wire
from .receiver import Receiver

log = logging.getLogger(__name__)
router = APIRouter()
_lock = threading.Lock()
_HEADERS = {b"authorization", b"content-encoding", b"content-type", b"content-length"}


def receiver_for(app: FastAPI) -> Receiver:
    rw: Receiver | None = getattr(app.state, "remote_write", None)
    if rw is None:
        with _lock:
            rw = getattr(app.state, "remote_write", None)
            if rw is None:
                rw = app.state.remote_write = Receiver(collector_for(app))
                _register_metrics(app, rw)
                if wire._NATIVE is None:
                    log.warning("remote write: the C decoder (_decode_c) is not built in this install; bodies are "
                                "decoded in Python at several times the CPU (2.0: ~14x). Install from a checkout "
                                "with a C compiler (docs/prometheus.md)")
    return rw


def c_extensions() -> dict[str, bool]:
    """Which optional C passes this install has (setup.py builds them where a compiler is)."""
    return {"remote_write_decoder": wire._NATIVE is not None, "export_encoder": export_encode._NATIVE is not None}


async def handle_write(app: FastAPI, raw_headers: Iterable[tuple[bytes, bytes]], read_body: BodyReader,
                       query_string: bytes = b"") -> Answer:
    """The whole remote-write request, transport-independent: the Starlette route below wraps it,
    and so can a pure-ASGI front (as ``collector.front`` does for ingest: a 2,000-sample body
    through FastAPI's middleware, routing, Request and Response costs ~10% of its CPU).
    ``raw_headers``: an ASGI scope's header list. Raises only ClientDisconnect (nobody left to
    answer); every other failure is an answer, so the route and a front cannot diverge."""
    try:
        rw = receiver_for(app)
        headers = {k: v.decode("latin-1") for k, v in raw_headers if k in _HEADERS}
        # as Starlette's request.query_params.get: latin-1, blank values kept, the last one wins
        cluster = dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)).get("cluster")
        return await rw.handle(headers, read_body, cluster)
    except ClientDisconnect:
        raise
    except Exception:
        log.exception("remote write failed")
        return answer(500, "internal error handling the remote-write request (logged on the collector)")


async def write(request: Request) -> Response:
    try:
        status, body, extra = await handle_write(request.app, request.scope["headers"], request.stream,
                                                 request.scope.get("query_string", b""))
    except ClientDisconnect:
        return Response(status_code=400)  # nobody is listening; uvicorn drops it
    resp = Response(body, status, media_type="application/json")
    resp.raw_headers.extend(extra)
    return resp


router.add_route("/api/v1/write", write, methods=["POST"], include_in_schema=False)


class RemoteWriteMetrics(Collector):
    def __init__(self, rw: Receiver) -> None:
        self.rw = rw

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self.rw.stats
        with s.lock:
            req = CounterMetricFamily("gpufleet_remote_write_requests",
                                      "Remote-write requests by HTTP status and protocol version (1.0, 2.0, unknown)",
                                      labels=["status", "version"])
            for (status, version), n in sorted(s.requests.items()):
                req.add_metric([str(status), version], n)
            ign = CounterMetricFamily("gpufleet_remote_write_ignored_series",
                                      "Series in stored requests that gpufleet does not store, by reason",
                                      labels=["reason"])
            for reason, n in sorted(s.ignored.items()):
                ign.add_metric([reason], n)
            drop = CounterMetricFamily("gpufleet_remote_write_dropped_samples",
                                       "Samples of GPU series that are no reading (NaN, stale, out of range, "
                                       "first counter sample), by reason", labels=["reason"])
            for reason, n in sorted(s.dropped.items()):
                drop.add_metric([reason], n)
            samples = CounterMetricFamily("gpufleet_remote_write_samples", "Samples received in stored requests")
            samples.add_metric([], s.samples)
            rows = CounterMetricFamily("gpufleet_remote_write_rows", "Rows (GPU x timestamp) stored")
            rows.add_metric([], s.rows)
            dup = CounterMetricFamily("gpufleet_remote_write_duplicate_batches",
                                      "Per-node batches acknowledged as duplicates of a retried request")
            dup.add_metric([], s.duplicate_batches)
            again = CounterMetricFamily("gpufleet_remote_write_rows_already_stored",
                                        "Rows skipped because their (GPU, timestamp) was stored before: a GPU's "
                                        "fields split over shards (keep one queue per GPU, docs/prometheus.md)")
            again.add_metric([], s.rows_already_stored)
            colls = CounterMetricFamily("gpufleet_remote_write_collectives",
                                        "NCCL collective aggregates stored from Inspector series (Prometheus mode)")
            colls.add_metric([], s.collectives)
        known = GaugeMetricFamily("gpufleet_remote_write_series_cached", "Series label sets mapped and cached")
        known.add_metric([], len(self.rw.series))
        native = GaugeMetricFamily("gpufleet_c_extension_loaded",
                                   "1 where the optional C pass is built into this install, 0 where the Python "
                                   "path does its work at more CPU", labels=["extension"])
        for name, loaded in c_extensions().items():
            native.add_metric([name], float(loaded))
        used = GaugeMetricFamily("gpufleet_remote_write_cache_bytes",
                                 "Bytes (estimated) held by a cache that senders fill (series label sets, metadata "
                                 "family names, checked GPU/job lists, per-GPU label values)", labels=["cache"])
        limit = GaugeMetricFamily("gpufleet_remote_write_cache_limit_bytes",
                                  "The byte bound of that cache: past it the cache is emptied and rebuilt",
                                  labels=["cache"])
        evicted = CounterMetricFamily("gpufleet_remote_write_cache_evictions",
                                      "Times a sender-fed cache was emptied to stay within its bound", labels=["cache"])
        for b in self.rw.budgets():
            used.add_metric([b.name], b.used)
            limit.add_metric([b.name], b.limit)
            evicted.add_metric([b.name], b.evictions)
        yield from (req, ign, drop, samples, rows, dup, again, colls, known, native, used, limit, evicted)
        yield from self.rw.serving.collect()


def _register_metrics(app: FastAPI, rw: Receiver) -> None:
    reg = getattr(app.state, "metrics_registry", None)
    if reg is not None and not getattr(rw, "_metrics_registered", False):
        reg.register(RemoteWriteMetrics(rw))
        rw._metrics_registered = True  # type: ignore[attr-defined]  # a marker set on the instance at runtime


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Mounted after the API part, whose lifespan creates the /metrics registry.
    rw = receiver_for(app)
    _register_metrics(app, rw)
    ticker = asyncio.create_task(_serving_ticks(rw))
    try:
        yield
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        await rw.serving.flush()  # the serving minutes held: stored before the process goes


async def _serving_ticks(rw: Receiver) -> None:
    """Silent serving replicas' last minutes, and minutes a failed write kept, stored without
    waiting for a body (serving.SWEEP_S apart)."""
    from .serving import SWEEP_S

    while True:
        await asyncio.sleep(SWEEP_S)
        try:
            await rw.serving.tick()
        except Exception:
            log.exception("remote write: the serving tick failed")

"""Mounts ``POST /api/v1/write`` (a thin wrapper over ``receiver.Receiver``) and exposes its
counters on the app's /metrics registry (``app.state.metrics_registry``, when the API part
created one)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator

from fastapi import APIRouter, FastAPI
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gpufleet.collector.routes import collector_for

from .receiver import Receiver

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
    return rw


async def write(request: Request) -> Response:
    rw = receiver_for(request.app)
    headers = {k: v.decode("latin-1") for k, v in request.scope["headers"] if k in _HEADERS}
    try:
        status, body, extra = await rw.handle(headers, request.stream, request.query_params.get("cluster"))
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
            req = CounterMetricFamily("gpufleet_remote_write_requests", "Remote-write requests by HTTP status",
                                      labels=["status"])
            for status, n in sorted(s.requests.items()):
                req.add_metric([str(status)], n)
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
        yield from (req, ign, drop, samples, rows, dup, again, colls, known)


def _register_metrics(app: FastAPI, rw: Receiver) -> None:
    reg = getattr(app.state, "metrics_registry", None)
    if reg is not None and not getattr(rw, "_metrics_registered", False):
        reg.register(RemoteWriteMetrics(rw))
        rw._metrics_registered = True  # type: ignore[attr-defined]  # a marker set on the instance at runtime


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Mounted after the API part, whose lifespan creates the /metrics registry.
    _register_metrics(app, receiver_for(app))
    yield

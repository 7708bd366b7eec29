"""Starts the exporter with the collector (when ``GPUFLEET_EXPORT_URL`` is set), hooks it onto
the write queue's commits and puts its queue on /metrics. No HTTP routes of its own."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from fastapi import APIRouter, FastAPI
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpufleet.collector.routes import collector_for

from .exporter import Exporter, ExportSettings

router = APIRouter()


def _data_dir(app: FastAPI) -> Path:
    return Path(app.state.settings.database.data_dir)


class ExportMetrics(Collector):
    def __init__(self, ex: Exporter) -> None:
        self.ex = ex

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        ex = self.ex
        files, nbytes, samples = ex.spool.depth
        for name, doc, v in (
                ("gpufleet_export_queue_bodies", "Remote-write bodies waiting to be sent", files),
                ("gpufleet_export_queue_bytes", "Bytes of the on-disk export queue", nbytes),
                ("gpufleet_export_queue_max_bytes", "Bound of the on-disk export queue", ex.settings.queue_bytes),
                ("gpufleet_export_queue_samples", "Samples waiting to be sent", samples),
                ("gpufleet_export_lag_seconds", "Age of the oldest unsent body (0 when the queue is empty)",
                 ex.spool.oldest_age(time.time())),
                ("gpufleet_export_last_success_timestamp_seconds", "When the receiver last accepted a body",
                 ex.last_success)):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], v)
            yield g
        sent = CounterMetricFamily("gpufleet_export_samples_sent", "Samples the receiver accepted")
        sent.add_metric([], ex.sent_samples)
        yield sent
        fails = CounterMetricFamily("gpufleet_export_send_failures", "Sends that will be retried (5xx, 429, network)")
        fails.add_metric([], ex.send_failures)
        yield fails
        drop = CounterMetricFamily("gpufleet_export_dropped_samples",
                                   "Samples never exported, by reason (queue_full, rejected, busy: rows)",
                                   labels=["reason"])
        for reason, n in sorted(ex.dropped_total().items()):
            drop.add_metric([reason], n)
        yield drop


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = ExportSettings.of(app.state.settings.export)
    if not settings.url:
        yield
        return
    coll = collector_for(app)
    ex = Exporter(settings, settings.queue_dir or _data_dir(app) / "export-queue")
    ex.start()
    app.state.exporter = ex
    coll.writer.on_commit = ex.offer
    reg = getattr(app.state, "metrics_registry", None)
    metrics = ExportMetrics(ex)
    if reg is not None:
        reg.register(metrics)
    try:
        yield
    finally:
        # Drain the write queue first, so what it commits during shutdown is still exported
        # (GroupWriter.stop is idempotent: the collector's own lifespan stops it again).
        await asyncio.get_running_loop().run_in_executor(None, coll.writer.stop)
        coll.writer.on_commit = None
        await asyncio.get_running_loop().run_in_executor(None, ex.stop)
        if reg is not None:
            reg.unregister(metrics)

"""The service's own Prometheus metrics, in a registry owned by the app (``app.state``), never
the process-global one: two apps in one process (tests) don't share or clash counters.

``TimedRoute`` is the route class of every API router: it times each request under its path
template and turns query errors (``BadRequest``, values the database refuses) into 400s."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import DataError

from .metrics_share import SharedMetrics, exposition
from .queries.common import BadRequest

_lock = threading.Lock()


class _DbGauges(Collector):
    """Fleet-level gauges read from the database at scrape time (cheap counts)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from gpufleet.storage.models import Flag, Gpu, Job, JobReport

        try:
            with self.app.state.engine.connect() as c:
                running = c.execute(select(func.count(Job.id)).where(Job.state == "running")).scalar_one()
                flags = c.execute(select(func.count(Flag.id)).where(Flag.open.is_(True))).scalar_one()
                gpus = c.execute(select(func.count(Gpu.id))).scalar_one()
                # newest sample of a running job the analysis has not covered yet (PrometheusRule
                # GpufleetAnalysisLagging); a job never analysed counts from its start
                lag = c.execute(select(func.max(Job.last_sample_ts - func.coalesce(
                    JobReport.analyzed_until, Job.start_ts, Job.last_sample_ts)))
                    .select_from(Job).outerjoin(JobReport, JobReport.job_pk == Job.id)
                    .where(Job.state == "running")).scalar_one()
        except Exception:  # a scrape must not fail because the DB is down; /readyz reports that
            up = GaugeMetricFamily("gpufleet_api_database_up", "1 if the last scrape could query the database")
            up.add_metric([], 0)
            yield up
            return
        up = GaugeMetricFamily("gpufleet_api_database_up", "1 if the last scrape could query the database")
        up.add_metric([], 1)
        yield up
        for name, doc, v in (("gpufleet_jobs_running", "Jobs in state running", running),
                             ("gpufleet_flags_open", "Open goodput flags", flags),
                             ("gpufleet_gpus_known", "GPUs the fleet has reported", gpus),
                             ("gpufleet_analysis_lag_seconds", "How far analysis trails the newest sample of a "
                              "running job (max over jobs)", max(0.0, float(lag or 0.0)))):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], v)
            yield g


class ApiMetrics:
    """``registry``: this process's own metrics (other parts register theirs in it too);
    ``db_registry``: the database gauges, the same whichever process computes them. With
    ``serve --workers N`` (``http.metrics_dir`` set) ``shared`` adds the other processes'."""

    def __init__(self, app: FastAPI) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("gpufleet_api_requests", "API requests by route and status",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("gpufleet_api_request_seconds", "API request latency by route", ["method", "route"],
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                                 registry=self.registry)
        self.db_registry = CollectorRegistry(auto_describe=True)
        self.db_registry.register(_DbGauges(app))
        settings = getattr(app.state, "settings", None)
        share_dir = settings.http.metrics_dir if settings is not None else ""
        self.shared = SharedMetrics(self.registry, Path(share_dir)) if share_dir else None
        if self.shared is not None:
            self.shared.start()

    def exposition(self) -> bytes:
        """The /metrics body: this process's metrics (and, shared, every other process's), then
        the database gauges once (two expositions concatenate: their family names differ)."""
        own = exposition(self.shared.families()) if self.shared is not None else generate_latest(self.registry)
        return own + generate_latest(self.db_registry)


def metrics_for(app: FastAPI) -> ApiMetrics:
    m = getattr(app.state, "api_metrics", None)
    if m is None:
        with _lock:
            m = getattr(app.state, "api_metrics", None)
            if m is None:
                m = ApiMetrics(app)
                # collectors that parts whose lifespans run before this one left for it (the
                # collector's write queue); later parts register in metrics_registry directly
                for c in getattr(app.state, "metrics_collectors", ()):
                    m.registry.register(c)
                app.state.api_metrics = m
                # other parts may add their own collectors to the same per-app registry
                app.state.metrics_registry = m.registry
    return m


class TimedRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()
        route = self.path

        async def handler(request: Request) -> Response:
            t0 = time.perf_counter()
            status = 500
            try:
                resp = await original(request)
                status = resp.status_code
                return resp
            except BadRequest as e:
                status = 400
                return JSONResponse({"detail": str(e)}, status_code=400)
            except DataError as e:  # e.g. a value PostgreSQL cannot represent: the caller's fault
                status = 400
                return JSONResponse({"detail": f"invalid value: {e.orig}"}, status_code=400)
            except HTTPException as e:
                status = e.status_code
                raise
            except RequestValidationError:
                status = 422
                raise
            finally:
                m = metrics_for(request.app)
                m.requests.labels(request.method, route, str(status)).inc()
                m.latency.labels(request.method, route).observe(time.perf_counter() - t0)

        return handler

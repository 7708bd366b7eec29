"""The agent's own Prometheus metrics (health) and the latest GPU readings, per Agent.

Each Agent gets its own ``CollectorRegistry`` (``gpufleet up`` runs many agents in one
process; a global registry would mix them). The HTTP endpoint starts only when a port is
configured. GPU fields are exposed as ``gpufleet_gpu_<field>`` in catalog units, labelled
with the job id, and optionally under their DCGM names and units so dashboards built for
dcgm-exporter keep working.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpufleet.catalog import CATALOG
from gpufleet.protocol import GpuInfo

from .sources.base import GpuReading
from .sources.nvml import SLOW_EVERY_S, SLOW_FIELDS

log = logging.getLogger(__name__)


# Lifetime counters a source reads less often than every cycle (the NVML source: energy and
# PCIe replays every 10 s). A scrape shows their last reading for this long, so the series
# stay continuous for Prometheus (a gap would break rate() on the energy counter); batches
# to the collector carry them only when read.
HELD_FIELDS = SLOW_FIELDS
HELD_MAX_AGE_S = 3 * SLOW_EVERY_S


class _GpuCollector(Collector):
    def __init__(self, node: str, dcgm_names: bool) -> None:
        self.node = node
        self.dcgm_names = dcgm_names
        self._lock = threading.Lock()
        self._snapshot: tuple[dict[str, GpuInfo], list[GpuReading], dict[str, str]] = ({}, [], {})
        self._held: dict[tuple[str, str], tuple[float, float]] = {}  # (uuid, field) -> (value, monotonic t)

    def update(self, devices: dict[str, GpuInfo], readings: list[GpuReading], gpu_job: dict[str, str],
               now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        shown = []
        for r in readings:
            held: dict[str, float] = {}
            for name in HELD_FIELDS:
                key = (r.uuid, name)
                if name in r.values:
                    self._held[key] = (r.values[name], now)
                elif key in self._held:
                    value, t = self._held[key]
                    if now - t <= HELD_MAX_AGE_S:
                        held[name] = value
                    else:
                        del self._held[key]
            shown.append(GpuReading(r.uuid, {**r.values, **held}, r.pids) if held else r)
        with self._lock:
            self._snapshot = (devices, shown, dict(gpu_job))

    def describe(self) -> list[Any]:
        return []  # unchecked collector: families depend on what the GPUs report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            devices, readings, gpu_job = self._snapshot
        labels = ["gpu", "uuid", "model", "node", "job"]
        fams: dict[str, GaugeMetricFamily] = {}
        dcgm: dict[str, GaugeMetricFamily] = {}
        for r in readings:
            info = devices.get(r.uuid)
            idx = "" if info is None else str(info.index)
            if info is not None and info.mig_profile:
                idx = f"{idx}/{info.mig_profile}"
            lv = [idx, r.uuid, info.model if info else "", self.node, gpu_job.get(r.uuid, "")]
            for name, value in r.values.items():
                f = CATALOG.by_name.get(name)
                if f is None:
                    continue
                fam = fams.get(name)
                if fam is None:
                    fam = fams[name] = GaugeMetricFamily(f"gpufleet_gpu_{name}", f"{f.description} ({f.unit})",
                                                         labels=labels)
                fam.add_metric(lv, value)
                if self.dcgm_names and f.dcgm:
                    dname = f.dcgm[0]
                    d = dcgm.get(dname)
                    if d is None:
                        d = dcgm[dname] = GaugeMetricFamily(
                            dname, f.description, labels=["gpu", "UUID", "modelName", "Hostname", "hpc_job"])
                    d.add_metric([idx, r.uuid, lv[2], self.node, lv[4]], value / f.dcgm_scale)
        yield from fams.values()
        yield from dcgm.values()


class AgentMetrics:
    """Counters the agent updates; ``registry`` can be scraped or served over HTTP."""

    def __init__(self, node: str, registry: CollectorRegistry | None = None, dcgm_names: bool = False) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=False)
        r = self.registry
        self.samples = Counter("gpufleet_agent_samples", "GPU samples taken (rows).", registry=r)
        self.cycles = Counter("gpufleet_agent_cycles", "Sample cycles run.", registry=r)
        self.cycle_failures = Counter("gpufleet_agent_cycle_failures",
                                      "Sample cycles that raised (logged with a traceback once a minute).", registry=r)
        self.batches_spooled = Counter("gpufleet_agent_batches_spooled", "Batches written to the spool.", registry=r)
        self.batches_sent = Counter("gpufleet_agent_batches_sent", "Batches the collector acknowledged.", registry=r)
        self.rows_sent = Counter("gpufleet_agent_rows_sent", "Rows in acknowledged batches.", registry=r)
        self.duplicates = Counter("gpufleet_agent_batches_duplicate",
                                  "Acknowledged batches the collector already had (a lost ack retried).", registry=r)
        self.send_failures = Counter("gpufleet_agent_send_failures", "Failed delivery attempts by reason.",
                                     ["reason"], registry=r)
        self.dead_letters = Counter("gpufleet_agent_batches_dead_lettered",
                                    "Batches the collector rejected for good (in the dead-letter dir).", registry=r)
        self.refused_records = Counter("gpufleet_agent_records_refused", "Side records (progress, collectives, "
                                       "nics, gpu_nics) the collector refused alone, kept in the dead-letter dir; "
                                       "the rest of their batch was stored.", ["section"], registry=r)
        self.dropped_batches = Counter("gpufleet_agent_batches_dropped", "Batches dropped because the spool was full.",
                                       registry=r)
        self.dropped_rows = Counter("gpufleet_agent_rows_dropped", "Rows dropped because the spool was full.",
                                    registry=r)
        self.disk_errors = Counter("gpufleet_agent_disk_errors", "Failed writes to the journal or spool (disk full, "
                                   "permissions).", ["what"], registry=r)
        self.spool_batches = Gauge("gpufleet_agent_spool_batches", "Batches waiting in the spool.", registry=r)
        self.spool_bytes = Gauge("gpufleet_agent_spool_bytes", "Bytes used by the spool.", registry=r)
        self.source_errors = Gauge("gpufleet_agent_source_errors",
                                   "Errors the GPU source reported (NVML calls that failed other than "
                                   "NOT_SUPPORTED, scrape failures), since start.", registry=r)
        self.gpus = Gauge("gpufleet_agent_gpus", "GPUs (and MIG instances) answering this cycle.", registry=r)
        self.loop_lag = Histogram("gpufleet_agent_loop_lag_seconds", "How late each sample cycle started.",
                                  buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0), registry=r)
        self.cycle_seconds = Histogram("gpufleet_agent_cycle_seconds", "Wall time of one sample cycle.",
                                       buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0), registry=r)
        # Read at scrape time, so a loop stuck in a hung NVML call still shows up (growing age).
        self.last_cycle_end = time.monotonic()
        self.last_cycle_age = Gauge("gpufleet_agent_last_cycle_age_seconds",
                                    "Seconds since the last sample cycle finished (alert when it grows).", registry=r)
        self.last_cycle_age.set_function(lambda: time.monotonic() - self.last_cycle_end)
        self.clock_skew = Gauge("gpufleet_agent_clock_skew_seconds",
                                "This node's clock minus the collector's (from the HTTP Date header).", registry=r)
        self.gpu = _GpuCollector(node, dcgm_names)
        r.register(self.gpu)
        self._server: Any = None

    # callbacks from the sender and spool
    def skew(self, seconds: float | None) -> None:
        if seconds is not None:
            self.clock_skew.set(seconds)

    def sent(self, rows: int, duplicate: bool) -> None:
        self.batches_sent.inc()
        self.rows_sent.inc(rows)
        if duplicate:
            self.duplicates.inc()

    def send_failed(self, reason: str) -> None:
        self.send_failures.labels(reason).inc()

    def dead_lettered(self, rows: int) -> None:
        self.dead_letters.inc()

    def refused(self, section: str, n: int) -> None:
        self.refused_records.labels(section).inc(n)

    def dropped(self, batches: int, rows: int) -> None:
        self.dropped_batches.inc(batches)
        self.dropped_rows.inc(rows)

    def watch_inspector(self, source: Any) -> None:
        """Expose an NCCL Inspector source's own counters (agent/sources/nccl_inspector.py), read
        at scrape time: an operator sees malformed or truncated Inspector output, read errors and
        files over the per-poll budget without reading the agent's log."""
        self.registry.register(_InspectorCollector(source))

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Start the /metrics endpoint; returns the port (useful with port 0)."""
        from prometheus_client import start_http_server

        started = start_http_server(port, addr=addr, registry=self.registry)
        if isinstance(started, tuple):
            self._server = started[0]
            return int(self._server.server_port)
        return port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


# (metric suffix, InspectorSource attribute, help): the counters the source keeps as it reads.
_INSPECTOR_COUNTERS = (
    ("records", "records", "NCCL Inspector records folded into collectives."),
    ("bad_lines", "bad_lines", "Inspector lines that were not valid records (skipped, logged)."),
    ("long_lines", "long_lines", "Inspector lines over the length limit (skipped)."),
    ("truncations", "truncations", "Inspector files that shrank under the agent (re-read from the start)."),
    ("read_errors", "read_errors", "Failed reads of Inspector files."),
)


class _InspectorCollector(Collector):
    def __init__(self, source: Any) -> None:
        self.source = source

    def describe(self) -> list[Any]:
        return []  # read at collect time only: the source's counters move between scrapes

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        for suffix, attr, doc in _INSPECTOR_COUNTERS:
            c = CounterMetricFamily(f"gpufleet_agent_nccl_inspector_{suffix}", doc)
            c.add_metric([], float(getattr(self.source, attr)))
            yield c
        g = GaugeMetricFamily("gpufleet_agent_nccl_inspector_files", "Inspector files followed now.")
        g.add_metric([], float(len(self.source.files)))
        yield g
        g = GaugeMetricFamily("gpufleet_agent_nccl_inspector_files_over_limit",
                              "Inspector files not read this poll (over the per-poll byte budget).")
        g.add_metric([], float(self.source.files_over_limit))
        yield g

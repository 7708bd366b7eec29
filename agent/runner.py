"""The agent loop: sample every ``interval_s``, attribute, journal, batch every ``flush_s``
into the durable spool; a sender thread delivers the spool to the collector.

``gpufleet up`` runs many ``Agent`` instances in threads of one process, so an Agent owns
no process-global state: its registry, spool, HTTP client and threads are its own.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet import __version__
from gpufleet.protocol import AgentInfo, Allocation, Event, GpuInfo, JobInfo, encode

from .attribution import Attributor, build_attributors, merge
from .batching import Journal, OpenBatch, Row
from .config import AgentConfig
from .metrics import AgentMetrics
from .sender import Sender
from .serving_section import ServingSection
from .sources.base import GpuReading, Source, SourceAttribution
from .sources.fabric_sections import build_fabric
from .spool import Spool

__all__ = ["Agent", "AgentConfig", "Sample"]

log = logging.getLogger(__name__)

DEVICES_TTL_S = 30.0  # re-enumerate GPUs this often (hot-plug, MIG reconfiguration)
SHUTDOWN_DRAIN_S = 5.0
MAX_REMEMBERED_ALLOCATIONS = 4096


class Enricher(Protocol):
    """Adds node-level fields (InfiniBand rates) to the readings of a cycle."""

    def augment(self, devices: list[GpuInfo], readings: list[GpuReading], now: float) -> None: ...


@dataclass(slots=True)
class Sample:
    """Everything one cycle saw (what ``--once --print`` shows)."""

    ts: float
    devices: list[GpuInfo]
    readings: list[GpuReading]
    attribution: SourceAttribution
    events: list[Event] = field(default_factory=list)


class Agent:
    def __init__(self, config: AgentConfig, source: Source, attributors: list[Attributor] | None = None,
                 clock: Callable[[], float] = time.time, *, enrichers: Sequence[Enricher] | None = None,
                 metrics: AgentMetrics | None = None, opener: Callable[..., Any] = open) -> None:
        self.config = config
        self.source = source
        self.clock = clock
        # The simulator carries its own ground truth; reading this host's /proc for it would be wrong.
        if attributors is None:
            attributors = [] if getattr(source, "name", "") == "simulator" else build_attributors(config, source)
        self.attributors = attributors
        self.enrichers = list(enrichers) if enrichers is not None else default_enrichers(config, source)
        self.metrics = metrics or AgentMetrics(config.node, dcgm_names=config.metrics_dcgm_names)
        self.spool = Spool(config.spool_dir, config.spool_max_bytes, fsync=config.fsync,
                           on_drop=self.metrics.dropped, opener=opener,
                           memory_max_bytes=config.spool_memory_max_bytes,
                           on_disk_error=lambda e: self._disk_error("spool", e))
        self.sender = Sender(self.spool, config.collector_url, token=config.token, timeout_s=config.timeout_s,
                             backoff_base_s=config.backoff_base_s, backoff_max_s=config.backoff_max_s,
                             retry_after_max_s=config.retry_after_max_s, metrics=self.metrics)
        self.journal = Journal(self.spool.journal_path, opener)
        self.boot_id = uuid.uuid4().hex
        self.seq = 0
        self._open: OpenBatch | None = None
        self._devices: dict[str, GpuInfo] = {}
        self._devices_at = -1e18
        self._alloc_since: dict[tuple[str, str], float] = {}
        self._started = False
        self._last_disk_log = -1e18
        self._last_cycle_log = -1e18
        self.last: Sample | None = None
        self.progress: Any = None  # agent.progress_relay.ProgressRelay, when one listens (attach())
        # NCCL collectives, NIC health, GPU <-> NIC rails (agent/sources/fabric_sections.py)
        self.fabric: Any = build_fabric(config, source)
        if self.fabric is not None and self.fabric.inspector is not None:
            self.metrics.watch_inspector(self.fabric.inspector)
        # inference engines' own metrics -> /api/v1/serving/minutes, in a spool of its own (docs/serving.md)
        self.serving: ServingSection | None = None
        if config.serving_rules or config.serving_discover or config.serving_pods != "off":
            self.serving = ServingSection(config, metrics=self.metrics)

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Recover what a previous run left (open journal -> spool) and open a batch."""
        if self._started:
            return
        self.spool.lock()
        self._started = True
        left = self.journal.recover()
        if left is not None and not left.empty():
            self._spool(left)
            log.info("recovered %d rows the previous agent run had not flushed (batch %s:%d)",
                     left.n_rows, left.agent.boot_id, left.agent.seq)
        self.journal.discard()
        self._open_batch()
        self._update_spool_gauges()

    def run(self, stop: threading.Event) -> None:
        """Sample until ``stop`` is set; then flush, try to deliver for a few seconds, return.
        What is not delivered stays in the spool for the next start."""
        self.start()
        sender_stop = threading.Event()
        sender = threading.Thread(target=self.sender.run, args=(sender_stop,),
                                  name=f"gpufleet-sender-{self.config.node}", daemon=True)
        sender.start()
        serving_thread = None
        if self.serving is not None:
            serving_thread = threading.Thread(target=self.serving.sender.run, args=(sender_stop,),
                                              name=f"gpufleet-serving-sender-{self.config.node}", daemon=True)
            serving_thread.start()
        if self.config.metrics_port is not None:
            port = self.metrics.serve(self.config.metrics_port, self.config.metrics_addr)
            log.info("agent metrics on http://%s:%d/metrics", self.config.metrics_addr, port)
        interval = self.config.interval_s
        next_t = time.monotonic()
        try:
            while not stop.is_set():
                delay = next_t - time.monotonic()
                if delay > 0 and stop.wait(delay):
                    break
                lag = max(0.0, time.monotonic() - next_t)
                self.metrics.loop_lag.observe(lag)
                try:
                    self.cycle(self.clock())
                except Exception:  # a bad read must not end the agent; the next cycle tries again
                    self.metrics.cycle_failures.inc()
                    now_m = time.monotonic()
                    if now_m - self._last_cycle_log > 60:
                        self._last_cycle_log = now_m
                        log.exception("sample cycle failed on %s (next attempt in %.3g s)", self.config.node,
                                      interval)
                next_t += interval
                behind = time.monotonic() - next_t
                if behind > interval:  # fell behind (suspended, overloaded): skip, don't burst
                    next_t += interval * int(behind / interval)
                if self._open is not None and time.monotonic() - self._open_started_m >= self.config.flush_s - 1e-3:
                    self.flush()
        finally:
            sender_stop.set()
            self.sender.wake.set()
            sender.join(self.config.timeout_s + 1)
            if self.serving is not None and serving_thread is not None:
                self.serving.sender.wake.set()
                serving_thread.join(self.config.timeout_s + 1)
            if self.progress is not None:  # its open windows go with the last batch
                self.progress.flush_into(self)
            self.flush()
            self.sender.stopping = True
            self.sender.drain(SHUTDOWN_DRAIN_S)
            if len(self.spool):
                log.info("agent %s stopped: %d batches (%d rows) stay in %s for the next start", self.config.node,
                         len(self.spool), self.spool.pending_rows, self.spool.dir)
            self._update_spool_gauges()
            if self.serving is not None:  # whole minutes only: an open minute is lost, as a restart loses it
                self.serving.sender.stopping = True
                self.serving.sender.drain(SHUTDOWN_DRAIN_S)
                self.serving.close()
            self.journal.close()
            self.sender.close()
            self.metrics.stop()
            self.spool.unlock()
            try:
                self.source.close()
            except Exception as e:  # closing must not hide why we stopped
                log.warning("closing source %s: %s", getattr(self.source, "name", "?"), e)

    # --- one cycle -----------------------------------------------------------------------

    def devices(self, now_m: float | None = None) -> dict[str, GpuInfo]:
        now_m = time.monotonic() if now_m is None else now_m
        if now_m - self._devices_at >= DEVICES_TTL_S:
            self._devices = {d.uuid: d for d in self.source.devices()}
            self._devices_at = now_m
        return self._devices

    def sample(self, now: float) -> Sample:
        """Read the source, enrich, attribute; no side effects on batches or the spool."""
        devices = self.devices()
        readings = self.source.read(now)
        if any(r.uuid not in devices for r in readings):
            self._devices_at = -1e18
            devices = self.devices()
        dev_list = list(devices.values())
        for e in self.enrichers:
            e.augment(dev_list, readings, now)
        attribution = self.source.attribution(now)
        for a in self.attributors:
            try:
                merge(attribution, a.attribute(dev_list, readings, now))
            except Exception as e:  # one broken attributor must not stop sampling
                log.warning("attributor %s failed: %s", a.name, e, exc_info=log.isEnabledFor(logging.DEBUG))
        events = self.source.drain_events()
        return Sample(now, dev_list, readings, attribution, events)

    def cycle(self, now: float) -> Sample:
        """Sample once and add the rows to the open batch (journaled)."""
        if not self._started:
            self.start()
        t0 = time.perf_counter()
        s = self.sample(now)
        gpu_job = s.attribution.gpu_job
        rows = [Row(r.uuid, gpu_job.get(r.uuid), r.values) for r in s.readings]
        jobs: dict[str, JobInfo] = {}
        allocations: list[Allocation] = []
        for gpu, job_id in gpu_job.items():
            info = s.attribution.jobs.get(job_id) or JobInfo(job_id=job_id)
            jobs[job_id] = info
            since = self._alloc_since.get((gpu, job_id))
            if since is None:
                start = info.start_ts
                since = start if start is not None and 946684800 < start <= now else now  # the collector refuses others
                self._alloc_since[(gpu, job_id)] = since
            allocations.append(Allocation(gpu_uuid=gpu, job_id=job_id, since=since))
        if len(self._alloc_since) > MAX_REMEMBERED_ALLOCATIONS:  # months of short jobs: forget ended ones
            self._alloc_since = {(a.gpu_uuid, a.job_id): a.since for a in allocations}
        assert self._open is not None
        progress = self.progress.drain(now) if self.progress is not None else []
        part = self._open.new_part(now, rows, s.devices, jobs.values(), allocations, s.events, progress)
        if self.fabric is not None:
            self.fabric.fill(part, now, s.devices, s.readings)
        try:
            self.journal.append(part)
        except OSError as e:  # disk full or gone: keep sampling, the spool write will say more
            self._disk_error("journal", e)
        else:
            if self.fabric is not None:  # journaled: the Inspector offsets may move past it
                self.fabric.committed()
        self._open.add(part)
        m = self.metrics
        m.cycles.inc()
        m.samples.inc(len(rows))
        m.gpus.set(len(rows))
        m.source_errors.set(getattr(self.source, "errors", 0))
        m.gpu.update({d.uuid: d for d in s.devices}, s.readings, gpu_job)
        took = time.perf_counter() - t0
        m.cycle_seconds.observe(took)
        m.last_cycle_end = time.monotonic()
        if took > 10 * self.config.interval_s:
            log.warning("sample cycle on %s took %.1f s (interval %.3g s): a source call is slow or hung",
                        self.config.node, took, self.config.interval_s)
        self.last = s
        if self.serving is not None:
            try:
                self.serving.cycle(now, gpu_job, s.readings)
            except Exception:  # serving is a side section: it must never cost a GPU row
                log.warning("serving scrape on %s failed", self.config.node, exc_info=True)
        return s

    # --- batches -------------------------------------------------------------------------

    def _open_batch(self) -> None:
        info = AgentInfo(boot_id=self.boot_id, seq=self.seq, node=self.config.node, cluster=self.config.cluster,
                         version=__version__)
        self.seq += 1
        self._open = OpenBatch(info, started=self.clock())
        self._open_started_m = time.monotonic()
        try:
            self.journal.start(info)
        except OSError as e:
            self._disk_error("journal", e)

    def flush(self) -> bool:
        """Close the open batch into the spool and open the next; False if it was empty. While
        the disk refuses writes the spool holds the batch in memory (bounded, drops counted)."""
        if self._open is None or self._open.empty():
            if self._open is not None:
                self._open_started_m = time.monotonic()
            return False
        self._spool(self._open)
        self._open_batch()  # truncates the journal: the batch is safe in the spool now
        self._update_spool_gauges()
        self.sender.wake.set()
        return True

    def _disk_error(self, what: str, e: OSError) -> None:
        self.metrics.disk_errors.labels(what).inc()
        now = time.monotonic()
        if now - self._last_disk_log > 60:
            self._last_disk_log = now
            log.error("cannot write the %s under %s (%s): sampling goes on, batches wait in memory (%d, %.1f MiB "
                      "of %.0f MiB) and go back to disk when it has room; free space or fix permissions", what,
                      self.config.spool_dir, e, self.spool.memory_batches, self.spool.memory_bytes / 2**20,
                      self.spool.memory_max_bytes / 2**20)

    def _spool(self, ob: OpenBatch) -> None:
        batch = ob.build(sent_at=self.clock())
        compress: Any = None if self.config.compress == "none" else self.config.compress
        body, headers = encode(batch, compress=compress, packed=self.config.packed)
        if self.spool.put(body, headers, batch.idempotency_key, batch.n_rows()) is not None:
            self.metrics.batches_spooled.inc()

    def _update_spool_gauges(self) -> None:
        self.metrics.spool_batches.set(len(self.spool))
        self.metrics.spool_bytes.set(self.spool.pending_bytes)


def default_enrichers(cfg: AgentConfig, source: Source) -> list[Enricher]:
    if not cfg.infiniband or getattr(source, "name", "") == "simulator":
        return []
    from .sources.infiniband import InfinibandSampler

    ib = InfinibandSampler(sys_root=cfg.sys_root, gpu_pci=getattr(source, "pci_bus_ids", None))
    return [ib] if ib.ports() else []

"""GPU readings from a dcgm-exporter already running on the node (scrape its /metrics).

Parsing (``parse_exposition``) is separate from I/O and tested on real captured dumps.
Old and DCGM 4.6 field names map to catalog fields through the catalog; values are scaled
to catalog units (% -> ratio, MiB -> bytes, mJ -> J). A rate field dcgm-exporter exposes as
a counter becomes bytes/s from two scrapes. The ``pod``/``namespace``/``container``
labels (1.x: ``pod_name``/``pod_namespace``/``container_name``) and ``hpc_job`` are
attribution; ``GPU_I_ID``/``GPU_I_PROFILE`` make a MIG instance its own row.

dcgm-exporter collects every 30 s by default: run it with ``-c 1000`` for 1 Hz data.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.dcgm import FB_FREE as _FB_FREE
from gpufleet.dcgm import FB_RESERVED as _FB_RESERVED
from gpufleet.dcgm import field_for, gpu_identity, job_from_labels
from gpufleet.pod_jobs import DEFAULT as DEFAULT_POD_JOBS
from gpufleet.pod_jobs import PodJobs
from gpufleet.protocol import Event, GpuInfo, JobInfo

from .base import GpuReading, SourceAttribution

log = logging.getLogger(__name__)



@dataclass
class ExporterGpu:
    """One GPU (or MIG instance) in one scrape."""

    uuid: str
    index: int
    model: str = ""
    mig_profile: str | None = None
    parent_uuid: str | None = None
    gi_id: int | None = None
    values: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # rate fields exposed as counters (raw)
    fb_free_bytes: float | None = None
    fb_reserved_bytes: float = 0.0
    job: JobInfo | None = None

    def info(self) -> GpuInfo:
        total = self.values.get("fb_total_bytes")
        if total is None and self.fb_free_bytes is not None and "fb_used_bytes" in self.values:
            total = self.values["fb_used_bytes"] + self.fb_free_bytes + self.fb_reserved_bytes
        return GpuInfo(index=self.index, uuid=self.uuid, model=self.model, mig_profile=self.mig_profile,
                       parent_uuid=self.parent_uuid, memory_total_bytes=total)


def parse_exposition(text: str, pod_jobs: PodJobs = DEFAULT_POD_JOBS) -> dict[str, ExporterGpu]:
    """GPUs by uuid from a Prometheus text exposition. Series without a GPU identity
    (label-less dummies in real dumps) and fields outside the catalog are skipped. A pod's
    job is its owner where ``pod_jobs`` reads one from the pod's name."""
    gpus: dict[str, ExporterGpu] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            f = field_for(name)
            if f is None and name not in (_FB_FREE, _FB_RESERVED):
                continue
            lab = s.labels
            ident = gpu_identity(lab)
            if ident is None:
                continue
            g = gpus.get(ident.uuid)
            if g is None:
                g = gpus[ident.uuid] = ExporterGpu(uuid=ident.uuid, index=ident.index, model=ident.model,
                                                   mig_profile=ident.mig_profile, parent_uuid=ident.parent_uuid,
                                                   gi_id=ident.gi_id)
            if g.job is None:
                g.job = job_from_labels(lab, pod_jobs)
            value = float(s.value)
            if value != value:  # NaN: the exporter had no value this round
                continue
            if f is None:
                if name == _FB_FREE:
                    g.fb_free_bytes = value * 1048576.0
                else:
                    g.fb_reserved_bytes = value * 1048576.0
                continue
            if fam.type == "counter" and f.unit.endswith("/s"):
                g.counters[f.name] = value * f.dcgm_scale
            else:
                g.values[f.name] = value * f.dcgm_scale
    return gpus


class DcgmExporterSource:
    name = "dcgm-exporter"

    def __init__(self, url: str = "http://localhost:9400/metrics", timeout_s: float = 5.0,
                 client: object | None = None, pod_jobs: PodJobs = DEFAULT_POD_JOBS) -> None:
        import httpx

        self.pod_jobs = pod_jobs
        self.url = url
        self.client = client or httpx.Client(timeout=timeout_s)
        self.errors = 0
        self._last: dict[str, ExporterGpu] = {}
        self._prev_counters: dict[tuple[str, str], tuple[float, float]] = {}
        self._last_error_log = 0.0
        self._xid_seen: dict[str, float] = {}
        self._events: list[Event] = []

    def scrape(self) -> dict[str, ExporterGpu] | None:
        import httpx

        try:
            resp = self.client.get(self.url)  # type: ignore[attr-defined]
            resp.raise_for_status()
            return parse_exposition(resp.text, self.pod_jobs)
        except (httpx.HTTPError, ValueError) as e:
            self.errors += 1
            now = time.monotonic()
            if now - self._last_error_log > 60:
                self._last_error_log = now
                log.warning("dcgm-exporter at %s: %s (no readings until it answers)", self.url, e)
            return None

    def devices(self) -> list[GpuInfo]:
        if not self._last:
            self._last = self.scrape() or {}
        return [g.info() for g in self._last.values()]

    def read(self, now: float) -> list[GpuReading]:
        got = self.scrape()
        if got is None:
            return []
        self._last = got
        out = []
        for g in got.values():
            values = dict(g.values)
            for fname, raw in g.counters.items():
                prev = self._prev_counters.get((g.uuid, fname))
                self._prev_counters[(g.uuid, fname)] = (now, raw)
                if prev is not None and now > prev[0] and raw >= prev[1]:
                    values[fname] = (raw - prev[1]) / (now - prev[0])
            xid = values.get("xid_last")
            if xid and self._xid_seen.get(g.uuid) != xid:
                self._events.append(Event(ts=now, kind="xid", gpu_uuid=g.uuid, code=int(xid),
                                          message="DCGM_FI_DEV_XID_ERRORS changed"))
            if xid is not None:
                self._xid_seen[g.uuid] = xid
            out.append(GpuReading(uuid=g.uuid, values=values))
        return out

    def gpu_instance_ids(self) -> dict[str, int]:
        return {g.uuid: g.gi_id for g in self._last.values() if g.gi_id is not None}

    def drain_events(self) -> list[Event]:
        ev, self._events = self._events, []
        return ev

    def attribution(self, now: float) -> SourceAttribution:
        a = SourceAttribution()
        for g in self._last.values():
            if g.job is not None:
                a.jobs.setdefault(g.job.job_id, g.job)
                a.gpu_job[g.uuid] = g.job.job_id
        return a

    def close(self) -> None:
        self.client.close()  # type: ignore[attr-defined]

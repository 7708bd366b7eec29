"""Remote-write series -> protocol v1 batches: pure logic, no HTTP and no database.

A series is recognised once (``SeriesMap``: labels bytes -> ``Mapped`` or the reason it is
ignored) and then found by a dict lookup. Samples are regrouped into one row per (GPU,
timestamp) with the fields present and one ``Batch`` per node, keyed for idempotency by the
request body's digest and the node's position in it: Prometheus retries a failed request
with the very same bytes, so a retry carries the same keys and is acknowledged as a duplicate
instead of being stored twice (docs/prometheus.md, "Idempotency").

What is not a reading is never turned into one: NaN (Prometheus' staleness marker included),
a value outside the catalog's range, a counter's first sample (no rate yet) or a counter
reset all leave the field missing for that row, and are counted.

NCCL Inspector's Prometheus mode (``nccl_*`` series from node-exporter's textfile collector) is
folded into the protocol's ``collectives`` section by the agent's own fold (``gpufleet.nccl_fold``):
the three metrics of one label set at one timestamp are one record; the textfile is a snapshot
rewritten every dump and scraped again and again, so a (node, communicator, rank, collective,
size) counts each ``coll_sn`` once (without ``coll_sn``: each change of its values once). Like a
counter's previous sample, the last ``coll_sn`` is per process and updated only once a request
is stored (``SnapshotState``).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpufleet import dcgm
from gpufleet.catalog import Field
from gpufleet.collector.serving_remote_write import PREFIX_TUPLE as SERVING_PREFIXES
from gpufleet.collector.serving_remote_write import ServingSeries, serving_series
from gpufleet.nccl_fold import PROM_METRICS, PROM_NOT_IDENTITY, Aggregator, record_from_prom
from gpufleet.pod_jobs import DEFAULT as DEFAULT_POD_JOBS
from gpufleet.pod_jobs import PodJobs
from gpufleet.protocol import AgentInfo, Batch, CollectiveAgg, GpuInfo, JobInfo

from . import budget
from .wire import COUNTER, WriteRequest, labels_of

# Label names that name the node, most explicit first. dcgm-exporter's own is ``Hostname``;
# a relabel rule (or kube-prometheus' ``node``) overrides it.
NODE_LABELS = ("gpufleet_node", "node", "kubernetes_node", "Hostname", "instance")
# NCCL Inspector's Prometheus mode (node-exporter textfile collector): the three metrics the fold
# uses (PROM_METRICS) are stored; other nccl_* series (counts, p2p) are counted and ignored.
NCCL_PREFIX = "nccl_"
# The Inspector's own labels name its host ``hostname`` (older plugins) or ``node`` (newer).
NCCL_NODE_LABELS = ("gpufleet_node", "node", "kubernetes_node", "hostname", "Hostname", "instance")
SERIES_CACHE_MAX = 200_000
VERSION = "remote-write"


@dataclass(frozen=True, slots=True)
class Mapped:
    """What a recognised GPU series is: its catalog field (or an FB extra), GPU, node, job."""

    name: str
    field: Field | None  # None: FB_FREE / FB_RESERVED (only used to derive the memory total)
    gpu: dcgm.GpuIdentity
    node: str
    job: JobInfo | None
    total_suffix: bool  # named *_total: a counter whatever the metadata says
    rate_field: bool = False  # the catalog field is a rate (unit .../s): a counter becomes one


# Why a series is ignored (the /metrics label and the answer's counts).
NOT_GPU_METRIC = "not_gpu_metric"
NO_GPU_IDENTITY = "no_gpu_identity"
NO_NODE = "no_node"
NCCL_NOT_USED = "nccl_metric_not_used"
BAD_LABELS = "bad_labels"


@dataclass(frozen=True, slots=True)
class NcclSeries:
    """A recognised NCCL Inspector Prometheus-mode series: which value of a record it carries,
    the labels naming its collective (``ident``: every label but the name and the dump's
    ``timestamp``), node and job."""

    kind: str  # "exec", "busbw" or "algbw" (nccl_fold.PROM_METRICS)
    ident: tuple[tuple[str, str], ...]
    node: str
    job: JobInfo | None


def _node_of(labels: dict[str, str], names: tuple[str, ...]) -> str:
    node = ""
    for k in names:
        node = labels.get(k, "").strip()
        if node:
            break
    if node and node == labels.get("instance", "").strip() and ":" in node:
        node = node.rsplit(":", 1)[0]  # instance is host:port
    return node


def _nccl_series(kind: str, labels: dict[str, str], pod_jobs: PodJobs) -> NcclSeries | str:
    node = _node_of(labels, NCCL_NODE_LABELS)
    if not node:
        return NO_NODE
    job = dcgm.job_from_labels(labels, pod_jobs) if labels.get("gpufleet_job", "").strip() else None
    slurm = labels.get("slurm_job_id", "").strip()
    if job is None and slurm.isdigit():
        job = JobInfo(job_id=slurm, source="slurm")
    ident = tuple(sorted((k, v) for k, v in labels.items() if k != "__name__" and k not in PROM_NOT_IDENTITY))
    return NcclSeries(kind, ident, node, job)


def map_series(labels: dict[str, str],
               pod_jobs: PodJobs = DEFAULT_POD_JOBS) -> Mapped | NcclSeries | ServingSeries | str:
    """``pod_jobs``: which job a pod's name says it belongs to (setting ``kubernetes_job_patterns``,
    the same rules and variable as the agent's). An inference engine's series is a ``ServingSeries``
    (or the reason it cannot be used) for collector/serving_remote_write.py, never a GPU row."""
    name = labels.get("__name__", "")
    f = dcgm.field_for(name)
    if f is None and name not in dcgm.FB_EXTRA:
        kind = PROM_METRICS.get(name)
        if kind is not None:
            return _nccl_series(kind, labels, pod_jobs)
        if name.startswith(SERVING_PREFIXES):  # an inference engine's: the serving fold's (one check per label set)
            return serving_series(labels, pod_jobs) or NOT_GPU_METRIC
        return NCCL_NOT_USED if name.startswith(NCCL_PREFIX) else NOT_GPU_METRIC
    ident = dcgm.gpu_identity(labels)
    if ident is None:
        return NO_GPU_IDENTITY
    node = _node_of(labels, NODE_LABELS)
    if not node:
        return NO_NODE
    return Mapped(name, f, ident, node, dcgm.job_from_labels(labels, pod_jobs), name.endswith("_total"),
                  f is not None and f.unit.endswith("/s"))


class SeriesMap:
    """Labels bytes -> Mapped | reason, bounded (cleared when full: a cache, not state)."""

    def __init__(self, max_entries: int = SERIES_CACHE_MAX, pod_jobs: PodJobs = DEFAULT_POD_JOBS,
                 max_bytes: int = budget.SERIES_BYTES) -> None:
        self.max_entries = max_entries
        self.pod_jobs = pod_jobs
        self._d: dict[bytes, Mapped | NcclSeries | ServingSeries | str] = {}
        self.budget = budget.ByteBudget("series", max_bytes)

    def get(self, key: bytes) -> Mapped | NcclSeries | ServingSeries | str:
        hit = self._d.get(key)
        if hit is None:
            try:
                hit = map_series(labels_of(key), self.pod_jobs)
            except ValueError:
                hit = BAD_LABELS
            if len(self._d) >= self.max_entries:
                self._d.clear()
                self.budget.evictions += 1
                self.budget.reset()
            # a label set costs about twice its encoding (the parsed labels in the Mapped record)
            if self.budget.charge(budget.entry_bytes(key, key)):
                self._d.clear()
            self._d[key] = hit
        return hit

    def __len__(self) -> int:
        return len(self._d)

    @property
    def known(self) -> dict[bytes, Mapped | NcclSeries | ServingSeries | str]:
        """The cached label encodings (for ``wire.decode``'s fast path; read-only use)."""
        return self._d


@dataclass
class RateState:
    """The last raw value of every counter series (per process): a counter's rate needs the
    sample before it, which arrived in an earlier request. Updated only after a request is
    stored, so a retried request computes exactly the rates the first attempt did."""

    last: dict[tuple[str, str, str], tuple[float, float]] = field(default_factory=dict)
    counter_families: dict[str, bool] = field(default_factory=dict)  # from WriteRequest metadata
    max_entries: int = 500_000
    families_budget: budget.ByteBudget = field(default_factory=lambda: budget.ByteBudget("families",
                                                                                        budget.FAMILY_BYTES))

    def note_family(self, family: str, is_counter: bool) -> None:
        """Metadata says whether ``family`` counts; bounded in bytes (senders choose the names)."""
        fams = self.counter_families
        if fams.get(family) is is_counter:
            return
        if family not in fams and self.families_budget.charge(budget.entry_bytes(family)):
            fams.clear()
        fams[family] = is_counter

    def commit(self, updates: dict[tuple[str, str, str], tuple[float, float]]) -> None:
        if len(self.last) + len(updates) > self.max_entries:
            self.last.clear()
        for k, v in updates.items():
            old = self.last.get(k)
            if old is None or v[0] > old[0]:
                self.last[k] = v


# (cluster, node, the collective's labels without coll_sn) -> the last coll_sn counted, or the
# values of the last snapshot counted when the plugin writes no coll_sn
SnapshotKey = tuple[str, str, tuple[tuple[str, str], ...]]
SnapshotToken = int | tuple[float, float | None]


@dataclass
class SnapshotState:
    """NCCL Inspector snapshots already counted, and the GPUs each node's batches last named
    (a node whose request carries only NCCL series still names its GPUs' rows). Per process,
    updated after a request is stored, like ``RateState``."""

    last: dict[SnapshotKey, SnapshotToken] = field(default_factory=dict)
    gpus: dict[tuple[str, str, int], GpuInfo] = field(default_factory=dict)  # (cluster, node, index)
    max_entries: int = 200_000

    def commit(self, last: dict[SnapshotKey, SnapshotToken], gpus: dict[tuple[str, str, int], GpuInfo]) -> None:
        if len(self.last) + len(last) > self.max_entries:
            self.last.clear()
        if len(self.gpus) + len(gpus) > self.max_entries:
            self.gpus.clear()
        self.last.update(last)
        self.gpus.update(gpus)


def _repeated(prev: SnapshotToken | None, token: SnapshotToken) -> bool:
    if prev is None:
        return False
    if isinstance(prev, int) and isinstance(token, int):
        return token <= prev
    return prev == token


@dataclass
class Conversion:
    batches: list[Batch]
    series: int = 0
    samples: int = 0
    stored_values: int = 0
    ignored: Counter[str] = field(default_factory=Counter)  # series by reason
    dropped: Counter[str] = field(default_factory=Counter)  # samples by reason
    rate_updates: dict[tuple[str, str, str], tuple[float, float]] = field(default_factory=dict)
    prepared: list[Any] = field(default_factory=list)  # the batches as the write path's Prepared
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (status, detail) of refused batches
    nccl_records: int = 0  # NCCL Inspector records folded into collectives
    snapshot_updates: dict[SnapshotKey, SnapshotToken] = field(default_factory=dict)
    gpu_updates: dict[tuple[str, str, int], GpuInfo] = field(default_factory=dict)
    columnar: bool = False  # converted by columnar.convert_columnar (the answer says which path)
    # inference engines' series with their samples (collector/serving_remote_write.py folds them)
    serving: list[tuple[ServingSeries, list[tuple[int, float]]]] = field(default_factory=list)
    serving_finished: list[Any] = field(default_factory=list)  # replica-minutes the fold finished
    serving_held: int = 0  # of their samples, those the fold holds (2.0's Samples-Written counts them)
    # samples kept without becoming a row's value (framebuffer free/reserved -> the GPU's memory
    # total, NCCL series -> collectives), by node: remote write 2.0's Samples-Written counts them
    folded: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, object]:
        return {"series": self.series, "samples": self.samples, "values": self.stored_values,
                "columnar": self.columnar,
                "rows": sum(b.n_rows() for b in self.batches), "nodes": len(self.batches),
                "collectives": sum(len(b.collectives) for b in self.batches), "nccl_records": self.nccl_records,
                "ignored_series": dict(self.ignored), "dropped_samples": dict(self.dropped)}


@dataclass
class _Node:
    gpus: dict[str, dcgm.GpuIdentity] = field(default_factory=dict)
    rows: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    jobs: dict[tuple[str, int], JobInfo] = field(default_factory=dict)
    fb: dict[str, dict[str, float]] = field(default_factory=dict)  # uuid -> FB extras / used / total
    # NCCL: (collective labels, ts ms) -> {"exec"/"busbw"/"algbw": value}, and each label set's series
    nccl: dict[tuple[tuple[tuple[str, str], ...], int], dict[str, float]] = field(default_factory=dict)
    nccl_series: dict[tuple[tuple[str, str], ...], NcclSeries] = field(default_factory=dict)


def convert(req: WriteRequest, series_map: SeriesMap, rates: RateState, *, cluster: str, digest: str,
            now: float, max_age_s: float | None, max_future_s: float, max_rows: int,
            snapshots: SnapshotState | None = None) -> Conversion:
    """The request's GPU samples as per-node batches (``digest`` keys them, see module doc), NCCL
    Inspector series as those batches' ``collectives``."""
    snapshots = snapshots if snapshots is not None else SnapshotState()
    for fam, kind in req.metadata.items():
        rates.note_family(fam, kind == COUNTER)
    conv = Conversion([])
    nodes: dict[str, _Node] = {}
    lo = -math.inf if max_age_s is None else (now - max_age_s) * 1000.0
    hi = (now + max_future_s) * 1000.0
    pending = conv.rate_updates
    families = rates.counter_families
    for s in req.series:
        conv.series += 1
        conv.samples += len(s.samples)
        m = series_map.get(s.key)
        if isinstance(m, str):
            conv.ignored[m] += 1
            continue
        if not isinstance(m, Mapped):
            if isinstance(m, NcclSeries):
                _add_nccl(conv, nodes, m, s.samples, lo, hi)
            else:
                conv.serving.append((m, s.samples))
                if s.histograms:
                    conv.dropped["histogram"] += s.histograms
            continue
        if s.histograms:
            conv.dropped["histogram"] += s.histograms
        f = m.field
        uuid = m.gpu.uuid
        node = nodes.get(m.node)
        if node is None:
            node = nodes[m.node] = _Node()
        node.gpus.setdefault(uuid, m.gpu)
        is_rate = m.rate_field and (
            m.total_suffix or families.get(m.name, False) or families.get(m.name.removesuffix("_total"), False))
        for ts_ms, raw in s.samples:
            if raw != raw:  # NaN, Prometheus' staleness marker among them: no reading
                conv.dropped["nan_or_stale"] += 1
                continue
            if ts_ms < lo:
                conv.dropped["too_old"] += 1
                continue
            if ts_ms > hi:
                conv.dropped["in_future"] += 1
                continue
            if f is None:  # framebuffer free / reserved, MiB
                node.fb.setdefault(uuid, {})[m.name] = raw * dcgm.MIB
                conv.folded[m.node] += 1
                continue
            if is_rate:
                k = (cluster, uuid, f.name)
                t = ts_ms / 1000.0
                prev = pending.get(k) or rates.last.get(k)
                pending[k] = (t, raw)
                if prev is None or t <= prev[0]:
                    conv.dropped["counter_first_sample"] += 1
                    continue
                if raw < prev[1]:
                    conv.dropped["counter_reset"] += 1
                    continue
                value = (raw - prev[1]) / (t - prev[0]) * f.dcgm_scale
            else:
                value = raw * f.dcgm_scale
            if not f.min <= value <= f.max or (f.dtype == "i8" and value != int(value)):
                conv.dropped["outside_catalog_range"] += 1
                continue
            key = (uuid, ts_ms)
            row = node.rows.get(key)
            if row is None:
                row = node.rows[key] = {}
            if m.job is not None and key not in node.jobs:
                node.jobs[key] = m.job
            row[f.name] = value
            conv.stored_values += 1
            if f.name in ("fb_used_bytes", "fb_total_bytes"):
                node.fb.setdefault(uuid, {})[f.name] = value
    for i, name in enumerate(sorted(nodes)):
        n = nodes[name]
        colls, jobs = _collectives(conv, name, n, cluster, snapshots) if n.nccl else ([], [])
        conv.batches.extend(_batches(name, n, cluster, digest, i, now, max_rows, colls, jobs, conv.gpu_updates))
    return conv


def _add_nccl(conv: Conversion, nodes: dict[str, _Node], m: NcclSeries, samples: list[tuple[int, float]],
              lo: float, hi: float) -> None:
    node = nodes.get(m.node)
    if node is None:
        node = nodes[m.node] = _Node()
    node.nccl_series.setdefault(m.ident, m)
    for ts_ms, raw in samples:
        if raw != raw:
            conv.dropped["nan_or_stale"] += 1
        elif ts_ms < lo:
            conv.dropped["too_old"] += 1
        elif ts_ms > hi:
            conv.dropped["in_future"] += 1
        else:
            node.nccl.setdefault((m.ident, ts_ms), {})[m.kind] = raw
            conv.folded[m.node] += 1


def _collectives(conv: Conversion, node: str, n: _Node, cluster: str,
                 snapshots: SnapshotState) -> tuple[list[CollectiveAgg], list[JobInfo]]:
    """The node's NCCL records, each snapshot counted once, folded into 10 s aggregates."""
    agg = Aggregator()
    by_index = {g.index: g.uuid for g in n.gpus.values() if g.index >= 0}
    jobs: dict[str, JobInfo] = {}
    pending = conv.snapshot_updates
    for ident, ts_ms in sorted(n.nccl, key=lambda k: k[1]):  # in time order, as the snapshots were taken
        series = n.nccl_series[ident]
        rec = record_from_prom(dict(ident), n.nccl[(ident, ts_ms)], ts_ms / 1000.0)
        if rec is None:
            conv.dropped["nccl_not_a_record"] += 1
            continue
        key: SnapshotKey = (cluster, node, tuple(kv for kv in ident if kv[0] != "coll_sn"))
        token: SnapshotToken = rec.sn if rec.sn is not None else (rec.exec_us, rec.busbw_gbs)
        if _repeated(pending.get(key, snapshots.last.get(key)), token):
            conv.dropped["nccl_snapshot_already_counted"] += 1
            continue
        pending[key] = token
        gpu: str | None = None
        if rec.gpu_index is not None:
            gpu = by_index.get(rec.gpu_index)
            if gpu is None and (known := snapshots.gpus.get((cluster, node, rec.gpu_index))) is not None:
                # named by an earlier request's DCGM series: listed again so the row finds its GPU
                gpu = known.uuid
                n.gpus.setdefault(known.uuid, dcgm.GpuIdentity(uuid=known.uuid, index=known.index,
                                                               model=known.model, mig_profile=known.mig_profile,
                                                               parent_uuid=known.parent_uuid))
                if known.memory_total_bytes is not None:
                    n.fb.setdefault(known.uuid, {"fb_total_bytes": known.memory_total_bytes})
        if series.job is not None:
            jobs.setdefault(series.job.job_id, series.job)
        agg.add(rec, series.job.job_id if series.job else None, gpu)
        conv.nccl_records += 1
    return agg.drain(math.inf), list(jobs.values())


def _memory_total(fb: dict[str, float] | None) -> float | None:
    if not fb:
        return None
    if "fb_total_bytes" in fb:
        return fb["fb_total_bytes"]
    if "fb_used_bytes" in fb and dcgm.FB_FREE in fb:
        return fb["fb_used_bytes"] + fb[dcgm.FB_FREE] + fb.get(dcgm.FB_RESERVED, 0.0)
    return None


def _batches(node: str, n: _Node, cluster: str, digest: str, ordinal: int, now: float, max_rows: int,
             collectives: list[CollectiveAgg], nccl_jobs: list[JobInfo],
             gpu_updates: dict[tuple[str, str, int], GpuInfo]) -> list[Batch]:
    if not n.rows and not collectives:
        return []
    gpus = [GpuInfo(index=g.index, uuid=g.uuid, model=g.model, mig_profile=g.mig_profile,
                    parent_uuid=g.parent_uuid, memory_total_bytes=_memory_total(n.fb.get(u)))
            for u, g in sorted(n.gpus.items())]
    for g in gpus:
        if g.index >= 0:
            gpu_updates[(cluster, node, g.index)] = g
    keys = sorted(n.rows)
    if not keys:  # NCCL series only: one batch with the collectives and no rows
        return [Batch(agent=AgentInfo(boot_id=f"rw-{digest}", seq=ordinal << 20, node=node, cluster=cluster,
                                      version=VERSION, sent_at=now),
                      gpus=gpus, jobs=nccl_jobs, collectives=collectives)]
    out = []
    # Rows beyond the per-batch limit go in further batches; seq keeps every key distinct and
    # stable: ordinal * 2^20 + chunk (a request never holds 2^20 chunks for one node).
    for c in range(0, len(keys), max_rows):
        chunk = keys[c:c + max_rows]
        fields = sorted({f for k in chunk for f in n.rows[k]})
        samples: dict[str, list[float | int | str | None]] = {
            "ts": [k[1] / 1000.0 for k in chunk], "gpu": [k[0] for k in chunk]}
        jobs_col = [n.jobs[k].job_id if k in n.jobs else None for k in chunk]
        if any(j is not None for j in jobs_col):
            samples["job"] = list(jobs_col)
        for fname in fields:
            samples[fname] = [n.rows[k].get(fname) for k in chunk]
        by_id = {n.jobs[k].job_id: n.jobs[k] for k in chunk if k in n.jobs}
        if c == 0:  # the collectives travel with the node's first batch
            for j in nccl_jobs:
                by_id.setdefault(j.job_id, j)
        out.append(Batch(agent=AgentInfo(boot_id=f"rw-{digest}", seq=(ordinal << 20) + c // max_rows, node=node,
                                         cluster=cluster, version=VERSION, sent_at=now),
                         gpus=gpus, jobs=list(by_id.values()), samples=samples,
                         collectives=collectives if c == 0 else []))
    return out

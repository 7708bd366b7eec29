"""Serving series arriving by Prometheus remote write -> the same replica-minutes the agent's scrape
sends (docs/serving.md, "Remote write"). The receiver (collector/remote_write/receiver.py) hands
each body's serving series to ``ServingRemoteWrite`` and stores the minutes it finishes through the
agent's intake checks (``collector.serving_routes.check_minute``) and storage path.

A series is a serving series when its name starts with an engine's prefix (``vllm:``, ``sglang:``,
``tgi_``, ``nv_inference_``, ``dynamo_frontend_``): one prefix check, made once per label set
(the receiver's series map caches the answer). Its replica is ``namespace/pod`` when Prometheus's
Kubernetes discovery labelled it, else its ``instance``; its deployment is the
``gpufleet_deployment`` label (relabel ``gpufleet.io/deployment`` into it), else
``app_kubernetes_io_name`` or ``app``, else the pod name without its ReplicaSet hashes; its job is
the one the GPU series of the same pod are attributed to (``dcgm.job_from_labels``: a
``gpufleet_job`` relabel, else the pod's job by gpufleet/pod_jobs.py). The samples of one replica
that share a timestamp are one scrape.

A minute of a replica is finished when a scrape of that replica at or after the minute's end has
been folded (a scrape is folded ``grace_s`` after a newer one of the replica arrived, so the
parts of one scrape that other bodies or shards carry are in it); a replica silent for
``silence_s`` has its minutes finished and its state forgotten. State is per process and per
cluster, bounded in bytes (``budget``).
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet import dcgm
from gpufleet.collector.intake_schema import text_problem
from gpufleet.collector.remote_write import budget
from gpufleet.pod_jobs import DEFAULT as DEFAULT_POD_JOBS
from gpufleet.pod_jobs import PodJobs
from gpufleet.serving_expo import Hist, Sample, Snapshot, add_hists, delta, measures_to_json, snapshot
from gpufleet.serving_metrics import ServingRegistry, serving_registry

PREFIXES = (("vllm:", "vllm"), ("sglang:", "sglang"), ("tgi_", "tgi"), ("nv_inference_", "triton"),
            ("dynamo_frontend_", "dynamo"))
PREFIX_TUPLE = tuple(p for p, _ in PREFIXES)  # for one str.startswith per series
# labels that name where a series came from, not what it measures (left out of the engine's samples)
IDENTITY = {"__name__", "job", "instance", "namespace", "pod", "container", "gpufleet_deployment",
            "app_kubernetes_io_name", "app", "endpoint", "service", "gpufleet_job", "gpufleet_user"}
_HASHES = re.compile(r"(-[a-z0-9]{8,10})?-[a-z0-9]{5}$")
NAME_MAX = 253  # deployment / replica columns (storage/serving_models.py)
JOB_MAX = 255  # the job_id column

# Why a serving series is dropped (the receiver counts them as ignored series under these reasons)
NO_REPLICA = "serving_no_replica"
BAD_IDENTITY = "serving_bad_identity"
BAD_BUCKET = "serving_bad_bucket"
NOT_USED = "serving_metric_not_used"

Key = tuple[str, str, str]  # (deployment, replica, engine)
StateKey = tuple[str, str, str, str]  # (cluster, deployment, replica, engine)


def engine_of(name: str) -> str | None:
    return next((e for p, e in PREFIXES if name.startswith(p)), None)


def replica_of(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(deployment, replica) of a series, or None when it names neither a pod nor an instance."""
    ns, pod = labels.get("namespace"), labels.get("pod")
    replica = f"{ns}/{pod}" if ns and pod else labels.get("instance")
    if not replica:
        return None
    deployment = (labels.get("gpufleet_deployment") or labels.get("app_kubernetes_io_name") or labels.get("app")
                  or (_HASHES.sub("", pod) if pod else replica))
    return deployment, replica


@dataclass(frozen=True, slots=True)
class ServingSeries:
    """A recognised serving series (cached per label set by the receiver's series map)."""

    key: Key
    name: str
    own: tuple[tuple[str, str], ...]  # the labels the engine's measures read (le, model_name, ...)
    job: str | None  # the job the GPU attribution gives the replica's pod, when its labels name one

    def cost(self) -> int:
        """Bytes a pending sample of this series holds (the byte budget's estimate)."""
        return budget.ENTRY_OVERHEAD + len(self.name) + sum(len(k) + len(v) + 64 for k, v in self.own)


_USED: dict[str, tuple[str, ...]] = {}


def _used_names(engine: str, reg: ServingRegistry) -> tuple[str, ...]:
    names = _USED.get(engine)
    if names is None:
        names = _USED[engine] = tuple({m.name for m in reg.engine(engine).metrics})
    return names


def serving_series(labels: Mapping[str, str], pod_jobs: PodJobs = DEFAULT_POD_JOBS,
                   registry: ServingRegistry | None = None) -> ServingSeries | str | None:
    """None: not a serving series; a reason (str): a serving series that cannot be used (dropped and
    counted); else the series' replica, engine, labels and job."""
    name = labels.get("__name__", "")
    if not name.startswith(PREFIX_TUPLE):
        return None
    engine = engine_of(name)
    assert engine is not None
    if not name.startswith(_used_names(engine, registry or serving_registry())):
        return NOT_USED
    who = replica_of(labels)
    if who is None:
        return NO_REPLICA
    if any(text_problem(v, 1, NAME_MAX) for v in who):
        return BAD_IDENTITY
    own = tuple(sorted((k, v) for k, v in labels.items() if k not in IDENTITY))
    if name.endswith("_bucket"):
        le = labels.get("le")
        if le is None:
            return BAD_BUCKET
        try:
            if math.isnan(float(le)):
                return BAD_BUCKET
        except ValueError:
            if le.strip().lower() not in ("+inf", "inf"):
                return BAD_BUCKET
    job = dcgm.job_from_labels(labels, pod_jobs)
    if job is not None and text_problem(job.job_id, 1, JOB_MAX):
        return BAD_IDENTITY
    return ServingSeries((*who, engine), name, own, job.job_id if job is not None else None)


@dataclass(frozen=True, slots=True)
class Finished:
    """One replica-minute ready to store (its GPUs are the caller's to attribute)."""

    cluster: str
    deployment: str
    replica: str
    engine: str
    minute: int
    measures: Snapshot
    job: str | None

    def record(self, gpu_uuids: list[str] | None, node: str | None = None) -> dict[str, Any]:
        """collector/serving_routes.py's record; ``gpu_uuids`` None: the replica's GPUs are not known
        (stored as ``gpus`` 0 and ``gpu_uuids`` null)."""
        rec = {"deployment": self.deployment, "replica": self.replica, "minute": self.minute, "engine": self.engine,
               "gpus": len(gpu_uuids or []), "gpu_uuids": gpu_uuids, "job_id": self.job,
               "measures": measures_to_json(self.measures)}
        if node is not None:
            rec["node"] = node
        return rec


class _Minute:
    """One minute's deltas added up as ``serving_expo.fold`` adds them (counters and histograms sum,
    gauges average), kept as running sums rather than a list of every scrape's delta."""

    __slots__ = ("gauges", "sums")

    def __init__(self) -> None:
        self.sums: Snapshot = {}
        self.gauges: dict[str, tuple[float, int]] = {}

    def add(self, d: Snapshot, reg: ServingRegistry) -> None:
        for name, value in d.items():
            if reg.measures[name].kind == "gauge":
                if not isinstance(value, Hist):
                    s, n = self.gauges.get(name, (0.0, 0))
                    self.gauges[name] = (s + float(value), n + 1)
                continue
            have = self.sums.get(name)
            if have is None:
                self.sums[name] = value
            elif isinstance(have, Hist) and isinstance(value, Hist):
                self.sums[name] = add_hists(have, value)
            elif not isinstance(have, Hist) and not isinstance(value, Hist):
                self.sums[name] = float(have) + float(value)

    def result(self) -> Snapshot:
        out = dict(self.sums)
        for name, (s, n) in self.gauges.items():
            out[name] = s / n
        return out

    def cost(self) -> int:
        return _snap_cost(self.sums) + 96 * len(self.gauges)


def _snap_cost(snap: Mapping[str, Any]) -> int:
    # (a histogram: its object, two tuples of floats; measured with tracemalloc on CPython 3.11)
    return sum(budget.ENTRY_OVERHEAD + (128 * len(v.bounds) if isinstance(v, Hist) else 0) for v in snap.values())


class ServingRemoteWrite:
    """Serving series of remote-write bodies -> replica-minutes. Prometheus splits one scrape's series
    across several bodies (and shards), so a scrape (replica, timestamp) is assembled until a body
    brings that replica's samples at least ``grace_s`` newer, or until it is older than that at a
    drain; only then is it folded (a late part of an already folded scrape is dropped and counted:
    ``late_samples``, which also counts a resent body's samples). Not thread-safe: the receiver
    holds a lock around it."""

    def __init__(self, grace_s: float = 5.0, silence_s: float = 180.0, max_minutes: int = 60,
                 max_bytes: int = budget.SERVING_BYTES, pod_jobs: PodJobs = DEFAULT_POD_JOBS,
                 registry: ServingRegistry | None = None) -> None:
        self.grace_s = grace_s
        self.silence_s = silence_s
        self.max_minutes = max_minutes
        self.pod_jobs = pod_jobs
        self.registry = registry or serving_registry()
        self.budget = budget.ByteBudget("serving", max_bytes)
        # (cluster, deployment, replica, engine) -> ts ms -> (series name, labels) -> (sample, its bytes)
        self._pending: dict[StateKey, dict[int, dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Sample, int]]]] = {}
        self._pending_cost = 0
        self._newest: dict[StateKey, int] = {}  # newest sample (ms) seen of each replica
        self._last: dict[StateKey, tuple[float, Snapshot]] = {}  # newest folded scrape
        self._minutes: dict[StateKey, dict[int, _Minute]] = {}
        self._jobs: dict[StateKey, str | None] = {}
        self._seen: dict[StateKey, float] = {}  # when (wall clock) samples of each replica last arrived
        self._state_cost: dict[StateKey, int] = {}
        self._state_total = 0
        self._done: list[Finished] = []
        self.late_samples = 0  # arrived after their scrape was folded (a late shard, or a resent body)
        self.samples = 0  # samples taken into a scrape
        self.dropped: Counter[str] = Counter()  # samples and series dropped, by reason
        self.lost_minutes = 0  # open minutes emptied to stay within the byte budget

    # --- intake -------------------------------------------------------------------------------

    def add(self, series: Iterable[tuple[Mapping[str, str], Sequence[tuple[int, float]]]],
            cluster: str = "default") -> int:
        """Take one body's series as label maps; returns how many were serving series (usable or not)."""
        items = []
        n = 0
        for labels, samples in series:
            m = serving_series(labels, self.pod_jobs, self.registry)
            if m is None:
                continue
            n += 1
            if isinstance(m, str):
                self.dropped[m] += 1
            else:
                items.append((m, samples))
        self.add_mapped(items, cluster)
        return n

    def add_mapped(self, items: Iterable[tuple[ServingSeries, Sequence[tuple[int, float]]]], cluster: str,
                   lo_ms: float = -math.inf, hi_ms: float = math.inf, now: float | None = None) -> int:
        """Take one body's recognised serving series (the receiver's path); samples outside
        [``lo_ms``, ``hi_ms``] (the receiver's age limits) are dropped and counted. ``now``: the
        arrival time (wall clock) the silence sweep measures from. Returns how many samples are held
        (taken now, or already by an earlier copy of the same scrape still being assembled)."""
        held = 0
        arrived = time.time() if now is None else now
        touched: set[StateKey] = set()
        for m, samples in items:
            key = (cluster, *m.key)
            last = self._last.get(key)
            cost = m.cost()
            for ts, value in samples:
                if value != value:
                    continue  # Prometheus's staleness marker: the series ended, no value
                if not math.isfinite(value):
                    self.dropped["not_finite"] += 1
                elif ts < lo_ms:
                    self.dropped["too_old"] += 1
                elif ts > hi_ms:
                    self.dropped["in_future"] += 1
                elif last is not None and ts / 1000.0 <= last[0]:
                    self.late_samples += 1
                else:
                    by_ts = self._pending.setdefault(key, {})
                    scrape = by_ts.setdefault(ts, {})
                    ident = (m.name, m.own)
                    held += 1
                    if ident in scrape:
                        self.late_samples += 1  # the same sample twice (a resent body): kept once
                        continue
                    scrape[ident] = (Sample(m.name, m.own, value), cost)
                    self._pending_cost += cost
                    self.samples += 1
                    if ts > self._newest.get(key, -1):
                        self._newest[key] = ts
                    touched.add(key)
                    if m.job is not None or key not in self._jobs:
                        self._jobs[key] = m.job
        for key in touched:
            self._seen[key] = arrived
            cutoff = self._newest[key] - self.grace_s * 1000
            self._fold_key(key, cutoff.__ge__)
            if key in self._last:
                self._finish(key, self._last[key][0])
        self._bound()
        return held

    def _fold_key(self, key: StateKey, ready: Callable[[int], bool]) -> None:
        by_ts = self._pending.get(key)
        if not by_ts:
            return
        for ts in sorted(t for t in by_ts if ready(t)):
            scrape = by_ts.pop(ts)
            self._pending_cost -= sum(c for _, c in scrape.values())
            try:
                snap = snapshot((s for s, _ in scrape.values()), key[3], self.registry)
            except (ValueError, KeyError):  # a page the mapping cannot read: the scrape is dropped, counted
                self.dropped["unreadable_scrape"] += 1
                continue
            self._fold(key, ts / 1000.0, snap)
        if not by_ts:
            del self._pending[key]

    def _fold(self, key: StateKey, t: float, snap: Snapshot) -> None:
        """``serving_expo.MinuteFolder.add``: the delta against the replica's previous scrape goes to
        the minute its interval starts in."""
        prev = self._last.get(key)
        if prev is not None and t <= prev[0]:
            self.late_samples += 1
            return
        d = delta(prev[1] if prev else None, snap, self.registry)
        start = t if prev is None else prev[0]
        minutes = self._minutes.setdefault(key, {})
        minute = int(start // 60) * 60
        acc = minutes.get(minute)
        if acc is None:
            acc = minutes[minute] = _Minute()
        acc.add(d, self.registry)
        while len(minutes) > self.max_minutes:
            minutes.pop(min(minutes))
            self.lost_minutes += 1
        self._last[key] = (t, snap)
        cost = _snap_cost(snap) + sum(a.cost() for a in minutes.values()) + budget.ENTRY_OVERHEAD
        self._state_total += cost - self._state_cost.get(key, 0)
        self._state_cost[key] = cost

    def _finish(self, key: StateKey, until: float | None) -> None:
        """Hand out the replica's minutes that ended by ``until`` (None: every one)."""
        minutes = self._minutes.get(key)
        if not minutes:
            return
        for minute in sorted(m for m in minutes if until is None or m + 60 <= until):
            measures = minutes.pop(minute).result()
            if measures:
                cluster, deployment, replica, engine = key
                self._done.append(Finished(cluster, deployment, replica, engine, minute, measures,
                                           self._jobs.get(key)))

    def _bound(self) -> None:
        """Within the byte budget: past it, every replica's open state is emptied (counted)."""
        used = self._pending_cost + self._state_total
        if used <= self.budget.limit:
            self.budget.used = used
            return
        self.budget.evictions += 1
        self.lost_minutes += sum(len(v) for v in self._minutes.values())
        for d in (self._pending, self._newest, self._last, self._minutes, self._jobs, self._seen, self._state_cost):
            d.clear()  # type: ignore[attr-defined]  # a tuple of differently typed dicts: each has clear()
        self._pending_cost = self._state_total = 0
        self.budget.used = 0

    def _forget(self, key: StateKey) -> None:
        for d in (self._newest, self._last, self._minutes, self._jobs, self._seen):
            d.pop(key, None)  # type: ignore[attr-defined]  # a tuple of differently typed dicts: each has pop()
        self._state_total -= self._state_cost.pop(key, 0)

    # --- output -------------------------------------------------------------------------------

    def finished(self) -> list[Finished]:
        """The minutes finished since the last call (each once)."""
        out, self._done = self._done, []
        return out

    def sweep(self, now: float) -> None:
        """Finish what replicas silent for ``silence_s`` hold, and forget them."""
        for key in [k for k, t in self._seen.items() if now - t >= self.silence_s]:
            self._fold_key(key, lambda ts: True)
            self._finish(key, None)
            self._forget(key)
        self._bound()

    def flush(self) -> None:
        """Fold every pending scrape and finish every minute held, the open ones included (shutdown)."""
        for key in list(self._pending):
            self._fold_key(key, lambda ts: True)
        for key in list(self._minutes):
            self._finish(key, None)
        self._bound()

    def replicas(self) -> int:
        return len(self._newest)

    def drain_records(self, now: float, gpus_of: Callable[[str], list[str]]) -> list[dict[str, Any]]:
        """Intake records (collector/serving_routes.py's shape) of the minutes finished, and of those
        that ended before ``now``; ``gpus_of(job_id)`` is the GPU -> job attribution of the replica
        (called with the replica's name when its labels name no job)."""
        for key in list(self._pending):
            self._fold_key(key, lambda ts: now * 1000 - ts >= self.grace_s * 1000)
        for key in list(self._minutes):
            self._finish(key, now)
        return [f.record(gpus_of(f.job or f.replica)) for f in self.finished()]

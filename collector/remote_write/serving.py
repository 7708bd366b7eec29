"""The receiver's hook for inference engines' series (docs/serving.md, "Remote write").

The series map recognises a serving series once per label set (``mapping.map_series``); each
body's serving series reach ``ServingHook.fold`` (in the parse thread), which hands them to
collector/serving_remote_write.py. The replica-minutes it finishes are stored after the body's
GPU rows: their GPUs from the GPU -> job attribution in the database (``storage.serving.job_gpus``),
each record checked as the agent's intake checks it (``serving_routes.check_minute``) and written
by ``storage.serving.write_minutes`` (a minute written again replaces the stored one). A record
or measure refused is counted, never a 5xx; the body's other series are stored as ever.

State is per process (``serve --workers N``: see docs/serving.md) and bounded in bytes
(``budget.SERVING_BYTES``). Minutes whose write failed (database down) are kept, bounded, and
written on the next body or tick."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpufleet.collector.serving_remote_write import Finished, ServingRemoteWrite
from gpufleet.pod_jobs import PodJobs

from .mapping import Conversion

log = logging.getLogger(__name__)
SWEEP_S = 15.0  # how often silent replicas are looked for
MAX_UNSAVED = 20_000  # finished minutes kept while the database refuses them


class ServingHook:
    def __init__(self, engine_of: Any, pod_jobs: PodJobs, workers: int = 1) -> None:
        self._engine_of = engine_of  # () -> the SQLAlchemy engine (the collector's, looked up when storing)
        self.state = ServingRemoteWrite(pod_jobs=pod_jobs)
        self.lock = threading.Lock()
        self.workers = workers
        self._warned = False
        self._swept = 0.0
        self._unsaved: list[Finished] = []
        self.minutes: Counter[str] = Counter()  # finished minutes by outcome (stored, refused, lost, ...)
        self.refused_measures = 0
        self.store_failures = 0

    def fold(self, conv: Conversion, cluster: str, now: float, max_age_s: float | None, max_future_s: float) -> None:
        """The body's serving series into the fold (parse thread); ``conv.serving_finished`` gets the
        minutes that finished. A body without serving series costs one comparison."""
        if not conv.serving and (now - self._swept < SWEEP_S or not self.state.replicas()):
            return
        lo = -math.inf if max_age_s is None else (now - max_age_s) * 1000.0
        with self.lock:
            try:
                if conv.serving:
                    if self.workers > 1 and not self._warned:
                        self._warned = True
                        log.warning("remote write: serving series arrive at a collector of %d processes; each "
                                    "process folds the part it receives (docs/serving.md, \"Remote write\")",
                                    self.workers)
                    conv.serving_held = self.state.add_mapped(conv.serving, cluster, lo,
                                                              (now + max_future_s) * 1000.0, now)
                if now - self._swept >= SWEEP_S:
                    self._swept = now
                    self.state.sweep(now)
            except Exception:  # a bug in the fold must not cost the body its GPU rows (nor answer 5xx)
                log.exception("remote write: folding serving series failed; this body's are dropped")
                self.state.dropped["fold_error"] += len(conv.serving)
            conv.serving_finished = self.state.finished()

    async def store(self, finished: list[Finished]) -> None:
        """Write ``finished`` (and what an earlier write could not) off the event loop; never raises."""
        if not finished and not self._unsaved:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.write, finished)
        except Exception:  # (write catches what storing raises; this is the executor's own failure)
            log.exception("remote write: storing serving minutes failed")

    async def tick(self) -> None:
        """Silent replicas' minutes finished and stored; unsaved minutes retried."""
        now = time.time()
        with self.lock:
            if now - self._swept >= SWEEP_S:
                self._swept = now
                self.state.sweep(now)
            done = self.state.finished()
        await self.store(done)

    async def flush(self) -> None:
        """At shutdown: every minute held is stored, the open ones included (each has what it got)."""
        with self.lock:
            self.state.flush()
            done = self.state.finished()
        await self.store(done)

    def write(self, finished: list[Finished]) -> None:
        from gpufleet.collector.serving_routes import check_minute
        from gpufleet.storage.errors import is_transient

        with self.lock:
            todo, self._unsaved = self._unsaved + finished, []
        if not todo:
            return
        outcome: Counter[str] = Counter()
        by_cluster: dict[str, list[Finished]] = {}
        for f in todo:  # checked before the database sees them (a name PostgreSQL refuses fails a whole query)
            row, why = check_minute(f.record(None))
            if row is None:
                outcome["refused"] += 1
                log.warning("remote write: serving minute of %r refused: %s", f.replica[:100], why[:3])
            else:
                by_cluster.setdefault(f.cluster, []).append(f)
        refused_measures = 0
        try:
            refused_measures = self._write(by_cluster, outcome)
        except Exception as e:
            if is_transient(e):
                log.warning("remote write: storing %d serving minute(s) failed (%s); kept to retry", len(todo), e)
                with self.lock:
                    self.store_failures += 1
                    self._unsaved = [f for fs in by_cluster.values() for f in fs] + self._unsaved
                    if len(self._unsaved) > MAX_UNSAVED:
                        self.minutes["lost_unsaved"] += len(self._unsaved) - MAX_UNSAVED
                        del self._unsaved[:len(self._unsaved) - MAX_UNSAVED]
                    self.minutes.update(outcome)
                return
            # a record the database refuses: one by one, so it alone is lost (counted), never the others
            log.exception("remote write: storing serving minutes failed; storing them one by one")
            with self.lock:
                self.store_failures += 1
            for cluster, fs in by_cluster.items():
                for f in fs:
                    try:
                        refused_measures += self._write({cluster: [f]}, outcome)
                    except Exception:
                        log.exception("remote write: the database refused the serving minute of %r", f.replica[:100])
                        outcome["error"] += 1
        with self.lock:
            self.minutes.update(outcome)
            self.refused_measures += refused_measures

    def _write(self, by_cluster: dict[str, list[Finished]], outcome: Counter[str]) -> int:
        """One transaction: each minute's GPUs from the attribution, checked, written. Returns the
        measures left out; counts ``stored`` (and ``refused``) in ``outcome`` once committed."""
        from gpufleet.collector.serving_routes import check_minute
        from gpufleet.storage.serving import job_gpus, write_minutes

        counts: Counter[str] = Counter()
        refused_measures = 0
        with self._engine_of().begin() as conn:
            for cluster, fs in by_cluster.items():
                held = job_gpus(conn, cluster, {f.job for f in fs if f.job}, min(f.minute for f in fs),
                                max(f.minute for f in fs) + 60)
                rows = []
                for f in fs:
                    uuids, node = _gpus_in(held.get(f.job or ""), f.minute)
                    row, why = check_minute(f.record(uuids, node))
                    if row is None:
                        counts["refused"] += 1
                        continue
                    refused_measures += len(why)
                    rows.append(row)
                write_minutes(conn, cluster, rows)
                counts["stored"] += len(rows)
        outcome.update(counts)
        return refused_measures

    def unsaved(self) -> int:
        """Finished minutes waiting for the database."""
        return len(self._unsaved)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """/metrics families (routes.RemoteWriteMetrics)."""
        s = self.state
        with self.lock:
            samples = CounterMetricFamily("gpufleet_remote_write_serving_samples",
                                          "Samples of inference engines' series: folded into a scrape, or dropped "
                                          "by reason (late: their scrape was folded, or a resent body)",
                                          labels=["outcome"])
            samples.add_metric(["folded"], s.samples)
            samples.add_metric(["late"], s.late_samples)
            for reason, n in sorted(s.dropped.items()):
                samples.add_metric([reason], n)
            minutes = CounterMetricFamily("gpufleet_remote_write_serving_minutes",
                                          "Replica-minutes the serving fold finished, by outcome (stored; refused by "
                                          "the intake checks; error: the database refused it; lost: emptied for "
                                          "the byte bound or unsaved past its bound)", labels=["outcome"])
            for outcome, n in sorted((self.minutes + Counter({"lost_bound": s.lost_minutes})).items()):
                minutes.add_metric([outcome], n)
            measures = CounterMetricFamily("gpufleet_remote_write_serving_refused_measures",
                                           "Measures of stored serving minutes left out by the intake checks")
            measures.add_metric([], self.refused_measures)
            failures = CounterMetricFamily("gpufleet_remote_write_serving_store_failures",
                                           "Writes of serving minutes that failed (kept and retried)")
            failures.add_metric([], self.store_failures)
            replicas = GaugeMetricFamily("gpufleet_remote_write_serving_replicas",
                                         "Serving replicas this process is folding")
            replicas.add_metric([], s.replicas())
            unsaved = GaugeMetricFamily("gpufleet_remote_write_serving_unsaved_minutes",
                                        "Finished serving minutes waiting for the database")
            unsaved.add_metric([], self.unsaved())
        yield from (samples, minutes, measures, failures, replicas, unsaved)


def _gpus_in(held: list[tuple[str, str, float, float | None]] | None,
             minute: int) -> tuple[list[str] | None, str | None]:
    """The GPUs a job held during [minute, minute + 60) and their node when they share one;
    (None, None) when the attribution knows none (unknown, not zero GPUs)."""
    uuids = sorted({u for u, _, start, end in held or () if start < minute + 60 and (end is None or end > minute)})
    if not uuids:
        return None, None
    nodes = {n for u, n, start, end in held or () if u in uuids}
    return uuids, next(iter(nodes)) if len(nodes) == 1 else None

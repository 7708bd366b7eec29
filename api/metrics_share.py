"""/metrics of ``gpufleet serve --workers N``: every process's counters, whichever one answers.

The N processes share one listening socket, so a scrape reaches one of them at random. Each
keeps its own counters (requests, remote-write, export, ...), and a scrape that showed only the
answering process's would make every counter jump between the processes' values: Prometheus
reads each drop as a reset and ``rate()`` comes out wrong (seen with two workers: 4, 2, 6 on
successive scrapes of one counter).

So each process writes its per-process metrics, every sample labelled ``worker="<pid>"``, as
Prometheus text to ``<dir>/<pid>.prom`` (at most ``SHARE_S`` old: a thread rewrites it), and the
answering process serves its own (written to its file first) plus the other live processes'
files. Each series then belongs to one process and only ever grows from scrape to scrape;
``sum without (worker)`` gives the service's total (the chart's PrometheusRule already
aggregates with ``sum``/``max``). A process that died is left out and its file removed (its
series end, as a restarted pod's do). Gauges read from the database at scrape time (jobs
running, analysis lag, ...) are the same in every process: they are not shared, the answering
process adds them once, without ``worker``.

``serve`` creates the directory (``GPUFLEET_METRICS_DIR`` names one instead) only when it runs
more than one process; a single process serves its metrics as before, with no ``worker`` label.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
SHARE_S = 1.0  # how stale another process's counters may be in a scrape
LABEL = "worker"


def labelled(families: Iterable[Metric], worker: str) -> list[Metric]:
    """``families`` with ``worker`` added to every sample. A counter's or histogram's
    ``_created`` sample is left out: the text format prints it as a family of its own, which
    read back would not merge with the family it came from (and nothing here uses it)."""
    out = []
    for fam in families:
        m = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        for s in fam.samples:
            if fam.type != "gauge" and s.name.endswith("_created"):
                continue
            m.add_sample(s.name, {**s.labels, LABEL: worker}, s.value, s.timestamp, s.exemplar)
        out.append(m)
    return out


def merged(groups: Iterable[Iterable[Metric]]) -> list[Metric]:
    """One family per name with the samples of every group (each family once in an exposition)."""
    by_name: dict[str, Metric] = {}
    for fams in groups:
        for fam in fams:
            have = by_name.get(fam.name)
            if have is None:
                have = by_name[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            have.samples.extend(fam.samples)
    return list(by_name.values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, not ours to signal
        return True
    return True


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def exposition(families: list[Metric]) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Families(families))
    return generate_latest(reg)


class SharedMetrics:
    """This process's side: write its snapshot, read the others'. ``own`` is the registry of
    per-process collectors (not the database gauges)."""

    def __init__(self, own: CollectorRegistry, directory: Path, pid: int | None = None) -> None:
        self.own = own
        self.dir = Path(directory)
        self.pid = os.getpid() if pid is None else pid
        self.worker = str(self.pid)
        self._file = self.dir / f"{self.pid}.prom"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._write_lock = threading.Lock()

    def own_families(self) -> list[Metric]:
        return labelled(self.own.collect(), self.worker)

    def snapshot(self) -> list[Metric]:
        """This process's labelled metrics, now, also written to its file (a rename: readers
        never see half). Read and written under one lock: a snapshot taken earlier can never
        replace a later one, so what this process serves is never newer than its file, and
        each series grows from scrape to scrape whichever process answers."""
        with self._write_lock:
            own = self.own_families()
            tmp = self._file.with_suffix(".tmp")
            try:
                tmp.write_bytes(exposition(own))
                os.replace(tmp, self._file)
            except OSError as e:  # a full disk: this scrape still answers; the others lag
                log.warning("could not share this worker's metrics in %s: %s", self.dir, e)
        return own

    def others(self) -> list[list[Metric]]:
        """The other live processes' last snapshots (a dead one's file is removed)."""
        out: list[list[Metric]] = []
        try:
            paths = sorted(self.dir.glob("*.prom"))
        except OSError:
            return out
        for p in paths:
            try:
                pid = int(p.stem)
            except ValueError:
                continue
            if pid == self.pid:
                continue
            if not _alive(pid):
                with contextlib.suppress(OSError):
                    p.unlink()
                continue
            try:
                text = p.read_text()
            except OSError:
                continue  # removed meanwhile
            try:
                out.append(list(text_string_to_metric_families(text)))
            except ValueError as e:  # never expected (we wrote it); a scrape must not fail for it
                log.warning("metrics of worker %s unreadable (%s): left out of this scrape", pid, e)
        return out

    def families(self) -> list[Metric]:
        """What a scrape of this process shows: its own (fresh, and written for the others) and
        every other live process's."""
        return merged([self.snapshot(), *self.others()])

    def start(self) -> None:
        if self._thread is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.snapshot()
            self._thread = threading.Thread(target=self._run, name="gpufleet-metrics-share", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SHARE_S):
            try:
                self.snapshot()
            except Exception:  # never let the thread die; the next round retries
                log.exception("collecting this worker's metrics for the other workers failed")

    def stop(self) -> None:
        self._stop.set()

"""Group commit: one writer thread per collector process drains a bounded queue of
validated batches and stores everything waiting in ONE transaction, then acknowledges each
request. Under load many requests share a commit (and its fsync); idle, a lone batch is
written at once (no timer to wait for). The one wait: while the remote-write receiver has
bodies in its parse queue (``incoming``), a group waits for them, at most ``linger_s``
(GPUFLEET_REMOTE_WRITE_LINGER_S), since a commit costs per GPU-minute it touches and a body
holds one sample per GPU; agent batches (ten samples per GPU) never start such a wait.

Why a thread and the sync engine: the write path is mostly numpy and the database's own
work, so it releases the GIL; one code path (``storage.writes.write_batches``) then serves
ingest, import and tests on both databases. On PostgreSQL samples go in by binary COPY.

Failure handling, in order of likelihood:
- the database is unreachable or restarting: every waiting request gets 503 + Retry-After
  and nothing is acknowledged (the agent's spool retries the same (boot_id, seq));
- a deadlock/serialisation failure between collector processes: the group is retried;
- one batch is unstorable (storage.errors.WriteRefused, e.g. a GPU claimed by another
  node): that request gets its 4xx (collector.errors.from_refusal) and the rest of the group
  is retried without it;
- an unexpected error: the group is split and retried batch by batch, so only the batch
  that fails alone gets a 500.
The queue is bounded in rows: when full, ingest answers 503 at once (never unbounded memory)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import Engine

from gpufleet.collector.errors import from_refusal
from gpufleet.storage import retention
from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.errors import WriteRefused, is_missing_partition, is_transient, is_unreachable
from gpufleet.storage.prepared import BatchResult, Prepared
from gpufleet.storage.write_cache import WriteCache
from gpufleet.storage.writes import write_batches

log = logging.getLogger(__name__)


class Overloaded(Exception):
    """The write queue is full: answer 503 with Retry-After."""


class Unavailable(Exception):
    """The database could not take the write: answer 503 with Retry-After."""


@dataclass(slots=True)
class _Item:
    prep: Prepared
    loop: asyncio.AbstractEventLoop
    fut: asyncio.Future[BatchResult]


class GroupWriter:
    def __init__(self, engine: Engine, *, queue_rows: int, group_rows: int) -> None:
        self.engine = engine
        self.queue_rows = queue_rows
        self.group_rows = group_rows
        self.cache = WriteCache()
        self._q: deque[_Item] = deque()
        self._rows = 0
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="gpufleet-writer", daemon=True)
        # Called on this thread with the batches each commit stored (not duplicates): the
        # remote-write exporter's O(1) hand-off (collector/export). Must not block.
        self.on_commit: Callable[[list[Prepared]], None] | None = None
        # How many requests are accepted and still on their way to this queue (the remote-write
        # receiver's bodies waiting for its parse thread), and how long a group may wait for
        # them: a group commit costs per GPU-minute it touches, not per row, so a body folded
        # with the scrapes behind it is several times cheaper than alone (docs/prometheus.md).
        self.incoming: Callable[[], int] | None = None
        self.linger_s = 0.0
        # Counters for /metrics-style introspection and the benchmark.
        self.commits = 0
        self.batches = 0
        self.rows = 0
        self.writing_rows = 0  # rows of the group being written now

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Finish what is queued (bounded by ``timeout``), then stop."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def nudge(self) -> None:
        """``incoming()`` fell: a group waiting for it re-checks now, not at its deadline."""
        with self._cv:
            self._cv.notify()

    @property
    def pending_rows(self) -> int:
        return self._rows

    def submit(self, prep: Prepared) -> asyncio.Future[BatchResult]:
        """Queue a batch; the future resolves after its transaction commits."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[BatchResult] = loop.create_future()
        rows = max(prep.n, 1)
        with self._cv:
            if self._stop:
                raise Unavailable("collector is shutting down")
            # A batch alone may exceed the bound (it passed max_rows_per_batch): admit it
            # into an empty queue rather than refusing it forever.
            if self._rows and self._rows + rows > self.queue_rows:
                raise Overloaded(f"write queue full ({self._rows} rows waiting)")
            self._q.append(_Item(prep, loop, fut))
            self._rows += rows
            self._cv.notify()
        return fut

    # --- writer thread ----------------------------------------------------------------

    def _take(self) -> list[_Item] | None:
        with self._cv:
            while not self._q:
                if self._stop:
                    return None
                self._cv.wait(0.5)
            group: list[_Item] = []
            rows = 0
            deadline = 0.0
            while True:
                while self._q and (not group or rows + self._q[0].prep.n <= self.group_rows):
                    it = self._q.popleft()
                    group.append(it)
                    rows += max(it.prep.n, 1)
                # Idle, nothing is on its way and a lone batch goes at once; under load the
                # group waits (at most linger_s) for the requests already accepted. A full
                # group (the next batch does not fit) goes at once too.
                if self._stop or self._q or rows >= self.group_rows or self.incoming is None \
                        or self.incoming() <= 0:
                    break
                now = time.monotonic()
                deadline = deadline or now + self.linger_s
                if now >= deadline:
                    break
                self._cv.wait(deadline - now)
            self._rows -= rows
            return group

    def _run(self) -> None:
        while True:
            group = self._take()
            if group is None:
                return
            self.writing_rows = sum(it.prep.n for it in group)
            try:
                self._write(group)
            except BaseException as e:  # never let the thread die with requests waiting
                log.exception("writer failed")
                for it in group:
                    _resolve(it, exc=Unavailable(f"write failed: {type(e).__name__}"))
            finally:
                self.writing_rows = 0

    def _write(self, group: list[_Item]) -> None:
        pending = list(group)
        attempts = 0
        while pending:
            attempts += 1
            preps = [it.prep for it in pending]
            try:
                self._ensure_partitions(preps)
                with self.engine.begin() as conn:
                    res = write_batches(conn, preps, time.time(), self.cache)
            except WriteRefused as e:
                self.cache.clear()
                idx = e.index if e.index is not None else 0
                _resolve(pending[idx], exc=from_refusal(e))
                pending.pop(idx)
                continue
            except Exception as e:
                self.cache.clear()
                no_partition = is_missing_partition(e)
                if no_partition:
                    retention.forget()
                retry = is_transient(e) or no_partition
                if retry and attempts < 3 and not is_unreachable(e):
                    log.info("retrying group of %d after %s", len(pending), type(e).__name__)
                    time.sleep(0.05 * attempts)
                    continue
                if retry:
                    log.warning("database unavailable: %s", str(e).splitlines()[0] if str(e) else type(e).__name__)
                    for it in pending:
                        _resolve(it, exc=Unavailable("database unavailable, retry later"))
                    return
                if len(pending) > 1:
                    log.exception("unexpected error in a group of %d; retrying one by one", len(pending))
                    for it in pending:
                        self._write([it])
                    return
                log.exception("unexpected error storing batch %s", pending[0].prep.key)
                _resolve(pending[0], exc=e)
                return
            self.commits += 1
            self.batches += len(pending)
            self.rows += res.stored
            _resolve_all(pending, res.results)
            if self.on_commit is not None:  # after the acks: a hook never delays them
                try:
                    self.on_commit(stored_rows(pending, res.results))
                except Exception:
                    log.exception("writer on_commit hook failed")
            return

    def _ensure_partitions(self, preps: list[Prepared]) -> None:
        # Outside the write transaction (see storage.retention): usually a cache hit.
        if not is_postgres(self.engine):
            return
        days: set[int] = set()
        for p in preps:
            days |= retention.days_of(p.ts)
        if days:
            retention.ensure_partitions(self.engine, days)


def stored_rows(items: list[_Item], results: list[BatchResult]) -> list[Prepared]:
    """The rows a commit stored, per batch: what the export forwards. A duplicate batch, and
    the rows of a batch that were copies of stored ones (a replay under another key, a
    re-sent remote-write body), were sent downstream when first stored, not again."""
    out: list[Prepared] = []
    for it, r in zip(items, results, strict=True):
        if r.duplicate or not r.stored:
            continue
        p = it.prep
        if r.new_rows is None:
            out.append(p)
            continue
        idx = np.flatnonzero(r.new_rows)
        out.append(Prepared(p.batch, p.ts[idx], [p.gpu[i] for i in idx.tolist()], [p.job[i] for i in idx.tolist()],
                            p.vals[:, idx], p.columns))
    return out


def _resolve(it: _Item, *, result: BatchResult | None = None, exc: BaseException | None = None) -> None:
    def done() -> None:
        if it.fut.done():
            return
        if exc is not None:
            it.fut.set_exception(exc)
        else:
            it.fut.set_result(result)  # type: ignore[arg-type]  # result is set whenever exc is not

    try:
        it.loop.call_soon_threadsafe(done)
    except RuntimeError:  # the loop has closed (shutdown): nobody is waiting any more
        pass


def _resolve_all(items: list[_Item], results: list[BatchResult]) -> None:
    """Acknowledge a committed group with one wake-up per event loop instead of one per
    request (hundreds of requests share a commit under load)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Item, BatchResult]]] = {}
    for it, r in zip(items, results, strict=True):
        by_loop.setdefault(it.loop, []).append((it, r))

    def done(pairs: list[tuple[_Item, BatchResult]]) -> None:
        for it, r in pairs:
            if not it.fut.done():
                it.fut.set_result(r)

    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(done, pairs)
        except RuntimeError:  # the loop has closed (shutdown): nobody is waiting any more
            pass


class WriterMetrics:
    """The group writer on /metrics: how full its queue is and how many batches a commit holds
    (``batches / commits``: what the remote-write linger buys, docs/prometheus.md)."""

    def __init__(self, writer: GroupWriter) -> None:
        self.w = writer

    def collect(self) -> list[CounterMetricFamily | GaugeMetricFamily]:
        w = self.w
        out: list[CounterMetricFamily | GaugeMetricFamily] = []
        for name, doc, v in (("gpufleet_ingest_queue_rows", "Rows waiting for this process's writer", w.pending_rows),
                             ("gpufleet_ingest_queue_max_rows", "Rows waiting before ingest answers 503 "
                              "(GPUFLEET_INGEST_QUEUE_ROWS)", w.queue_rows)):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], v)
            out.append(g)
        for name, doc, v in (("gpufleet_ingest_commits", "Group commits of this process's writer", w.commits),
                             ("gpufleet_ingest_batches", "Batches those commits held (duplicates included)",
                              w.batches),
                             ("gpufleet_ingest_rows", "Sample rows those commits stored", w.rows)):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], v)
            out.append(c)
        return out

"""The exporter: the writer hands it each committed group (``offer``, O(1), on the writer
thread); an encoder thread turns groups into remote-write bodies in the on-disk queue; a sender
thread posts them oldest first, with exponential backoff on what the receiver may retry.

Ingest never waits on any of it: ``offer`` only appends to a bounded deque (full -> the rows
are counted as dropped, ``reason="busy"``), and encoding runs on its own thread. The receiver's
answers are read the way Prometheus reads them: 2xx sent; 429/5xx/connection errors retried
(``Retry-After`` honoured); any other 4xx can never succeed, so that body is dropped and
counted (``reason="rejected"``) instead of blocking the queue forever."""

from __future__ import annotations

import contextlib
import http.client
import logging
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.collector.remote_write import wire

from .encode import LABELS, Encoder, RowSource
from .poster import Poster
from .spool import Item, Spool

log = logging.getLogger(__name__)


def _comma_list(raw: str | None) -> tuple[str, ...] | None:
    if raw is None or not raw.strip():
        return None
    return tuple(x.strip() for x in raw.split(",") if x.strip())


@dataclass(frozen=True)
class ExportSettings:
    """The exporter's view of ``Settings.export`` (``GPUFLEET_EXPORT_*``, docs/configuration.md),
    lists parsed. Export is off unless ``url`` is set."""

    url: str = ""
    token: str | None = None  # bearer token for the receiver (a secret)
    fields: tuple[str, ...] | None = None  # None = every catalog field
    labels: tuple[str, ...] = LABELS
    queue_dir: Path | None = None  # None = <data dir>/export-queue
    queue_bytes: int = 256 * 1024 * 1024
    max_samples_per_send: int = 20_000
    flush_s: float = 1.0  # most time rows wait to be encoded
    timeout_s: float = 30.0
    min_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    pending_rows: int = 500_000  # rows waiting for the encoder before new ones are dropped

    @classmethod
    def of(cls, section: Any) -> ExportSettings:
        """From the server Settings' ``export`` section (gpufleet/settings.py), whose lists are
        comma-separated strings."""
        d = cls()
        return cls(url=section.url.strip(), token=section.token, fields=_comma_list(section.fields),
                   labels=_comma_list(section.labels) or d.labels, queue_dir=section.queue_dir,
                   queue_bytes=section.queue_bytes, max_samples_per_send=section.max_samples_per_send,
                   flush_s=section.flush_s, timeout_s=section.timeout_s, min_backoff_s=section.min_backoff_s,
                   max_backoff_s=section.max_backoff_s, pending_rows=section.pending_rows)


def source_of(prep: Any) -> RowSource:
    """A stored batch (``storage`` Prepared: batch, ts, gpu, job, vals) as export rows."""
    b = prep.batch
    return RowSource(cluster=b.agent.cluster, node=b.agent.node, ts=prep.ts, gpu=prep.gpu, job=prep.job,
                     vals=prep.vals, gpu_index={g.uuid: g.index for g in b.gpus},
                     job_user={j.job_id: j.user for j in b.jobs})


def merged_sources(preps: Sequence[Any]) -> list[RowSource]:
    """The stored batches as one RowSource per (cluster, node), in the order first seen: a
    node's successive batches carry the same GPUs, so merged they are one series per (GPU,
    job, field) with all its samples instead of one per batch (fewer series to encode, fewer
    label sets on the wire for the receiver to parse)."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for p in preps:
        if p.n:
            groups.setdefault((p.batch.agent.cluster, p.batch.agent.node), []).append(p)
    out = []
    for (cluster, node), ps in groups.items():
        if len(ps) == 1:
            out.append(source_of(ps[0]))
            continue
        gpu_index: dict[str, int] = {}
        job_user: dict[str, str | None] = {}
        for p in ps:
            gpu_index.update((g.uuid, g.index) for g in p.batch.gpus)
            job_user.update((j.job_id, j.user) for j in p.batch.jobs)
        out.append(RowSource(cluster=cluster, node=node, ts=np.concatenate([p.ts for p in ps]),
                             gpu=[g for p in ps for g in p.gpu], job=[j for p in ps for j in p.job],
                             vals=np.concatenate([p.vals for p in ps], axis=1), gpu_index=gpu_index,
                             job_user=job_user))
    return out


def name_os_thread(name: str) -> None:
    """The calling thread's OS name (Linux ``comm``, 15 bytes): ``top -H`` and the export bench
    (bench/remote_write/export_cost.py) then tell the export's CPU from the rest of the
    process's. Best effort: elsewhere it stays unnamed."""
    with contextlib.suppress(OSError):
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(name[:15])


class Exporter:
    def __init__(self, settings: ExportSettings, queue_dir: Path) -> None:
        if not settings.url:
            raise ValueError("export needs GPUFLEET_EXPORT_URL")
        self.settings = settings
        self.encoder = Encoder(settings.fields, settings.labels)
        self.spool = Spool(queue_dir, settings.queue_bytes)
        self.poster = Poster(settings.url, settings.timeout_s)
        self._headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                         "X-Prometheus-Remote-Write-Version": "0.1.0", "User-Agent": "gpufleet-export"}
        if settings.token:
            self._headers["Authorization"] = f"Bearer {settings.token}"
        self._pending: deque[Any] = deque()
        self._pending_rows = 0
        # rows that fill a body: every exported field is a sample per row (fewer when NaN)
        self._full_rows = max(1, settings.max_samples_per_send // max(1, len(self.encoder.fields)))
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self.dropped: Counter[str] = Counter()  # samples (rows for "busy") by reason
        self.sent_samples = 0
        self.sent_bodies = 0
        self.send_failures = 0
        self.last_success = 0.0
        self._threads = [threading.Thread(target=self._encode_loop, name="gpufleet-export-encode", daemon=True),
                         threading.Thread(target=self._send_loop, name="gpufleet-export-send", daemon=True)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Encode what is pending (it is then on disk for the next start) and stop."""
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout)
        if self._threads[0].is_alive():  # never silently: these rows die with the process
            log.error("export: the encoder is still busy after %.0f s at stop: at least %d rows are not exported",
                      timeout, self._pending_rows)
        self.spool.close()
        self.poster.close()

    # --- writer side -------------------------------------------------------------------

    def offer(self, preps: Sequence[Any]) -> None:
        """Called by the writer after a group commit with the batches it stored."""
        rows = sum(p.n for p in preps)
        if not rows:
            return
        with self._cv:
            if self._pending_rows + rows > self.settings.pending_rows:
                self.dropped["busy"] += rows
                return
            self._pending.extend(preps)
            self._pending_rows += rows
            if self._pending_rows >= self._full_rows:  # a full body's worth: wake the encoder now
                self._cv.notify()

    # --- encoder thread ----------------------------------------------------------------

    def _take(self) -> list[Any]:
        """What is pending once there is a full body's worth or ``flush_s`` has passed: the
        costs of a body (an encoder pass, a snappy call, a queue file, an HTTP request) are
        per body, so filling bodies (as Prometheus' batch_send_deadline does) makes them
        cheaper per sample than encoding every group commit on its own."""
        deadline = time.monotonic() + self.settings.flush_s
        with self._cv:
            while self._pending_rows < self._full_rows and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            out = list(self._pending)
            self._pending.clear()
            self._pending_rows = 0
            return out

    def _encode_loop(self) -> None:
        name_os_thread("gf-export-enc")
        while True:
            stopping = self._stop.is_set()
            preps = self._take()
            try:
                self._encode(preps)
            except Exception:
                log.exception("export: encoding %d batches failed; their samples are not exported", len(preps))
                self.dropped["encode_error"] += sum(p.n for p in preps)
            if stopping and not self._pending:
                return

    def _encode(self, preps: list[Any]) -> None:
        """One body per ``max_samples_per_send`` (counted as rows x exported fields: NaN
        makes a body smaller, never larger), each encoded in one pass over its sources."""
        limit = self._full_rows
        chunk: list[RowSource] = []
        rows = 0
        for src in merged_sources(preps):
            chunk.append(src)
            rows += len(src.ts)
            if rows >= limit:
                self._put(chunk)
                chunk, rows = [], 0
        if chunk:
            self._put(chunk)

    def _put(self, srcs: list[RowSource]) -> None:
        raw, count = self.encoder.encode(srcs)
        if count:
            self.spool.put(wire.snappy(raw), count, hold=True)  # no file when the sender takes it within moments

    # --- sender thread -----------------------------------------------------------------

    def _send_loop(self) -> None:
        name_os_thread("gf-export-send")
        backoff = self.settings.min_backoff_s
        while not self._stop.is_set():
            item = self.spool.oldest(0.5)
            if item is None:
                continue
            wait = self._send(item)
            if wait is None:
                backoff = self.settings.min_backoff_s
                continue
            self.send_failures += 1
            delay = wait if wait > 0 else backoff * (0.5 + random.random())
            backoff = min(backoff * 2, self.settings.max_backoff_s)
            self._stop.wait(min(delay, self.settings.max_backoff_s))

    def _send(self, item: Item) -> float | None:
        """None when the body is done with (sent, or dropped for good); else seconds to wait
        (0 = use the backoff)."""
        body = self.spool.body(item)
        if body is None:  # dropped by the bound while we picked it
            self.spool.done(item)
            return None
        try:
            r = self.poster.post(body, self._headers)
        except (OSError, http.client.HTTPException) as e:
            log.warning("export to %s: %s (retrying; %d bodies queued)", self.settings.url, e, self.spool.depth[0])
            self.spool.persist()  # they may now wait long: on disk, as the bodies behind them
            return 0.0
        if r.is_success:
            self.spool.done(item)
            self.sent_samples += item.samples
            self.sent_bodies += 1
            self.last_success = time.time()
            return None
        if r.status == 429 or r.status >= 500:
            log.warning("export to %s: HTTP %d (retrying)", self.settings.url, r.status)
            self.spool.persist()
            try:
                return float(r.retry_after or "0")
            except ValueError:
                return 0.0
        log.error("export to %s refused a body of %d samples for good: HTTP %d %s", self.settings.url, item.samples,
                  r.status, r.text)
        self.dropped["rejected"] += item.samples
        self.spool.done(item)
        return None

    def dropped_total(self) -> Counter[str]:
        out = Counter(self.dropped)
        if self.spool.dropped_samples:
            out["queue_full"] = self.spool.dropped_samples
        return out

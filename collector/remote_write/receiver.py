"""``POST /api/v1/write``: one remote-write request, independent of the HTTP framework.

The answers follow Prometheus' retry rules (docs/prometheus.md):

- 2xx: stored (or a duplicate of a request stored before). Series that are not GPU metrics,
  NaN/staleness markers and values outside the catalog are counted and ignored: they could
  never be stored, and a 4xx would make the sender drop the good series of the same request.
- 4xx, never retried by the sender: the request itself can never be stored as sent: no or a
  wrong token (401/403), a node-pinned token (403: a remote-write stream carries many nodes),
  a body that is not snappy-compressed protobuf (400/415), too large (413), or a GPU the
  database assigns to another node (409, from the write path); the detail says which.
- 503 + Retry-After, retried: the write queue is full or the database is unavailable. Batches
  of the request already committed are acknowledged as duplicates when the retry arrives.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import threading
import time
from collections import Counter
from typing import Any

import msgspec

from gpufleet.collector.answers import Answer, BodyReader, answer, read_limited_body
from gpufleet.pod_jobs import PodJobs
from gpufleet.protocol import ProtocolError
from gpufleet.storage import tokens

from . import budget, wire, wire_v2
from .columnar import Slots, convert_columnar
from .mapping import SERIES_CACHE_MAX, Conversion, RateState, SeriesMap, SnapshotState, convert
from .serving import ServingHook

log = logging.getLogger(__name__)
_json = msgspec.json.Encoder()
_pack = msgspec.msgpack.Encoder().encode

PROTOBUF = "application/x-protobuf"
V1_PROTO = "prometheus.WriteRequest"
# Remote write 2.0's answer headers: how many of the request's samples, native histograms and
# exemplars the receiver holds. The spec wants them on every answer to a 2.0 request.
WRITTEN_SAMPLES = b"x-prometheus-remote-write-samples-written"
WRITTEN_HISTOGRAMS = b"x-prometheus-remote-write-histograms-written"
WRITTEN_EXEMPLARS = b"x-prometheus-remote-write-exemplars-written"


def proto_of(content_type: str | None) -> str | None:
    """The protobuf message a Content-Type names: ``prometheus.WriteRequest`` (1.0, also when
    it names none), ``io.prometheus.write.v2.Request`` (2.0), another name as given, or None
    when the media type is not ``application/x-protobuf``."""
    parts = (content_type or PROTOBUF).split(";")
    if parts[0].strip().lower() != PROTOBUF:
        return None
    for p in parts[1:]:
        k, _, v = p.partition("=")
        if k.strip().lower() == "proto":
            return v.strip().strip('"')
    return V1_PROTO


def version_of(proto: str | None) -> str:
    """The remote-write version a request's message names, for /metrics: ``1.0``, ``2.0``, or
    ``unknown`` (not protobuf, or a message neither version sends)."""
    return {V1_PROTO: "1.0", wire_v2.PROTO: "2.0"}.get(proto or "", "unknown")


def _field_values(batch: Any) -> int:
    """The values a stored batch holds (its field columns' non-null cells)."""
    return sum(len(v) - v.count(None) for k, v in batch.samples.items() if k not in ("ts", "gpu", "job"))


class Stats:
    """Counters for /metrics (``metrics.RemoteWriteCollector``) and the answers' debugging."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: Counter[tuple[int, str]] = Counter()  # by (status, protocol version)
        self.ignored: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.samples = 0
        self.rows = 0
        self.duplicate_batches = 0
        self.rows_already_stored = 0
        self.collectives = 0  # NCCL collective aggregates stored (docs/prometheus.md)

    def add(self, status: int, conv: Conversion | None = None, rows: int = 0, dupes: int = 0,
            skipped: int = 0, collectives: int = 0, *, version: str) -> None:
        with self.lock:
            self.requests[status, version] += 1
            if conv is not None and status < 300:
                self.ignored.update(conv.ignored)
                self.dropped.update(conv.dropped)
                self.samples += conv.samples
                self.rows += rows
                self.duplicate_batches += dupes
                self.rows_already_stored += skipped
                self.collectives += collectives


class Receiver:
    """Per-process remote-write state: the series map, counter rates, stats. ``coll`` is the
    process's ``collector.routes.Collector`` (auth, config, write queue)."""

    def __init__(self, coll: Any) -> None:
        self.coll = coll
        self.series = SeriesMap(pod_jobs=PodJobs(coll.config.kubernetes_job_patterns))
        self.slots = Slots()  # the series map's known series as array rows (columnar.py)
        self.memory_totals: dict[tuple[str, str], float] = {}  # (cluster, uuid) -> bytes, last seen
        self.rates = RateState()
        self.snapshots = SnapshotState()
        self.stats = Stats()
        self._lock = threading.Lock()
        # One thread parses every request of this process, one after the other. Parsing is
        # Python code holding the GIL (numpy lets go of it only briefly): the 40 threads of
        # the default pool ran up to 40 bodies at once that only took turns on the GIL and on
        # self._lock, each request's latency the sum of all of them, plus the switches. One
        # thread does the same work with no convoy; requests wait their turn in its queue.
        self._parser = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpufleet-rw-parse")
        self._dims_ok: set[bytes] = set()  # (gpus, jobs) lists that passed check_gpus / check_jobs
        self.dims_budget = budget.ByteBudget("dims", budget.DIMS_BYTES)
        self.values_budget = budget.ByteBudget("label_values", budget.LABEL_VALUES_BYTES)
        self._parsing = 0  # bodies handed to the parse thread and not yet to the writer
        # inference engines' series -> replica-minutes (docs/serving.md, "Remote write")
        self.serving = ServingHook(lambda: coll.engine, self.series.pod_jobs,
                                   int(getattr(getattr(coll.settings, "http", None), "workers", 1) or 1))
        writer = getattr(coll, "writer", None)
        if writer is not None:
            writer.incoming = self._incoming
            writer.linger_s = float(coll.config.remote_write_linger_s)

    def budgets(self) -> list[budget.ByteBudget]:
        """The byte bounds of every cache that senders fill (for /metrics)."""
        return [self.series.budget, self.rates.families_budget, self.dims_budget, self.values_budget,
                self.serving.state.budget]

    def _incoming(self) -> int:
        return self._parsing

    def _left_parse(self) -> None:
        self._parsing -= 1
        if self._parsing == 0:
            self.coll.writer.nudge()

    async def handle(self, headers: dict[bytes, str], read_body: BodyReader, cluster_param: str | None) -> Answer:
        status, body, extra = await self._handle(headers, read_body, cluster_param)
        proto = proto_of(headers.get(b"content-type"))
        if status >= 300:
            self.stats.add(status, version=version_of(proto))
        if proto == wire_v2.PROTO and not any(k == WRITTEN_SAMPLES for k, _ in extra):
            # refused before anything was stored (auth, media type, body): nothing written
            extra = [*extra, (WRITTEN_SAMPLES, b"0"), (WRITTEN_HISTOGRAMS, b"0"), (WRITTEN_EXEMPLARS, b"0")]
        return status, body, extra

    async def _handle(self, h: dict[bytes, str], read_body: BodyReader, cluster_param: str | None) -> Answer:
        coll = self.coll
        try:
            who = await coll.authorize(h.get(b"authorization"), "agent")
        except tokens.AuthError as e:
            return answer(e.status, e.detail)
        if who.node is not None:
            return answer(403, f"token {who.name!r} is pinned to node {who.node!r}; remote write carries many "
                                "nodes: use a cluster-scoped token (gpufleet token create NAME --role agent "
                                "--cluster C)")
        cluster = who.cluster or (cluster_param or "").strip() or "default"
        if who.cluster is not None and cluster_param and cluster_param != who.cluster:
            return answer(403, f"token {who.name!r} may write cluster {who.cluster!r}, not {cluster_param!r}")
        ctype = h.get(b"content-type") or PROTOBUF
        proto = proto_of(ctype)
        if proto is None:
            return answer(415, f"unsupported Content-Type {ctype!r}: remote write sends {PROTOBUF}")
        if proto not in (V1_PROTO, wire_v2.PROTO):
            return answer(415, f"unsupported protobuf message {proto!r}: send {V1_PROTO} (remote write 1.0) or "
                                f"{wire_v2.PROTO} (2.0)")
        v2 = proto == wire_v2.PROTO
        enc = (h.get(b"content-encoding") or "").strip().lower()
        if enc != "snappy":
            return answer(415, f"unsupported Content-Encoding {enc or 'none'!r}: remote write bodies are snappy")
        limit = int(coll.settings.http.max_body_bytes)
        body = await read_limited_body(read_body, limit, h.get(b"content-length"))
        if not isinstance(body, bytes):
            return body
        # Decoding and regrouping are CPU work (milliseconds for a 2,000-series body): off the
        # event loop, so ingest requests and API reads keep being answered meanwhile.
        self._parsing += 1  # (the event loop's thread alone counts; _store counts down once queued)
        queued = False
        try:
            parsed = await asyncio.get_running_loop().run_in_executor(self._parser, self._parse, body, cluster,
                                                                      limit, v2)
            if isinstance(parsed, tuple):
                return parsed
            queued = True
            try:
                return await self._store(parsed, v2)
            finally:
                if parsed.serving_finished:  # replica-minutes finished: stored whatever the GPU rows' answer
                    await self.serving.store(parsed.serving_finished)
        finally:
            if not queued:
                self._left_parse()

    def _parse(self, body: bytes, cluster: str, limit: int, v2: bool = False) -> Conversion | Answer:
        coll = self.coll
        try:
            raw = wire.unsnappy(body, max_size=limit)
        except ProtocolError as e:
            return answer(413 if "exceeds" in str(e) else 400, str(e))
        cfg = coll.config
        now = time.time()
        max_rows = int(coll.settings.http.max_rows_per_batch)
        # Same request bytes -> same keys: a retry after a lost answer is a duplicate. The
        # compressed bytes: a sender retries the very buffer it sent (Prometheus, vmagent and
        # Alloy keep the snappy block), and they are ~13x fewer to hash than the decompressed.
        digest = hashlib.blake2b(body, digest_size=12, person=b"gpufleet-rw2" if v2 else b"gpufleet-rw",
                                 key=cluster.encode()[:64]).hexdigest()
        conv: Conversion | None = None
        # The body read once by the C pass where it is built (wire.scan, wire_v2.scan for 2.0, whose
        # keys are 1.0's label bytes; None: the Python decoder's turn). A steady-state body (known
        # series, one sample each) is converted over whole arrays; anything else, or what the
        # columnar path declines, the general way.
        try:
            found = wire_v2.scan(raw) if v2 else None
            scanned = found[0] if found is not None else None if v2 else wire.scan(raw)
        except ProtocolError as e:
            return answer(400, str(e))
        # (convert_columnar checks the keys are known)
        if scanned is not None and v2:
            # 2.0 carries each series' type in every body (1.0 sends metadata apart from the
            # samples): the families are noted first, so the columnar path takes these bodies too
            cols = wire.SingleSamples(scanned.keys, scanned.ts_ms, scanned.values) \
                if scanned.single and scanned.keys else None
            if cols is not None and scanned.metadata:
                with self._lock:
                    for fam, kind in scanned.metadata.items():
                        self.rates.note_family(fam, kind == wire.COUNTER)
        elif scanned is not None:
            cols = scanned.single_samples()
        else:
            cols = None if v2 else wire.scan_single_samples(raw, None, native=False)
        if cols is not None:
            with self._lock:
                conv = convert_columnar(cols, self.series, self.slots, self.rates, cluster=cluster, digest=digest,
                                        now=now, max_age_s=cfg.max_age_s, max_future_s=cfg.max_future_s,
                                        max_rows=max_rows)
        if conv is None:
            try:
                if scanned is not None:
                    req = scanned.request()
                elif v2:
                    req = wire_v2.decode(raw, native=False).request
                else:
                    req = wire.decode(raw, self.series.known, native=False)
            except ProtocolError as e:
                return answer(400, str(e))
            with self._lock:  # the series map and the rate state are shared by concurrent requests
                conv = convert(req, self.series, self.rates, cluster=cluster, digest=digest, now=now,
                               max_age_s=cfg.max_age_s, max_future_s=cfg.max_future_s, max_rows=max_rows,
                               snapshots=self.snapshots)
        if not v2 and conv.series == 0 and raw and wire.looks_like_v2(raw):
            # A 1.0 decoder skips 2.0's fields (symbols, timeseries: numbers 4 and 5) as unknown:
            # the body would be "stored" as nothing with a 200, and the sender never told.
            return answer(415, "this is a remote write 2.0 body (io.prometheus.write.v2.Request) sent with the 1.0 "
                               "Content-Type: send Content-Type: application/x-protobuf;"
                               "proto=io.prometheus.write.v2.Request")
        self.serving.fold(conv, cluster, now, cfg.max_age_s, cfg.max_future_s)
        return self._checked(conv, cluster, now, max_rows)

    def _checked(self, conv: Conversion, cluster: str, now: float, max_rows: int) -> Conversion:
        """``conv``'s batches prepared for the write path and checked as ingest checks them."""
        from gpufleet.collector.columns import prepare
        from gpufleet.collector.errors import BatchRejected
        from gpufleet.collector.validate import check_batch

        cfg = self.coll.config
        with self._lock:
            self._keep_memory_totals(conv, cluster)
        built, conv.prepared = conv.prepared, []
        dims_ok = self._dims_ok
        for i, b in enumerate(conv.batches):
            try:
                prep = built[i] if built else prepare(b)
                # check_gpus / check_jobs depend on the lists alone, and a node's lists repeat
                # from body to body: each distinct pair is checked once (their msgpack bytes
                # are the key: ~2 us a batch, where the checks of 8 GPUs' strings cost ~30)
                try:
                    dims: bytes | None = _pack((b.gpus, b.jobs))
                except OverflowError:  # a label's number past 64 bits (gpu="1000...0"): check_gpus names it
                    dims = None
                seen = dims is not None and dims in dims_ok
                refused = check_batch(b, prep, now, max_rows=max_rows, max_age_s=cfg.max_age_s,
                                      max_future_s=cfg.max_future_s, dims_checked=seen)
                for r in refused:  # an NCCL record the database cannot hold: dropped and counted, never a 5xx
                    conv.dropped[f"unstorable_{r.part}"] += 1
                if not seen and dims is not None:
                    if len(dims_ok) >= SERIES_CACHE_MAX or self.dims_budget.charge(budget.entry_bytes(dims)):
                        dims_ok.clear()
                    dims_ok.add(dims)
                conv.prepared.append(prep)
            except BatchRejected as e:
                conv.rejected.append((e.status, f"node {b.agent.node!r}: {e.detail}"))
        return conv

    def _keep_memory_totals(self, conv: Conversion, cluster: str) -> None:
        """A GPU's memory total comes from its framebuffer series, which a body may not carry
        (a sender cuts a scrape into bodies anywhere): such a body's GPU gets the total last
        seen, so the stored one is not erased to unknown and the GPU row is not rewritten on
        every other request."""
        memory = self.memory_totals
        for b in conv.batches:
            for g in b.gpus:
                k = (cluster, g.uuid)
                if g.memory_total_bytes is None:
                    g.memory_total_bytes = memory.get(k)
                else:
                    if k not in memory and (len(memory) >= SERIES_CACHE_MAX
                                            or self.values_budget.charge(budget.entry_bytes(*k))):
                        memory.clear()
                    memory[k] = g.memory_total_bytes

    async def _store(self, conv: Conversion, v2: bool = False) -> Answer:
        from gpufleet.collector.errors import BatchRejected
        from gpufleet.collector.writer import Overloaded, Unavailable

        coll = self.coll
        cfg = coll.config
        futs: list[asyncio.Future[Any]] = []
        rejected = list(conv.rejected)
        busy: str | None = None
        try:
            for prep in conv.prepared:
                try:
                    futs.append(coll.writer.submit(prep))
                except (Overloaded, Unavailable) as e:
                    busy = str(e)
                    break
        finally:
            self._left_parse()  # in the writer's queue now: its group need not wait for this body
        rows = dupes = skipped = colls = written = 0
        for prep, fut in zip(conv.prepared, futs, strict=False):
            try:
                res = await fut
            except BatchRejected as e:
                rejected.append((e.status, e.detail))
                continue
            except Unavailable as e:
                busy = str(e)
                continue
            except Exception:
                log.exception("remote write: storing a batch failed")
                busy = "internal error storing the request (logged on the collector)"
                continue
            rows += res.stored
            dupes += int(res.duplicate)
            if v2:  # held now, by this request or by the identical one it retries
                written += _field_values(prep.batch)
                if prep.batch.agent.seq & 0xFFFFF == 0:  # a node's first batch carries what was folded
                    written += conv.folded[prep.batch.agent.node]
            if not res.duplicate:
                colls += len(prep.batch.collectives)
                # the write path keeps one sample per (GPU, ts): a row whose GPU and time were
                # stored before (another shard's request carried other fields of it) is skipped
                skipped += max(0, prep.n - res.stored)
        written += conv.serving_held  # inference engines' samples the serving fold holds
        v2_headers = [(WRITTEN_SAMPLES, str(written).encode()), (WRITTEN_HISTOGRAMS, b"0"),
                      (WRITTEN_EXEMPLARS, b"0")] if v2 else []
        if busy is not None:  # (handle() counts the answer)
            status, text, extra = answer(503, f"{busy}; retry (committed parts are acknowledged as duplicates)",
                                         cfg.retry_after_s)
            return status, text, extra + v2_headers
        with self._lock:
            # a 4xx is never retried: the NCCL snapshots of the nodes stored are counted (a 503
            # is retried with the same bytes, which must fold the same records again)
            self.snapshots.commit(conv.snapshot_updates, conv.gpu_updates)
        if rejected:
            status = rejected[0][0]
            log.warning("remote write: %d batch(es) refused: %s", len(rejected), rejected[0][1])
            status, text, extra = answer(status, "; ".join(d for _, d in rejected[:5])
                                         + " (the request's other nodes are stored)")
            return status, text, extra + v2_headers
        with self._lock:
            self.rates.commit(conv.rate_updates)
        self.stats.add(200, conv, rows, dupes, skipped, colls, version="2.0" if v2 else "1.0")
        out = conv.summary()
        out["stored"] = rows
        out["duplicate_batches"] = dupes
        out["rows_already_stored"] = skipped
        out["collectives_stored"] = colls
        if v2:
            out["samples_written"] = written
        return 200, _json.encode(out), v2_headers



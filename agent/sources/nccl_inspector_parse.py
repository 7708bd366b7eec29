"""NCCL Inspector output -> records -> 10 s aggregates. Pure: text in, values out, no I/O.

Two formats (``ext-profiler/inspector`` in the NCCL repository, format ``v4.0``):

* JSON, one object per line, per communicator and collective (``header``, ``metadata``,
  ``coll_perf``; with ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` also ``event_trace_sn`` /
  ``event_trace_ts``, which we accept and ignore: kernel channel times add nothing the
  aggregate needs).
* Prometheus text (``NCCL_INSPECTOR_PROM_DUMP=1``): ``nccl_bus_bandwidth_gbs``,
  ``nccl_algorithm_bandwidth_gbs``, ``nccl_collective_exec_time_microseconds`` with labels
  (``comm_id``, ``collective``, ``rank``, ``slurm_job_id``, ``gpu_device_id``, ``message_size``,
  ``coll_sn``, ...; newer plugins say ``comm_name``, ``gpu``, ``nranks``, ``node``).

``Aggregator`` folds records into one ``CollectiveAgg`` per (job, communicator, rank,
collective, size bucket, window); memory is bounded by ``MAX_KEYS`` open keys and
``MAX_VALUES`` kept values per key (count and bytes stay exact past it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import msgspec

from gpufleet.protocol import CollectiveAgg

WINDOW_S = 10.0
MAX_KEYS = 50_000  # open (key, window) accumulators; past it new keys are counted as dropped
MAX_VALUES = 2048  # exec/busbw values kept per accumulator for percentiles (reservoir by stride)
MAX_NAME = 64  # communicator ids, collective names: longer is not an Inspector value


class ParseError(ValueError):
    """A line or sample that is not an Inspector record; the message says why."""


# --- JSON lines ----------------------------------------------------------------------------


class _Header(msgspec.Struct):
    id: str
    rank: int
    n_ranks: int | None = None
    nnodes: int | None = None


class _Meta(msgspec.Struct):
    inspector_output_format_version: str = ""
    dump_timestamp_us: int | None = None
    hostname: str = ""
    pid: int | None = None


class _Perf(msgspec.Struct):
    coll: str
    coll_msg_size_bytes: int
    coll_exec_time_us: float
    coll_sn: int | None = None
    coll_timing_source: str = ""
    coll_algobw_gbs: float | None = None
    coll_busbw_gbs: float | None = None


class _Line(msgspec.Struct):
    header: _Header
    metadata: _Meta
    coll_perf: _Perf


_line_dec = msgspec.json.Decoder(_Line)


@dataclass(slots=True)
class Record:
    """One collective on one rank, in Inspector units (us, GB/s)."""

    ts: float  # epoch seconds (the dump time: the collective ended at or before it)
    comm: str
    rank: int
    coll: str
    size: int
    exec_us: float
    busbw_gbs: float | None = None
    n_ranks: int | None = None
    n_nodes: int | None = None
    hostname: str = ""
    pid: int | None = None
    sn: int | None = None
    timing_source: str = ""
    job_id: str | None = None  # when the format says (Prometheus slurm_job_id label)
    gpu_index: int | None = None  # when the format says (Prometheus gpu_device_id="GPU4")


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) and v >= 0 else None


def parse_json_line(line: bytes) -> Record:
    """One JSON line -> Record; ParseError says what is wrong (the caller counts and skips)."""
    try:
        o = _line_dec.decode(line)
    except msgspec.ValidationError as e:
        raise ParseError(f"not an Inspector record: {e}") from None
    except msgspec.DecodeError as e:
        raise ParseError(f"malformed JSON: {e}") from None
    h, m, p = o.header, o.metadata, o.coll_perf
    if m.dump_timestamp_us is None or m.dump_timestamp_us <= 0:
        raise ParseError("metadata.dump_timestamp_us missing")
    if len(h.id) > MAX_NAME or len(p.coll) > MAX_NAME or not h.id or not p.coll:
        raise ParseError("header.id or coll_perf.coll empty or too long")
    exec_us = _finite(p.coll_exec_time_us)
    if exec_us is None or p.coll_msg_size_bytes < 0 or h.rank < 0:
        raise ParseError("coll_exec_time_us, coll_msg_size_bytes or rank negative or not finite")
    return Record(ts=m.dump_timestamp_us / 1e6, comm=h.id, rank=h.rank, coll=p.coll, size=p.coll_msg_size_bytes,
                  exec_us=exec_us, busbw_gbs=_finite(p.coll_busbw_gbs), n_ranks=h.n_ranks, n_nodes=h.nnodes,
                  hostname=m.hostname, pid=m.pid, sn=p.coll_sn, timing_source=p.coll_timing_source)


# --- Prometheus text -----------------------------------------------------------------------

_PROM_LINE = re.compile(r'^(nccl_[a-z_]+)\{(.*)\}\s+(\S+)(?:\s+(\d+))?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_SIZE = re.compile(r"^\s*([0-9.]+)\s*(?:-\s*[0-9.]+\s*)?([KMGT]?)i?B?\s*$", re.IGNORECASE)
_METRICS = {"nccl_bus_bandwidth_gbs": "busbw", "nccl_collective_exec_time_microseconds": "exec",
            "nccl_algorithm_bandwidth_gbs": "algbw"}
# labels that name the sample, not its value (timestamp changes every dump)
_NOT_IDENTITY = frozenset({"timestamp"})


def parse_size(text: str) -> int | None:
    """``2.00GB`` -> 2 GiB, a range ``134-135MB`` -> its lower end; None when unreadable.
    Units are read as binary (the Inspector formats sizes by powers of 1024)."""
    m = _SIZE.match(text)
    if m is None:
        return None
    try:
        return round(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))
    except ValueError:
        return None


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v not in (None, "", "unknown") else None
    except ValueError:
        return None


def parse_prom_text(text: str, file_ts: float) -> tuple[list[Record], int]:
    """A Prometheus textfile snapshot -> (records, unreadable lines). One record per label set
    that has an execution time; ``file_ts`` (the file's mtime) stands in when no sample carries
    its own timestamp."""
    by_key: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    labels_of: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    ts_of: dict[tuple[tuple[str, str], ...], float] = {}
    bad = 0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _PROM_LINE.match(line)
        if m is None:
            bad += 1
            continue
        what = _METRICS.get(m.group(1))
        if what is None:
            continue  # a metric we do not use (counts, p2p): not an error
        labels = dict(_LABEL.findall(m.group(2)))
        try:
            value = float(m.group(3))
        except ValueError:
            bad += 1
            continue
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in _NOT_IDENTITY))
        by_key.setdefault(key, {})[what] = value
        labels_of[key] = labels
        if m.group(4):
            ts_of[key] = int(m.group(4)) / 1000.0  # exposition timestamps are milliseconds
    out = []
    for key, vals in by_key.items():
        lb = labels_of[key]
        exec_us = _finite(vals.get("exec"))
        comm = lb.get("comm_id") or lb.get("comm_name") or ""
        coll = lb.get("collective", "")
        size = parse_size(lb.get("message_size", ""))
        rank = _int(lb.get("rank"))
        gpu = lb.get("gpu_device_id") or lb.get("gpu") or ""
        gpu_index = _int(gpu[3:]) if gpu.upper().startswith("GPU") else None
        if exec_us is None or not coll or not comm or size is None or len(comm) > MAX_NAME or len(coll) > MAX_NAME:
            bad += 1
            continue
        if rank is None:
            rank = -1 if gpu_index is None else gpu_index  # newer plugins name the GPU, not the rank
        out.append(Record(ts=ts_of.get(key, file_ts), comm=comm, rank=rank, coll=coll, size=size, exec_us=exec_us,
                          busbw_gbs=_finite(vals.get("busbw")), n_ranks=_int(lb.get("n_ranks") or lb.get("nranks")),
                          n_nodes=_int(lb.get("n_nodes")), hostname=lb.get("hostname") or lb.get("node", ""),
                          pid=_int(lb.get("pid")), sn=_int(lb.get("coll_sn")),
                          timing_source=lb.get("coll_timing_source", ""),
                          job_id=lb.get("slurm_job_id") if _int(lb.get("slurm_job_id")) is not None else None,
                          gpu_index=gpu_index))
    return out, bad


# --- aggregation ---------------------------------------------------------------------------


def size_bucket(nbytes: int) -> int:
    """Power-of-two lower bound: 17179869184 -> 17179869184, 100 MB -> 64 MiB; 0 -> 0."""
    return 0 if nbytes <= 0 else 1 << (int(nbytes).bit_length() - 1)


def percentile(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty list."""
    k = max(0, min(len(sorted_vals) - 1, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[k]


@dataclass(slots=True)
class _Acc:
    count: int = 0
    bytes: float = 0.0
    exec_max: float = 0.0
    execs: list[float] = field(default_factory=list)
    busbws: list[float] = field(default_factory=list)
    stride: int = 1  # keep every stride-th value once MAX_VALUES is reached
    n_ranks: int | None = None
    n_nodes: int | None = None
    pid: int | None = None
    timing_source: str = ""

    def add(self, r: Record) -> None:
        self.count += 1
        self.bytes += r.size
        if r.exec_us > self.exec_max:
            self.exec_max = r.exec_us
        if self.count % self.stride == 0:
            self.execs.append(r.exec_us)
            if r.busbw_gbs is not None:
                self.busbws.append(r.busbw_gbs)
            if len(self.execs) >= MAX_VALUES:  # thin to every other value: memory stays bounded
                self.execs = self.execs[::2]
                self.busbws = self.busbws[::2]
                self.stride *= 2
        self.n_ranks = r.n_ranks or self.n_ranks
        self.n_nodes = r.n_nodes or self.n_nodes
        self.pid = r.pid if r.pid is not None else self.pid
        self.timing_source = r.timing_source or self.timing_source


# (job, comm, rank, coll, size bucket, gpu uuid)
Key = tuple[str | None, str, int, str, int, str | None]


class Aggregator:
    """Records -> ``CollectiveAgg`` per key and ``window_s`` window. ``drain(before)`` hands out
    every window that ended at or before ``before``. For each source file it also tracks the
    offset of the first record still held, so a caller persists only offsets whose records are
    already handed out (``safe_offsets``)."""

    def __init__(self, window_s: float = WINDOW_S, max_keys: int = MAX_KEYS) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self._open: dict[float, dict[Key, _Acc]] = {}
        self._first_offset: dict[float, dict[str, int]] = {}  # window -> file id -> first record offset
        self._n = 0
        self.dropped = 0  # records refused because MAX_KEYS accumulators were open

    def __len__(self) -> int:
        return self._n

    def add(self, r: Record, job_id: str | None, gpu_uuid: str | None, file_id: str = "",
            offset: int = 0) -> bool:
        w = math.floor(r.ts / self.window_s) * self.window_s
        accs = self._open.get(w)
        if accs is None:
            accs = self._open[w] = {}
        key: Key = (job_id, r.comm, r.rank, r.coll, size_bucket(r.size), gpu_uuid)
        acc = accs.get(key)
        if acc is None:
            if self._n >= self.max_keys:
                self.dropped += 1
                return False
            acc = accs[key] = _Acc()
            self._n += 1
        acc.add(r)
        if file_id:
            firsts = self._first_offset.setdefault(w, {})
            if file_id not in firsts or offset < firsts[file_id]:
                firsts[file_id] = offset
        return True

    def drain(self, before: float) -> list[CollectiveAgg]:
        out: list[CollectiveAgg] = []
        for w in sorted(w for w in self._open if w + self.window_s <= before):
            for (job, comm, rank, coll, bucket, gpu), a in self._open.pop(w).items():
                execs = sorted(a.execs)
                bw = sorted(a.busbws)
                out.append(CollectiveAgg(
                    ts=w, window_s=self.window_s, job_id=job, comm=comm, rank=rank, coll=coll, size_bucket=bucket,
                    count=a.count, bytes=a.bytes, exec_us_p50=percentile(execs, 0.5),
                    exec_us_p95=percentile(execs, 0.95), exec_us_max=a.exec_max,
                    busbw_gbs_p50=percentile(bw, 0.5) if bw else None, n_ranks=a.n_ranks, n_nodes=a.n_nodes,
                    gpu_uuid=gpu, pid=a.pid, timing_source=a.timing_source))
                self._n -= 1
            self._first_offset.pop(w, None)
        return out

    def held_offsets(self) -> dict[str, int]:
        """File id -> the smallest offset of a record still held (not yet drained)."""
        out: dict[str, int] = {}
        for firsts in self._first_offset.values():
            for f, off in firsts.items():
                if f not in out or off < out[f]:
                    out[f] = off
        return out

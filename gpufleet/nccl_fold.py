"""NCCL Inspector records -> the protocol's ``collectives`` section (``CollectiveAgg``): the
pure fold, shared by the node agent's Inspector source (agent/sources/nccl_inspector.py, which
reads the files) and the collector's remote-write receiver (collector/remote_write/mapping.py,
which gets the Inspector's Prometheus-mode series from a Prometheus). Standard library and the
protocol only: no I/O, no server packages (the agent installs without them).

* ``Record``: one collective on one rank, in Inspector units (us, GB/s).
* ``record_from_prom(labels, values, ts)``: one Prometheus-mode label set (its three metrics
  ``nccl_bus_bandwidth_gbs``, ``nccl_algorithm_bandwidth_gbs``,
  ``nccl_collective_exec_time_microseconds`` joined on the labels) -> a Record, or None when it
  is not one (no execution time, no communicator or collective, unreadable size).
* ``Aggregator`` folds records into one ``CollectiveAgg`` per (job, communicator, rank,
  collective, size bucket, GPU, window); memory is bounded by ``MAX_KEYS`` open keys and
  ``MAX_VALUES`` kept values per key (count and bytes stay exact past it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufleet.protocol import CollectiveAgg

WINDOW_S = 10.0
MAX_KEYS = 50_000  # open (key, window) accumulators; past it new keys are counted as dropped
MAX_VALUES = 2048  # exec/busbw values kept per accumulator for percentiles (reservoir by stride)
MAX_NAME = 64  # communicator ids, collective names: longer is not an Inspector value

# Prometheus mode: metric name -> which value of the record it carries
PROM_METRICS = {"nccl_bus_bandwidth_gbs": "busbw", "nccl_collective_exec_time_microseconds": "exec",
                "nccl_algorithm_bandwidth_gbs": "algbw"}
# labels that name the sample, not the collective (the timestamp label changes every dump)
PROM_NOT_IDENTITY = frozenset({"timestamp"})
_SIZE = re.compile(r"^\s*([0-9.]+)\s*(?:-\s*[0-9.]+\s*)?([KMGT]?)i?B?\s*$", re.IGNORECASE)


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


def finite_nonneg(v: float | None) -> float | None:
    """The value when it is a reading (finite, >= 0), else None: unknown, never zero."""
    return v if v is not None and math.isfinite(v) and v >= 0 else None


def parse_size(text: str) -> int | None:
    """``2.00GB`` -> 2 GiB, a range ``134-135MB`` -> its lower end; None when unreadable.
    Units are read as binary (the Inspector formats sizes by powers of 1024)."""
    m = _SIZE.match(text)
    if m is None:
        return None
    try:
        unit: int = 1024 ** " KMGT".index(m.group(2).upper() or " ")
        return round(float(m.group(1)) * unit)
    except ValueError:
        return None


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v not in (None, "", "unknown") else None
    except ValueError:
        return None


def record_from_prom(labels: Mapping[str, str], values: Mapping[str, float], ts: float) -> Record | None:
    """One Prometheus-mode label set -> Record; ``values`` maps ``PROM_METRICS``' kinds
    (``exec``, ``busbw``, ``algbw``) to the samples of that label set, ``ts`` is their time.
    Older plugins label ``comm_id``/``rank``/``gpu_device_id``/``n_ranks``; newer ones
    ``comm_name``/``gpu``/``nranks``/``node`` (and no rank: the GPU index stands in)."""
    exec_us = finite_nonneg(values.get("exec"))
    comm = labels.get("comm_id") or labels.get("comm_name") or ""
    coll = labels.get("collective", "")
    size = parse_size(labels.get("message_size", ""))
    rank = _int(labels.get("rank"))
    gpu = labels.get("gpu_device_id") or labels.get("gpu") or ""
    gpu_index = _int(gpu[3:]) if gpu.upper().startswith("GPU") else None
    if exec_us is None or not coll or not comm or size is None or len(comm) > MAX_NAME or len(coll) > MAX_NAME:
        return None
    if rank is None:
        rank = -1 if gpu_index is None else gpu_index  # newer plugins name the GPU, not the rank
    job = labels.get("slurm_job_id")
    return Record(ts=ts, comm=comm, rank=rank, coll=coll, size=size, exec_us=exec_us,
                  busbw_gbs=finite_nonneg(values.get("busbw")),
                  n_ranks=_int(labels.get("n_ranks") or labels.get("nranks")), n_nodes=_int(labels.get("n_nodes")),
                  hostname=labels.get("hostname") or labels.get("node", ""), pid=_int(labels.get("pid")),
                  sn=_int(labels.get("coll_sn")), timing_source=labels.get("coll_timing_source", ""),
                  job_id=job if _int(job) is not None else None, gpu_index=gpu_index)


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

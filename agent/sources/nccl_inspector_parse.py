"""NCCL Inspector output -> records. Pure: text in, records out, no I/O. The fold of records
into the protocol's 10 s aggregates is in ``gpufleet.nccl_fold`` (shared with the collector's
remote-write receiver, which gets the same Prometheus-mode series from a Prometheus).

Two formats (``ext-profiler/inspector`` in the NCCL repository, format ``v4.0``):

* JSON, one object per line, per communicator and collective (``header``, ``metadata``,
  ``coll_perf``; with ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` also ``event_trace_sn`` /
  ``event_trace_ts``, which we accept and ignore: kernel channel times add nothing the
  aggregate needs).
* Prometheus text (``NCCL_INSPECTOR_PROM_DUMP=1``): ``nccl_bus_bandwidth_gbs``,
  ``nccl_algorithm_bandwidth_gbs``, ``nccl_collective_exec_time_microseconds`` with labels
  (``comm_id``, ``collective``, ``rank``, ``slurm_job_id``, ``gpu_device_id``, ``message_size``,
  ``coll_sn``, ...; newer plugins say ``comm_name``, ``gpu``, ``nranks``, ``node``).
"""

from __future__ import annotations

import re

import msgspec

from gpufleet.nccl_fold import MAX_NAME, PROM_METRICS, PROM_NOT_IDENTITY, Record, finite_nonneg, record_from_prom


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
    exec_us = finite_nonneg(p.coll_exec_time_us)
    if exec_us is None or p.coll_msg_size_bytes < 0 or h.rank < 0:
        raise ParseError("coll_exec_time_us, coll_msg_size_bytes or rank negative or not finite")
    return Record(ts=m.dump_timestamp_us / 1e6, comm=h.id, rank=h.rank, coll=p.coll, size=p.coll_msg_size_bytes,
                  exec_us=exec_us, busbw_gbs=finite_nonneg(p.coll_busbw_gbs), n_ranks=h.n_ranks, n_nodes=h.nnodes,
                  hostname=m.hostname, pid=m.pid, sn=p.coll_sn, timing_source=p.coll_timing_source)


# --- Prometheus text -----------------------------------------------------------------------

_PROM_LINE = re.compile(r'^(nccl_[a-z_]+)\{(.*)\}\s+(\S+)(?:\s+(\d+))?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


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
        what = PROM_METRICS.get(m.group(1))
        if what is None:
            continue  # a metric we do not use (counts, p2p): not an error
        labels = dict(_LABEL.findall(m.group(2)))
        try:
            value = float(m.group(3))
        except ValueError:
            bad += 1
            continue
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in PROM_NOT_IDENTITY))
        by_key.setdefault(key, {})[what] = value
        labels_of[key] = labels
        if m.group(4):
            ts_of[key] = int(m.group(4)) / 1000.0  # exposition timestamps are milliseconds
    out = []
    for key, vals in by_key.items():
        r = record_from_prom(labels_of[key], vals, ts_of.get(key, file_ts))
        if r is None:
            bad += 1
        else:
            out.append(r)
    return out, bad

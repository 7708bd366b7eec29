"""The intake schema: what the database can store, per intake section, in one place.

Every bound here is a column's: ``Integer`` is int4, ``BigInteger`` int8, ``Double`` a finite
float (the analysis cannot use NaN/Inf and PostgreSQL's JSON has none), ``String(n)`` n
characters without NUL (PostgreSQL's text cannot hold one), JSON columns finite numbers and
strings without NUL, epoch seconds between 2000 and 2100. A record that breaks a bound is
refused *by itself* (``screen``): the collector stores the rest of its batch and names each
refused record and field in the answer (docs/protocol.md, "Partial acceptance").

Sections screened record by record (side records, which never cost a batch its GPU rows):
``progress``, ``collectives``, ``nics``, ``gpu_nics``. The batch's own parts (agent, gpus, jobs,
allocations, events, samples) are checked whole by ``collector.validate`` with the same
``INT4``/``INT8``/``TEXT`` bounds, and the remote-write labels by ``LABELS`` below.

The fuzz suite (tests/reliability/test_intake_fuzz*.py) draws its values from ``SECTIONS``: at
and past each bound."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgspec

from gpufleet.collector.errors import Rejection
from gpufleet.progress_fold import HIST_MAX_BUCKET, HIST_MIN_BUCKET
from gpufleet.protocol import Batch

INT4 = (-(2**31), 2**31 - 1)
INT8 = (-(2**63), 2**63 - 1)
EPOCH = (946684800.0, 4102444800.0)  # 2000-01-01 .. 2100-01-01
MAX_JSON_BYTES = 65536  # one JSON cell (a window's events, a NIC's counters)

Kind = Literal["int", "float", "text", "epoch", "bool", "float_map", "int_map", "hist", "json"]


@dataclass(frozen=True, slots=True)
class Bound:
    """One field's storable values. ``lo``/``hi``: numbers (inclusive); for text, the length
    (``lo`` = 1: must not be empty); for maps, the key count is ``max_items`` and the values'
    range ``lo``/``hi``; ``choices``: the only texts allowed. ``optional``: None is allowed."""

    kind: Kind
    lo: float = -math.inf
    hi: float = math.inf
    optional: bool = False
    max_items: int = 0
    key_len: int = 64
    choices: tuple[str, ...] = ()
    lo_open: bool = False  # lo itself excluded (a duration that must be > 0)


def _i4(lo: float = 0, hi: float = INT4[1], **kw: Any) -> Bound:
    return Bound("int", lo, hi, **kw)


def _i8(lo: float = 0, hi: float = INT8[1], **kw: Any) -> Bound:
    return Bound("int", lo, hi, **kw)


def _f(lo: float = 0.0, hi: float = 1e300, **kw: Any) -> Bound:
    return Bound("float", lo, hi, **kw)


def _t(hi: int, lo: int = 1, **kw: Any) -> Bound:
    return Bound("text", lo, hi, **kw)


_EPOCH = Bound("epoch", *EPOCH)
_SECONDS = _f(0.0, 1e7)  # a 10 s window's seconds, with room for a sender's other clocks

# storage/progress_models.py: job_progress
PROGRESS: dict[str, Bound] = {
    "job_id": _t(255), "rank": _i4(), "pid": _i4(), "start": _EPOCH, "end": _EPOCH,
    "world_size": _i4(1, optional=True), "local_rank": _i4(optional=True), "gpu": _t(96, 0, optional=True),
    "host": _t(255, 0, optional=True), "steps": _i4(), "first_step": _i8(optional=True),
    "last_step": _i8(optional=True), "max_step": _i8(optional=True), "restarts": _i4(), "lost_steps": _i8(),
    "tokens": _i8(optional=True), "samples": _i8(optional=True), "productive_s": _SECONDS, "stall_s": _SECONDS,
    "unfinished_s": _SECONDS, "spans": Bound("float_map", 0.0, 1e7, max_items=64),
    "span_counts": Bound("int_map", 0, INT4[1], max_items=64),
    "step_time_p50_s": _f(optional=True, hi=1e7), "step_time_p95_s": _f(optional=True, hi=1e7),
    "step_time_max_s": _f(optional=True, hi=1e7),
    # keys: log-1.1 buckets of step seconds (gpufleet.progress_fold), 1 us .. 1e7 s
    "step_hist": Bound("hist", 0, INT4[1], max_items=HIST_MAX_BUCKET - HIST_MIN_BUCKET + 1),
    "last_step_ts": Bound("epoch", *EPOCH, optional=True), "since_step_s": _f(optional=True, hi=1e9),
    "open_span": _t(64, 0, optional=True), "open_span_s": _f(optional=True, hi=1e9),
    "alive": Bound("bool"), "ended": Bound("bool"), "process_start": Bound("epoch", *EPOCH, optional=True),
    "flops_per_step": _f(optional=True), "params": _i8(optional=True), "dropped": _i8(),
    "events": Bound("json", max_items=100), "events_dropped": _i8(),
}

# storage/collectives_models.py: collective_windows
COLLECTIVES: dict[str, Bound] = {
    "ts": _EPOCH, "comm": _t(64), "rank": _i4(-1), "coll": _t(64), "size_bucket": _i8(0, 2**50),
    "count": _i4(1), "bytes": _f(), "exec_us_p50": _f(), "exec_us_p95": _f(), "exec_us_max": _f(),
    "busbw_gbs_p50": _f(optional=True), "window_s": _f(0.0, 3600.0, lo_open=True), "job_id": _t(255, optional=True),
    "n_ranks": _i4(optional=True), "n_nodes": _i4(optional=True), "gpu_uuid": _t(96, optional=True),
    "pid": _i4(optional=True), "timing_source": _t(32, 0),
}

# nic_samples
NICS: dict[str, Bound] = {
    "ts": _EPOCH, "nic": _t(64), "interval_s": _f(0.0, 86400.0, lo_open=True), "link_layer": _t(32, 0),
    "state": _t(32, 0, optional=True), "rate_gbps": _f(optional=True), "tx_bytes_s": _f(optional=True),
    "rx_bytes_s": _f(optional=True), "counters": Bound("float_map", 0.0, 1e300, max_items=256),
}

# gpu_nics
GPU_NICS: dict[str, Bound] = {"gpu_uuid": _t(96), "nic": _t(64), "mode": Bound("text", 1, 16,
                                                                               choices=("pcie", "numa", "node"))}

SECTIONS: dict[str, dict[str, Bound]] = {"progress": PROGRESS, "collectives": COLLECTIVES, "nics": NICS,
                                         "gpu_nics": GPU_NICS}
MAX_RECORDS = {"progress": 100_000, "collectives": 200_000, "nics": 10_000, "gpu_nics": 10_000}

# Remote-write labels (collector/remote_write): a label's name and value as stored, and the
# numbers a label carries into an int4 column (GPU index, NCCL rank).
LABEL_NAME_LEN = 128
LABEL_VALUE_LEN = 1024
LABEL_INT = _i4(0)


def text_problem(v: str, lo: int, hi: int) -> str | None:
    if len(v) < lo:
        return "must not be empty"
    if len(v) > hi:
        return f"{len(v)} characters, at most {hi}"
    if "\x00" in v:
        return "contains a NUL character"
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid UTF-8 (lone surrogate)"
    return None


def _num_problem(v: Any, b: Bound) -> str | None:
    if b.kind == "int":
        if not isinstance(v, int) or isinstance(v, bool):
            return f"{v!r} is not an integer"
    elif not isinstance(v, (int, float)) or isinstance(v, bool):
        return f"{v!r} is not a number"
    elif not math.isfinite(v):
        return f"{v!r} is not a finite number"
    if v < b.lo or v > b.hi or (b.lo_open and v == b.lo):
        return f"{v!r} outside {'(' if b.lo_open else '['}{_fmt(b.lo)}, {_fmt(b.hi)}]"
    return None


def _fmt(x: float) -> str:
    return str(int(x)) if math.isfinite(x) and float(x).is_integer() and abs(x) < 1e20 else f"{x:g}"


def _json_problem(v: Any, depth: int = 0) -> str | None:
    """A value a JSON column holds on both databases: finite numbers, NUL-free strings."""
    if depth > 16:
        return "nested too deeply"
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, float):
        return None if math.isfinite(v) else f"{v!r} is not a finite number"
    if isinstance(v, int):
        return None if INT8[0] <= v <= INT8[1] else f"{v} outside the 64-bit integers"
    if isinstance(v, str):
        return "contains a NUL character" if "\x00" in v else None
    if isinstance(v, dict):
        for k, x in v.items():
            p = _json_problem(k, depth + 1) if isinstance(k, str) else f"key {k!r} is not a string"
            if p or (p := _json_problem(x, depth + 1)):
                return p
        return None
    if isinstance(v, (list, tuple)):
        for x in v:
            if p := _json_problem(x, depth + 1):
                return p
        return None
    return f"{type(v).__name__} is not JSON"


def field_problem(v: Any, b: Bound) -> str | None:
    """Why ``v`` cannot be stored under ``b``; None when it can."""
    if v is None:
        return None if b.optional else "must not be null"
    if b.kind in ("int", "float", "epoch"):
        p = _num_problem(v, b)
        if p and b.kind == "epoch" and "outside" in p:
            return f"{v!r} is not a plausible epoch time (2000-2100)"
        return p
    if b.kind == "bool":
        return None if isinstance(v, bool) else f"{v!r} is not true/false"
    if b.kind == "text":
        if not isinstance(v, str):
            return f"{v!r} is not a string"
        if b.choices and v not in b.choices:
            return f"{v[:64]!r} is not one of {', '.join(b.choices)}"
        return text_problem(v, int(b.lo), int(b.hi))
    if b.kind == "json":
        if isinstance(v, (list, dict)) and len(v) > b.max_items:
            return f"{len(v)} entries, at most {b.max_items}"
        p = _json_problem(v)
        if p is None and len(msgspec.json.encode(v)) > MAX_JSON_BYTES:
            return f"more than {MAX_JSON_BYTES} bytes as JSON"
        return p
    if not isinstance(v, dict):
        return f"{type(v).__name__} is not a map"
    if len(v) > b.max_items:
        return f"{len(v)} entries, at most {b.max_items}"
    vb = Bound("int" if b.kind in ("int_map", "hist") else "float", b.lo, b.hi)
    for k, x in v.items():
        if b.kind == "hist":
            try:
                kb = int(k)
            except (TypeError, ValueError):
                return f"key {str(k)[:32]!r} is not a bucket number"
            if not HIST_MIN_BUCKET <= kb <= HIST_MAX_BUCKET:
                return f"bucket {kb} outside [{HIST_MIN_BUCKET}, {HIST_MAX_BUCKET}] (1 us .. 1e7 s)"
        elif p := (text_problem(k, 1, b.key_len) if isinstance(k, str) else "key is not a string"):
            return f"key {str(k)[:32]!r}: {p}"
        if p := _num_problem(x, vb):
            return f"[{str(k)[:32]!r}]: {p}"
    return None


def _cross(section: str, rec: Any) -> tuple[str, str] | None:
    """Bounds between fields of one record."""
    if section == "progress":
        if rec.end < rec.start:
            return "end", f"{rec.end} is before start {rec.start}"
        if rec.end - rec.start > 86400:
            return "end", f"a window of {rec.end - rec.start:.0f} s, at most 86400"
    return None


def record_problem(section: str, rec: Any) -> tuple[str, str] | None:
    """(field, message) of the first bound ``rec`` breaks, or None."""
    for name, b in SECTIONS[section].items():
        p = field_problem(getattr(rec, name), b)
        if p is not None:
            return name, p
    return _cross(section, rec)


_R = TypeVar("_R")


def screen_records(section: str, records: Sequence[_R]) -> tuple[list[_R], list[Rejection]]:
    """The storable records of one section and a Rejection (422) for each of the others."""
    limit = MAX_RECORDS[section]
    if len(records) > limit:
        return [], [Rejection(413, f"{len(records)} entries, at most {limit} per batch", section)]
    kept: list[_R] = []
    refused: list[Rejection] = []
    for i, r in enumerate(records):
        p = record_problem(section, r)
        if p is None:
            kept.append(r)
        else:
            refused.append(Rejection(422, p[1], section, p[0], i))
    return kept, refused


def screen(batch: Batch) -> tuple[Batch, list[Rejection]]:
    """``batch`` without its unstorable side records, and why each was refused."""
    if not (batch.progress or batch.collectives or batch.nics or batch.gpu_nics):
        return batch, []
    changes: dict[str, Any] = {}
    refused: list[Rejection] = []
    for section in SECTIONS:
        records = getattr(batch, section)
        if records:
            kept, bad = screen_records(section, records)
            if bad:
                changes[section] = kept
                refused += bad
    return (msgspec.structs.replace(batch, **changes) if changes else batch), refused


def refused_json(refused: Sequence[Rejection], limit: int = 100) -> list[dict[str, Any]]:
    """The answer's ``refused`` list (the first ``limit``; ``refused_count`` says how many)."""
    return [{"part": r.part, "row": r.row, "field": r.field, "status": r.status, "detail": r.detail}
            for r in refused[:limit]]

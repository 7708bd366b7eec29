"""Hard limits on a decoded batch, beyond the catalog checks ``storage.writes.prepare`` does:
sizes, string lengths (the schema's and sane ones), integer ranges the columns can hold,
timestamps too far in the past or future. Every message names the field and row; a batch
that fails stores nothing."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from gpufleet.protocol import Batch, GpuInfo, JobInfo
from gpufleet.storage.writes import BatchRejected, Prepared

INT32 = 2**31 - 1
INT63 = 2**63 - 1
MAX_GPUS = 4096
MAX_JOBS = 4096
MAX_ALLOCATIONS = 8192
MAX_EVENTS = 10_000
MAX_LABELS = 64


def _str(where: str, v: str | None, limit: int, *, required: bool = False) -> None:
    if v is None:
        return
    if required and not v:
        raise BatchRejected(f"{where}: must not be empty")
    if len(v) > limit:
        raise BatchRejected(f"{where}: {len(v)} characters, at most {limit}")
    if "\x00" in v:
        raise BatchRejected(f"{where}: contains a NUL character")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise BatchRejected(f"{where}: not valid UTF-8 (lone surrogate)") from None


def _int(where: str, v: int | None, lo: int, hi: int) -> None:
    if v is not None and not lo <= v <= hi:
        raise BatchRejected(f"{where}: {v} outside [{lo}, {hi}]")


def _ts(where: str, v: float | None, lo: float, hi: float) -> None:
    if v is None:
        return
    if not math.isfinite(v):
        raise BatchRejected(f"{where}: {v!r} is not a finite number")
    if v < lo:
        raise BatchRejected(f"{where}: {v:.3f} is too far in the past (before {lo:.0f})")
    if v > hi:
        raise BatchRejected(f"{where}: {v:.3f} is in the future (after {hi:.0f}; check the node's clock)")


def check_batch(batch: Batch, prep: Prepared, now: float, *, max_rows: int, max_age_s: float | None,
                max_future_s: float, dims_checked: bool = False) -> None:
    """Raise BatchRejected (413 for size, 422 otherwise) when ``batch`` breaks a limit.
    ``dims_checked``: the caller already ran check_gpus and check_jobs on these lists."""
    a = batch.agent
    if prep.n > max_rows:
        raise BatchRejected(f"samples: {prep.n} rows, at most {max_rows} per batch", 413)
    for name, n, limit in (("gpus", len(batch.gpus), MAX_GPUS), ("jobs", len(batch.jobs), MAX_JOBS),
                           ("allocations", len(batch.allocations), MAX_ALLOCATIONS),
                           ("events", len(batch.events), MAX_EVENTS)):
        if n > limit:
            raise BatchRejected(f"{name}: {n} entries, at most {limit}", 413)
    lo = now - max_age_s if max_age_s is not None else 946684800.0  # 2000-01-01
    hi = now + max_future_s
    _str("agent.boot_id", a.boot_id, 64, required=True)
    _int("agent.seq", a.seq, 0, INT63)
    _str("agent.node", a.node, 255, required=True)
    _str("agent.cluster", a.cluster, 128, required=True)
    _str("agent.version", a.version, 64)
    if not math.isfinite(a.sent_at):
        raise BatchRejected("agent.sent_at: not a finite number")
    if not dims_checked:
        check_gpus(batch.gpus)
        check_jobs(batch.jobs)
    for i, j in enumerate(batch.jobs):
        _ts(f"jobs[{i}].start_ts", j.start_ts, 946684800.0, hi)
    for i, al in enumerate(batch.allocations):
        _str(f"allocations[{i}].gpu_uuid", al.gpu_uuid, 96, required=True)
        _str(f"allocations[{i}].job_id", al.job_id, 255, required=True)
        _ts(f"allocations[{i}].since", al.since, 946684800.0, hi)
    for i, e in enumerate(batch.events):
        _ts(f"events[{i}].ts", e.ts, lo, hi)
        _str(f"events[{i}].gpu_uuid", e.gpu_uuid, 96)
        _int(f"events[{i}].code", e.code, -INT32, INT32)
        _str(f"events[{i}].message", e.message, 4096)
    if prep.n:
        _check_ts(prep.ts, lo, hi)
        _check_strings("samples.gpu", prep.gpu, 96, required=True)
        _check_strings("samples.job", prep.job, 255, required=False)


def check_gpus(gpus: list[GpuInfo]) -> None:
    """The ``gpus`` list's limits. Depends on nothing but the list itself, so a caller may
    remember that an identical list passed (an agent sends the same one every batch)."""
    listed: set[str] = set()
    for i, g in enumerate(gpus):
        _int(f"gpus[{i}].index", g.index, 0, 65535)
        _str(f"gpus[{i}].uuid", g.uuid, 96, required=True)
        _str(f"gpus[{i}].model", g.model, 128)
        _str(f"gpus[{i}].mig_profile", g.mig_profile, 64)
        _str(f"gpus[{i}].parent_uuid", g.parent_uuid, 96)
        m = g.memory_total_bytes
        if m is not None and not (math.isfinite(m) and 0 <= m <= 1e15):
            raise BatchRejected(f"gpus[{i}].memory_total_bytes: {m!r} outside [0, 1e15]")
        if g.uuid in listed:
            raise BatchRejected(f"gpus[{i}].uuid: {g.uuid!r} listed twice")
        listed.add(g.uuid)


def check_jobs(jobs: list[JobInfo]) -> None:
    """The ``jobs`` list's limits except start_ts (which depends on the clock): like
    check_gpus, a function of the list alone."""
    for i, j in enumerate(jobs):
        w = f"jobs[{i}]"
        _str(f"{w}.job_id", j.job_id, 255, required=True)
        for k, lim in (("user", 255), ("name", 512), ("account", 255), ("partition", 255), ("namespace", 255)):
            _str(f"{w}.{k}", getattr(j, k), lim)
        _int(f"{w}.num_nodes", j.num_nodes, 0, INT32)
        _int(f"{w}.ntasks", j.ntasks, 0, INT32)
        if len(j.labels) > MAX_LABELS:
            raise BatchRejected(f"{w}.labels: {len(j.labels)} labels, at most {MAX_LABELS}")
        for k, v in j.labels.items():
            _str(f"{w}.labels key", k, 128, required=True)
            _str(f"{w}.labels[{k!r}]", v, 1024)


def _check_ts(ts: np.ndarray, lo: float, hi: float) -> None:
    bad = (ts < lo) | (ts > hi)
    if bad.any():
        i = int(np.argmax(bad))
        _ts(f"samples.ts[{i}]", float(ts[i]), lo, hi)


def _check_strings(where: str, col: Iterable[Any], limit: int, *, required: bool) -> None:
    # Rows repeat a handful of distinct values: check each distinct value once.
    col = list(col)
    for v in set(col):
        if v is None:
            continue
        try:
            _str(where, v, limit, required=required)
        except BatchRejected as e:
            i = col.index(v)
            raise BatchRejected(e.detail.replace(where, f"{where}[{i}]", 1), e.status) from None

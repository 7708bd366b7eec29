"""Hard limits on a decoded batch, beyond the catalog checks ``collector.columns.prepare`` does:
sizes, string lengths (the schema's and sane ones), integer ranges the columns can hold,
timestamps too far in the past or future. Every message names the field and row; a batch
that fails stores nothing. The side records (progress, collectives, NIC health) are screened
one by one against the intake schema (``collector.intake_schema``): a bad one is refused by
itself and the rest of the batch is stored."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from gpufleet.collector import intake_schema
from gpufleet.collector.errors import BatchRejected, Rejection, reject
from gpufleet.protocol import Batch, GpuInfo, JobInfo
from gpufleet.storage.prepared import Prepared

INT32 = intake_schema.INT4[1]
INT63 = intake_schema.INT8[1]
MAX_GPUS = 4096
MAX_JOBS = 4096
MAX_ALLOCATIONS = 8192
MAX_EVENTS = 10_000
MAX_LABELS = 64


def _str(part: str, field: str | None, v: str | None, limit: int, *, row: int | None = None,
         required: bool = False) -> None:
    if v is None:
        return
    problem = intake_schema.text_problem(v, 1 if required else 0, limit)
    if problem is not None:
        raise reject(part, problem, field=field, row=row)


def _int(part: str, field: str, v: int | None, lo: int, hi: int, *, row: int | None = None) -> None:
    if v is not None and not lo <= v <= hi:
        raise reject(part, f"{v} outside [{lo}, {hi}]", field=field, row=row)


def _ts(part: str, field: str, v: float | None, lo: float, hi: float, *, row: int | None = None) -> None:
    if v is None:
        return
    if not math.isfinite(v):
        raise reject(part, f"{v!r} is not a finite number", field=field, row=row)
    if v < lo:
        raise reject(part, f"{v:.3f} is too far in the past (before {lo:.0f})", field=field, row=row)
    if v > hi:
        raise reject(part, f"{v:.3f} is in the future (after {hi:.0f}; check the node's clock)", field=field, row=row)


def check_batch(batch: Batch, prep: Prepared, now: float, *, max_rows: int, max_age_s: float | None,
                max_future_s: float, dims_checked: bool = False) -> list[Rejection]:
    """Raise BatchRejected (413 for size, 422 otherwise) when ``batch`` breaks a limit.
    ``dims_checked``: the caller already ran check_gpus and check_jobs on these lists.
    Side records the database cannot store are taken out of ``prep.batch`` (which is then
    stored without them) and returned, one Rejection each."""
    batch, refused = intake_schema.screen(batch)
    prep.batch = batch
    a = batch.agent
    if prep.n > max_rows:
        raise reject("samples", f"{prep.n} rows, at most {max_rows} per batch", status=413)
    for name, n, limit in (("gpus", len(batch.gpus), MAX_GPUS), ("jobs", len(batch.jobs), MAX_JOBS),
                           ("allocations", len(batch.allocations), MAX_ALLOCATIONS),
                           ("events", len(batch.events), MAX_EVENTS)):
        if n > limit:
            raise reject(name, f"{n} entries, at most {limit}", status=413)
    lo = now - max_age_s if max_age_s is not None else 946684800.0  # 2000-01-01
    hi = now + max_future_s
    _str("agent", "boot_id", a.boot_id, 64, required=True)
    _int("agent", "seq", a.seq, 0, INT63)
    _str("agent", "node", a.node, 255, required=True)
    _str("agent", "cluster", a.cluster, 128, required=True)
    _str("agent", "version", a.version, 64)
    if not math.isfinite(a.sent_at):
        raise reject("agent", "not a finite number", field="sent_at")
    if not dims_checked:
        check_gpus(batch.gpus)
        check_jobs(batch.jobs)
    for i, j in enumerate(batch.jobs):
        _ts("jobs", "start_ts", j.start_ts, 946684800.0, hi, row=i)
    for i, al in enumerate(batch.allocations):
        _str("allocations", "gpu_uuid", al.gpu_uuid, 96, row=i, required=True)
        _str("allocations", "job_id", al.job_id, 255, row=i, required=True)
        _ts("allocations", "since", al.since, 946684800.0, hi, row=i)
    for i, e in enumerate(batch.events):
        _ts("events", "ts", e.ts, lo, hi, row=i)
        _str("events", "gpu_uuid", e.gpu_uuid, 96, row=i)
        _int("events", "code", e.code, -INT32, INT32, row=i)
        _str("events", "message", e.message, 4096, row=i)
    if prep.n:
        _check_ts(prep.ts, lo, hi)
        _check_strings("gpu", prep.gpu, 96, required=True)
        _check_strings("job", prep.job, 255, required=False)
    if refused and not (prep.n or batch.gpus or batch.jobs or batch.allocations or batch.events
                        or batch.progress or batch.collectives or batch.nics or batch.gpu_nics):
        # Nothing left to store: the batch itself is refused, naming its first bad record.
        raise BatchRejected(refused[0])
    return refused


def check_gpus(gpus: list[GpuInfo]) -> None:
    """The ``gpus`` list's limits. Depends on nothing but the list itself, so a caller may
    remember that an identical list passed (an agent sends the same one every batch)."""
    listed: set[str] = set()
    for i, g in enumerate(gpus):
        _int("gpus", "index", g.index, 0, 65535, row=i)
        _str("gpus", "uuid", g.uuid, 96, row=i, required=True)
        _str("gpus", "model", g.model, 128, row=i)
        _str("gpus", "mig_profile", g.mig_profile, 64, row=i)
        _str("gpus", "parent_uuid", g.parent_uuid, 96, row=i)
        m = g.memory_total_bytes
        if m is not None and not (math.isfinite(m) and 0 <= m <= 1e15):
            raise reject("gpus", f"{m!r} outside [0, 1e15]", field="memory_total_bytes", row=i)
        if g.uuid in listed:
            raise reject("gpus", f"{g.uuid!r} listed twice", field="uuid", row=i)
        listed.add(g.uuid)


def check_jobs(jobs: list[JobInfo]) -> None:
    """The ``jobs`` list's limits except start_ts (which depends on the clock): like
    check_gpus, a function of the list alone."""
    for i, j in enumerate(jobs):
        _str("jobs", "job_id", j.job_id, 255, row=i, required=True)
        for k, lim in (("user", 255), ("name", 512), ("account", 255), ("partition", 255), ("namespace", 255)):
            _str("jobs", k, getattr(j, k), lim, row=i)
        _int("jobs", "num_nodes", j.num_nodes, 0, INT32, row=i)
        _int("jobs", "ntasks", j.ntasks, 0, INT32, row=i)
        if len(j.labels) > MAX_LABELS:
            raise reject("jobs", f"{len(j.labels)} labels, at most {MAX_LABELS}", field="labels", row=i)
        for k, v in j.labels.items():
            _str("jobs", "labels key", k, 128, row=i, required=True)
            _str("jobs", f"labels[{k!r}]", v, 1024, row=i)


def _check_ts(ts: np.ndarray, lo: float, hi: float) -> None:
    bad = (ts < lo) | (ts > hi)
    if bad.any():
        i = int(np.argmax(bad))
        _ts("samples", "ts", float(ts[i]), lo, hi, row=i)


def _check_strings(field: str, col: Iterable[Any], limit: int, *, required: bool) -> None:
    # Rows repeat a handful of distinct values: check each distinct value once.
    col = list(col)
    for v in set(col):
        if v is None:
            continue
        try:
            _str("samples", field, v, limit, required=required)
        except BatchRejected as e:
            raise e.at(row=col.index(v)) from None

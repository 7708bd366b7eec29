"""Into the product through its public entry points, and back out.

Batches: rendered samples become protocol v1 batches (``gpufleet.protocol``: one per node per
10 minutes, packed binary columns as agents send them, a new ``boot_id`` after every agent
restart), validated by the collector's ``check_batch`` and stored by
``storage.writes.write_batches``, the code behind ``POST /api/v1/ingest``.
NDJSON: imported-history scenarios become NDJSON lines (docs/protocol.md) loaded by
``collector.ndjson.import_file``, the code behind ``gpufleet import``.
Analysis: ``analysis.runner.run_analysis``, the function ``gpufleet analyze`` calls.
Read back: the ``jobs``, ``flags`` and ``job_reports`` tables (every column, so fields added
later, such as a confidence, come along)."""

from __future__ import annotations

import json
import uuid as uuidlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .model import JobSpec
from .render import Rendered, render

BATCH_SPAN_S = 600.0


@dataclass
class RenderedJob:
    spec: JobSpec
    t0: float  # absolute start
    gpus: list[Rendered]  # per slot


def render_job(spec: JobSpec, *, base_ts: float, interval_s: float, rng: np.random.Generator) -> RenderedJob:
    t0 = base_ts + spec.offset_s
    out = []
    for s, g in zip(spec.slots, spec.truths, strict=True):
        out.append(render(g, t0=t0, interval_s=interval_s, field_set=spec.node_field_set.get(s.node, spec.field_set),
                          rng=rng,
                          gaps=spec.gaps.get(s.node, []), profiling_paused=spec.profiling_paused))
    return RenderedJob(spec, t0, out)


def _packed(rows: list[tuple[str, str, Rendered, np.ndarray]]) -> Any:
    from gpufleet.protocol import Packed

    ts = np.concatenate([r.ts[m] for _, _, r, m in rows])
    gpus = [u for u, _, _, _ in rows]
    gidx = np.concatenate([np.full(int(m.sum()), i, np.uint16) for i, (_, _, _, m) in enumerate(rows)])
    jobs = list(dict.fromkeys(j for _, j, _, _ in rows))
    jidx = np.concatenate([np.full(int(m.sum()), jobs.index(j), np.int32) for _, j, _, m in rows])
    fields = sorted({f for _, _, r, _ in rows for f in r.cols})
    blocks = []
    for f in fields:
        blocks.append(np.concatenate([r.cols[f][m] if f in r.cols else np.full(int(m.sum()), np.nan)
                                      for _, _, r, m in rows]))
    values = np.concatenate(blocks).astype("<f8") if blocks else np.zeros(0, "<f8")
    return Packed(n=int(ts.size), ts=ts.astype("<f8").tobytes(), gpus=gpus, gpu=gidx.astype("<u2").tobytes(),
                  fields=fields, values=values.tobytes(), jobs=jobs, job=jidx.astype("<i4").tobytes())


def batches_for(jobs: list[RenderedJob], *, cluster: str = "default") -> list[Any]:
    """Protocol batches for jobs rendered on the same timeline: per node, per 10-minute span."""
    from gpufleet.protocol import AgentInfo, Allocation, Batch, Event, GpuInfo, JobInfo

    per_node: dict[str, list[tuple[RenderedJob, int]]] = defaultdict(list)
    for rj in jobs:
        for k, s in enumerate(rj.spec.slots):
            per_node[s.node].append((rj, k))
    out = []
    for node, members in per_node.items():
        t_lo = min(rj.t0 for rj, _ in members)
        t_hi = max(rj.t0 + rj.spec.duration_s for rj, _ in members)
        gaps = sorted({g for rj, _ in members for g in rj.spec.gaps.get(node, [])})
        boot = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"realworld/{node}/0").hex
        seq = 0
        gi = 0
        t = t_lo
        while t < t_hi:
            t_end = t + BATCH_SPAN_S
            # An agent restart (a gap) gives a new boot_id and seq from 0, as the real agent does.
            while gi < len(gaps) and gaps[gi][0] + members[0][0].t0 <= t:
                gi += 1
                boot = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"realworld/{node}/{gi}").hex
                seq = 0
            rows = []
            gpu_infos, job_infos, allocs, events = [], {}, [], []
            for rj, k in members:
                s, r = rj.spec.slots[k], rj.gpus[k]
                m = (r.ts >= t) & (r.ts < t_end)
                gpu_infos.append(GpuInfo(index=s.index, uuid=s.uuid, model=s.device.model,
                                         mig_profile=s.device.mig_profile, parent_uuid=s.parent_uuid,
                                         memory_total_bytes=s.device.memory_total_bytes))
                # Events travel whether or not the GPU still samples: an XID 79 is the last
                # thing a GPU that fell off the bus says.
                for et, kind, code, msg in rj.spec.truths[k].events:
                    if t <= rj.t0 + et < t_end:
                        events.append(Event(ts=rj.t0 + et, kind=kind, gpu_uuid=s.uuid, code=code, message=msg))
                if not m.any():
                    continue
                rows.append((s.uuid, rj.spec.job_id, r, m))
                meta = dict(rj.spec.meta)
                meta.setdefault("start_ts", rj.t0)
                job_infos[rj.spec.job_id] = JobInfo(job_id=rj.spec.job_id, **meta)
                allocs.append(Allocation(gpu_uuid=s.uuid, job_id=rj.spec.job_id, since=rj.t0))
            if rows or events:
                out.append(Batch(agent=AgentInfo(boot_id=boot, seq=seq, node=node, cluster=cluster, version="realworld",
                                                 sent_at=t_end), gpus=gpu_infos, jobs=list(job_infos.values()),
                                 allocations=allocs, events=events, packed=_packed(rows) if rows else None))
                seq += 1
            t = t_end
    return out


def write_batches_checked(engine: Any, batches: list[Any], now: float) -> int:
    """Validate each batch as the ingest endpoint does, then store them (one transaction per
    group of batches). Returns the rows stored."""
    from gpufleet import protocol
    from gpufleet.collector.columns import prepare
    from gpufleet.collector.validate import check_batch
    from gpufleet.storage.writes import WriteCache, write_batches

    try:
        from gpufleet.collector.fastdecode import decode_prepared
    except ImportError:  # the generic path alone still validates everything
        decode_prepared = None  # type: ignore[assignment]

    cache = WriteCache()
    stored = 0
    preps = []
    for b in batches:
        # What POST /api/v1/ingest does with a body: the fast packed decoder, else the generic
        # decode and prepare; then the same limits check.
        raw, _ = protocol.encode(b, compress=None)
        p = decode_prepared(raw, protocol.MSGPACK) if decode_prepared is not None else None
        fast = p is not None
        if p is None:
            p = prepare(protocol.decode(raw, protocol.MSGPACK))
        check_batch(p.batch, p, now, max_rows=20_000, max_age_s=None, max_future_s=300.0, dims_checked=fast)
        preps.append(p)
    for i in range(0, len(preps), 32):
        with engine.begin() as conn:
            res = write_batches(conn, preps[i:i + 32], now, cache)
        stored += sum(getattr(r, "stored", 0) for r in getattr(res, "results", []) or [])
    return stored


def ndjson_lines(jobs: list[RenderedJob]) -> list[str]:
    """NDJSON import lines (docs/protocol.md): ts, node, gpu index, job, user, fields."""
    lines = []
    for rj in jobs:
        for s, r in zip(rj.spec.slots, rj.gpus, strict=True):
            names = list(r.cols)
            for i in range(r.ts.size):
                d: dict[str, Any] = {"ts": round(float(r.ts[i]), 3), "node": s.node, "gpu": s.index,
                                     "job": rj.spec.job_id, "user": rj.spec.meta.get("user")}
                for f in names:
                    v = float(r.cols[f][i])
                    if v == v:
                        d[f] = v
                lines.append(json.dumps(d, separators=(",", ":")))
    return lines


def import_ndjson(engine: Any, jobs: list[RenderedJob], path: Path) -> None:
    from gpufleet.collector.ndjson import import_file

    if not jobs:
        return
    path.write_text("\n".join(ndjson_lines(jobs)) + "\n")
    import_file(engine, str(path))


Row = dict[str, Any]


def read_back(engine: Any) -> tuple[dict[str, Row], dict[str, list[Row]], dict[str, Row]]:
    """(jobs by job id, flags by job id, reports by job id), every column as stored."""
    from sqlalchemy import text

    with engine.connect() as conn:
        jobs = {r["job_id"]: dict(r) for r in conn.execute(text("select * from jobs")).mappings()}
        by_pk = {j["id"]: jid for jid, j in jobs.items()}
        flags: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in conn.execute(text("select * from flags")).mappings():
            flags[by_pk[r["job_pk"]]].append(_decoded(dict(r)))
        reports = {by_pk[r["job_pk"]]: _decoded(dict(r))
                   for r in conn.execute(text("select * from job_reports")).mappings()}
    return jobs, dict(flags), reports


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    for k, v in row.items():  # JSON columns come back as text on SQLite through text()
        if isinstance(v, str) and v[:1] in "{[":
            try:
                row[k] = json.loads(v)
            except ValueError:
                pass
    return row

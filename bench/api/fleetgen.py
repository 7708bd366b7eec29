"""Generate a 1,000-GPU x 24 h fleet straight into the rollup tables of a throwaway database.

125 nodes x 8 GPUs. Nodes 0-7 run one 64-GPU job for the whole day (the job-page budget
case); every other half-node (4 GPUs) runs a sequence of 1-8 h jobs with short idle gaps, each
job drawn from a profile (healthy, idle, low SM, no tensor cores, input stall). Every GPU
reports every minute (idle GPUs too, job_pk NULL), so gpu_samples_1m holds 1,000 x 1,440 =
1.44 M rows. Jobs get reports (with per-GPU rows) and flags the way the goodput engine writes
them.

PostgreSQL is loaded with asyncpg's binary COPY (the fastest path measured here); SQLite with
one executemany transaction."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine, insert, select, text

from gpufleet.catalog import CATALOG
from gpufleet.storage.db import asyncpg_dsn
from gpufleet.storage.dialect import is_sqlite
from gpufleet.storage.models import Allocation, Cluster, Event, Flag, Gpu, Job, JobReport, Node
from gpufleet.storage.retention import day_of, ensure_partitions

GIB = 1024**3
NODES = 125
PER_NODE = 8
# profile: sm, tensor, dram, power W, clock MHz, flag kind (None = healthy), weight
PROFILES = {
    "healthy": (0.88, 0.55, 0.45, 620.0, 1980.0, None, 0.55),
    "idle": (0.02, 0.0, 0.01, 80.0, 345.0, "idle_gpu", 0.1),
    "low_sm": (0.25, 0.1, 0.15, 250.0, 1980.0, "low_sm_activity", 0.15),
    "fp32": (0.7, 0.02, 0.4, 450.0, 1980.0, "no_tensor_cores", 0.1),
    "stall": (0.45, 0.25, 0.2, 350.0, 1980.0, "input_stall", 0.1),
}
SUGGEST = {
    "idle_gpu": "The GPUs sat idle: release the allocation or run the work on them.",
    "low_sm_activity": "Most SMs idle: raise the batch size or fuse small kernels.",
    "no_tensor_cores": "No tensor-core use: enable bf16/fp16 autocast or TF32.",
    "input_stall": "GPU waits on input: more DataLoader workers, pinned memory, prefetch.",
}
FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "gr_engine_active", "gpu_util", "power_w",
          "temp_c", "sm_clock_mhz", "mem_clock_mhz", "fb_used_bytes", "fb_total_bytes", "clock_event_reasons",
          "nvlink_tx_bytes_s", "nvlink_rx_bytes_s", "pcie_tx_bytes_s", "pcie_rx_bytes_s", "ib_tx_bytes_s",
          "ib_rx_bytes_s")


@dataclass
class Fleet:
    start: float
    end: float
    gpus: int
    rollup_rows: int
    job_rows: int
    jobs: int
    big_job: str
    job_ids: list[str]
    seconds: float


@dataclass
class _Job:
    job_id: str
    gpus: list[int]  # GPU indexes 0..999
    m0: int  # first minute
    m1: int  # one past the last minute
    profile: str
    user: str
    pk: int = 0


def _plan(minutes: int, rng: random.Random) -> list[_Job]:
    jobs = [_Job("big-64", list(range(64)), 0, minutes, "healthy", "erin")]
    users = [f"user{u:02d}" for u in range(40)]
    names = list(PROFILES)
    weights = [PROFILES[p][6] for p in names]
    n = 0
    for first in range(64, NODES * PER_NODE, 4):
        m = rng.randrange(0, 60)
        while m < minutes - 10:
            length = rng.randrange(60, 8 * 60)
            n += 1
            jobs.append(_Job(str(100000 + n), list(range(first, first + 4)), m, min(minutes, m + length),
                             rng.choices(names, weights)[0], rng.choice(users)))
            m += length + rng.randrange(0, 30)
    return jobs


def generate(engine: Engine, *, hours: float = 24.0, seed: int = 1) -> Fleet:
    t_start = time.perf_counter()
    rng = random.Random(seed)
    now = time.time()
    minutes = int(hours * 60)
    end = math.floor(now / 60) * 60
    start = end - (minutes - 1) * 60
    ensure_partitions(engine, {day_of(start + d * 3600) for d in range(int(hours) + 2)} | {day_of(now)})
    plan = _plan(minutes, rng)
    n_gpus = NODES * PER_NODE

    with engine.begin() as c:
        cid = c.execute(select(Cluster.id).where(Cluster.name == "default")).scalar_one()
        node_ids = [c.execute(insert(Node).values(cluster_id=cid, name=f"gpu-{i:03d}", agent_version="0.1.0",
                                                  last_seen=now, labels={"rack": f"r{i // 16}"})
                              .returning(Node.id)).scalar_one() for i in range(NODES)]
        c.execute(insert(Gpu), [{"node_id": node_ids[g // PER_NODE], "uuid": f"GPU-{g:04d}-bench",
                                 "index": g % PER_NODE,
                                 "model": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80.0 * GIB,
                                 "last_seen": now} for g in range(n_gpus)])
        gpu_pk = dict(c.execute(select(Gpu.uuid, Gpu.id)).all())
        gpk = np.array([gpu_pk[f"GPU-{g:04d}-bench"] for g in range(n_gpus)], dtype=np.int64)
        for j in plan:
            ended = j.m1 < minutes
            j.pk = c.execute(insert(Job).values(
                cluster_id=cid, job_id=j.job_id, source="slurm", user=j.user, name=f"{j.profile}-{j.job_id}",
                account="ml", partition="gpu", state="ended" if ended else "running", start_ts=start + j.m0 * 60,
                end_ts=start + j.m1 * 60 if ended else None, last_sample_ts=start + (j.m1 - 1) * 60,
                num_nodes=max(1, len(j.gpus) // PER_NODE), labels={}).returning(Job.id)).scalar_one()
        c.execute(insert(Allocation), [{"job_pk": j.pk, "gpu_pk": int(gpk[g]), "start_ts": start + j.m0 * 60,
                                        "end_ts": start + j.m1 * 60 if j.m1 < minutes else None}
                                       for j in plan for g in j.gpus])

        # per GPU-minute: which job (index into plan, -1 = idle) -> metric grids
        owner = np.full((n_gpus, minutes), -1, dtype=np.int64)
        for i, j in enumerate(plan):
            owner[j.gpus, j.m0:j.m1] = i
        prof = np.array([[*PROFILES[j.profile][:5]] for j in plan] + [[0.0, 0.0, 0.0, 70.0, 345.0]])
        noise = np.random.default_rng(seed)
        base = prof[owner]  # (gpus, minutes, 5); owner -1 picks the idle row
        wave = 0.05 * np.sin(np.arange(minutes) / 40.0)[None, :]
        sm = np.clip(base[..., 0] + wave * (owner >= 0) + noise.normal(0, 0.02, owner.shape), 0, 1)
        tensor = np.clip(base[..., 1] + noise.normal(0, 0.01, owner.shape), 0, 1)
        dram = np.clip(base[..., 2] + noise.normal(0, 0.01, owner.shape), 0, 1)
        power = np.clip(base[..., 3] + noise.normal(0, 10, owner.shape), 50, 700)
        clock = base[..., 4]
        busy = owner >= 0
        cols = {
            "sm_active": sm, "sm_occupancy": sm * 0.6, "tensor_active": tensor, "dram_active": dram,
            "gr_engine_active": sm, "gpu_util": (sm > 0.05).astype(float), "power_w": power,
            "temp_c": 35 + power / 14, "sm_clock_mhz": clock, "mem_clock_mhz": np.full(owner.shape, 2619.0),
            "fb_used_bytes": np.where(busy, 40.0 * GIB, 0.5 * GIB), "fb_total_bytes": np.full(owner.shape, 80.0 * GIB),
            "clock_event_reasons": np.where(power > 640, 4, np.where(busy, 0, 1)),
            "nvlink_tx_bytes_s": sm * 8e9, "nvlink_rx_bytes_s": sm * 8e9, "pcie_tx_bytes_s": busy * 2e8,
            "pcie_rx_bytes_s": busy * 6e8, "ib_tx_bytes_s": sm * 3e9 * (owner == 0),
            "ib_rx_bytes_s": sm * 3e9 * (owner == 0),
        }
        buckets = start + 60.0 * np.arange(minutes)
        job_pk_of = np.array([j.pk for j in plan] + [0], dtype=np.int64)
        job_rows = _job_rows(plan, buckets, owner, cols)
        _reports_and_flags(c, plan, cols, owner, start, minutes, now, rng)
        c.execute(insert(Event), [{"ts": now - rng.uniform(0, 86400), "node_id": rng.choice(node_ids),
                                   "gpu_pk": int(gpk[rng.randrange(n_gpus)]), "kind": "xid",
                                   "code": rng.choice([13, 31, 43, 48, 79, 94]), "message": "Xid error"}
                                  for _ in range(300)])
    # per-GPU rows in chunks of 100 GPUs (144k rows): bounded memory
    chunks = (_gpu_rows(gpk[i:i + 100], buckets, owner[i:i + 100], job_pk_of,
                        {k: v[i:i + 100] for k, v in cols.items()}) for i in range(0, n_gpus, 100))
    n_rows = _load(engine, chunks, job_rows)
    with engine.connect() as c:
        c.execute(text("ANALYZE"))
        c.commit()
    return Fleet(start=start, end=end, gpus=n_gpus, rollup_rows=n_rows, job_rows=len(job_rows),
                 jobs=len(plan), big_job="big-64", job_ids=[j.job_id for j in plan],
                 seconds=time.perf_counter() - t_start)


ROLLUP_COLS = ("bucket", "gpu_pk", "job_pk", "n", "last_ts", *FIELDS)
JOB_COLS = ("bucket", "job_pk", "n", "last_ts", *FIELDS)
_INT = {"clock_event_reasons"}


def _gpu_rows(gpk: np.ndarray, buckets: np.ndarray, owner: np.ndarray, job_pk_of: np.ndarray,
              cols: dict[str, np.ndarray]) -> list[tuple[Any, ...]]:
    g, m = owner.shape
    b = np.broadcast_to(buckets[None, :], (g, m)).ravel().tolist()
    gp = np.broadcast_to(gpk[:, None], (g, m)).ravel().tolist()
    jp = [None if x == 0 else x for x in job_pk_of[owner].ravel().tolist()]
    n = [60] * (g * m)
    last = (np.broadcast_to(buckets[None, :], (g, m)) + 59).ravel().tolist()
    vals = [(cols[f].astype(np.int64) if f in _INT else cols[f].astype(np.float32).astype(np.float64)).ravel().tolist()
            for f in FIELDS]
    return list(zip(b, gp, jp, n, last, *vals, strict=True))


def _job_rows(plan: list[_Job], buckets: np.ndarray, owner: np.ndarray,
              cols: dict[str, np.ndarray]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for j in plan:
        sl = (j.gpus, slice(j.m0, j.m1))
        means = [cols[f][sl].max(axis=0) if f in _INT else cols[f][sl].mean(axis=0) for f in FIELDS]
        for k, m in enumerate(range(j.m0, j.m1)):
            out.append((float(buckets[m]), j.pk, 60 * len(j.gpus), float(buckets[m]) + 59,
                        *((int(v[k]) if f in _INT else float(v[k])) for f, v in zip(FIELDS, means, strict=True))))
    return out


def _reports_and_flags(c: Any, plan: list[_Job], cols: dict[str, np.ndarray], owner: np.ndarray, start: float,
                       minutes: int, now: float, rng: random.Random) -> None:
    reports, flags = [], []
    for j in plan:
        sl = (j.gpus, slice(j.m0, j.m1))
        hours = (j.m1 - j.m0) / 60 * len(j.gpus)
        sm = float(cols["sm_active"][sl].mean())
        tensor = float(cols["tensor_active"][sl].mean())
        kind = PROFILES[j.profile][5]
        waste = {kind: hours * (1 - sm)} if kind else {}
        per_gpu = [{"gpu_uuid": f"GPU-{g:04d}-bench", "node": f"gpu-{g // PER_NODE:03d}", "index": g % PER_NODE,
                    "sm_active_mean": float(cols["sm_active"][g, j.m0:j.m1].mean()),
                    "tensor_active_mean": float(cols["tensor_active"][g, j.m0:j.m1].mean()),
                    "dram_active_mean": float(cols["dram_active"][g, j.m0:j.m1].mean()),
                    "power_w_mean": float(cols["power_w"][g, j.m0:j.m1].mean()),
                    "sm_clock_mhz_mean": float(cols["sm_clock_mhz"][g, j.m0:j.m1].mean()),
                    "fb_used_bytes_max": 40.0 * GIB} for g in j.gpus]
        rep = {"window": {"start": start + j.m0 * 60, "end": start + j.m1 * 60}, "n_gpus": len(j.gpus),
               "gpu_model": "NVIDIA H100 80GB HBM3", "allocated_gpu_hours": hours, "active_gpu_hours": hours * sm,
               "goodput_score": sm, "stats": {f: {"mean": float(cols[f][sl].mean()), "p50": 0.0, "p95": 0.0}
                                              for f in ("sm_active", "sm_occupancy", "tensor_active", "dram_active")},
               "mfu": {"estimate": tensor * 0.8, "achieved_tflops": 989 * tensor * 0.8, "peak_tflops": 989.0,
                       "basis": "tensor_active"},
               "wasted_gpu_hours": waste, "wasted_gpu_hours_total": sum(waste.values()), "per_gpu": per_gpu}
        reports.append({"job_pk": j.pk, "computed_at": now, "analyzed_until": start + j.m1 * 60, "goodput_score": sm,
                        "allocated_gpu_hours": hours, "wasted_gpu_hours": sum(waste.values()), "report": rep})
        if kind:
            flags.append({"job_pk": j.pk, "kind": kind, "scope": "", "severity": rng.choice(["warning", "critical"]),
                          "start_ts": start + j.m0 * 60, "end_ts": start + j.m1 * 60,
                          "wasted_gpu_hours": waste[kind],
                          "evidence": {"sm_active_mean": sm, "tensor_active_mean": tensor},
                          "suggestion": SUGGEST[kind], "open": j.m1 >= minutes, "opened_at": start + j.m0 * 60 + 600,
                          "resolved_at": None if j.m1 >= minutes else start + j.m1 * 60})
    c.execute(insert(JobReport), reports)
    c.execute(insert(Flag), flags)


def _load(engine: Engine, gpu_chunks: Iterator[list[tuple[Any, ...]]], job_rows: list[tuple[Any, ...]]) -> int:
    n = 0
    if is_sqlite(engine.url.render_as_string(hide_password=False)):
        with engine.begin() as c:
            raw = c.connection.driver_connection

            def put(table: str, colnames: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
                ph = ",".join("?" * len(colnames))
                raw.executemany(f"INSERT INTO {table} ({','.join(colnames)}) VALUES ({ph})", rows)

            for chunk in gpu_chunks:
                put("gpu_samples_1m", ROLLUP_COLS, chunk)
                n += len(chunk)
            put("job_samples_1m", JOB_COLS, job_rows)
        return n

    async def copy() -> int:
        import asyncpg

        conn = await asyncpg.connect(asyncpg_dsn(engine.url.render_as_string(hide_password=False)))
        k = 0
        try:
            for chunk in gpu_chunks:
                await conn.copy_records_to_table("gpu_samples_1m", records=chunk, columns=list(ROLLUP_COLS))
                k += len(chunk)
            await conn.copy_records_to_table("job_samples_1m", records=job_rows, columns=list(JOB_COLS))
        finally:
            await conn.close()
        return k

    return asyncio.run(copy())


assert all(f in CATALOG for f in FIELDS)

"""A small, realistic fleet written straight into the tables (the collector's and analysis'
writers are tested elsewhere): 2 nodes x 4 GPUs, two hours of 1-minute rollups, jobs with and
without reports, flags with evidence, XID events, and a job whose name and user are XSS
payloads. Shared by tests/api and tests/web."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, insert, select

from gpufleet.catalog import CATALOG
from gpufleet.storage.gpu_ledger import GpuLedgerMinute
from gpufleet.storage.models import (
    Allocation,
    Cluster,
    Event,
    Flag,
    Gpu,
    Job,
    JobReport,
    Node,
    gpu_samples_1m,
    job_samples_1m,
)
from gpufleet.storage.retention import day_of, ensure_partitions

XSS_NAME = "<script>alert(1)</script>"
XSS_USER = '<img src=x onerror="window.__xss=1">'
GIB = 1024**3


@dataclass
class Seeded:
    now: float
    start: float
    minutes: int
    gpu_uuids: dict[str, list[str]] = field(default_factory=dict)  # node -> uuids
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # job_id -> facts


def _row(minute_ts: float, gpu_pk: int, job_pk: int | None, sm: float, tensor: float, dram: float,
         power: float, clock: float, reasons: int = 0) -> dict[str, Any]:
    r: dict[str, Any] = {f.name: None for f in CATALOG.fields}
    r.update(bucket=minute_ts, last_ts=minute_ts + 59, gpu_pk=gpu_pk, job_pk=job_pk, n=60, sm_active=sm,
             sm_occupancy=sm * 0.6,
             tensor_active=tensor, dram_active=dram, gr_engine_active=sm, gpu_util=1.0 if sm > 0.02 else 0.0,
             power_w=power, temp_c=40 + power / 14, sm_clock_mhz=clock, mem_clock_mhz=2619.0,
             fb_used_bytes=30.0 * GIB if job_pk else 0.0, fb_total_bytes=80.0 * GIB, clock_event_reasons=reasons,
             nvlink_tx_bytes_s=5e9 * sm, nvlink_rx_bytes_s=5e9 * sm, pcie_tx_bytes_s=1e8, pcie_rx_bytes_s=3e8,
             ib_tx_bytes_s=2e9 * sm, ib_rx_bytes_s=2e9 * sm)
    return r


def seed(engine: Engine, *, minutes: int = 120, now: float | None = None) -> Seeded:
    now = now or time.time()
    end_min = math.floor(now / 60) * 60
    start = end_min - (minutes - 1) * 60
    s = Seeded(now=now, start=start, minutes=minutes)
    # PostgreSQL range-partitions the rollups by UTC day (no-op on SQLite)
    ensure_partitions(engine, {day_of(start + m * 60) for m in range(0, minutes, 30)} | {day_of(now)})
    with engine.begin() as c:
        # the initial migration creates the "default" cluster
        cid = c.execute(select(Cluster.id).where(Cluster.name == "default")).scalar() or c.execute(
            insert(Cluster).values(name="default").returning(Cluster.id)).scalar_one()
        cid2 = c.execute(insert(Cluster).values(name="other").returning(Cluster.id)).scalar_one()
        gpk: dict[str, list[int]] = {}
        for ni, name in enumerate(("node-a", "node-b")):
            nid = c.execute(insert(Node).values(cluster_id=cid, name=name, agent_version="0.1.0", last_seen=now,
                                                labels={"rack": f"r{ni}"}).returning(Node.id)).scalar_one()
            gpk[name] = []
            s.gpu_uuids[name] = []
            for i in range(4):
                uuid = f"GPU-{ni:02d}{i:02d}aaaa-0000-0000-0000-000000000000"
                pk = c.execute(insert(Gpu).values(node_id=nid, uuid=uuid, index=i, model="NVIDIA H100 80GB HBM3",
                                                  memory_total_bytes=80.0 * GIB, last_seen=now)
                               .returning(Gpu.id)).scalar_one()
                gpk[name].append(pk)
                s.gpu_uuids[name].append(uuid)
            if name == "node-b":
                c.execute(insert(Event).values(ts=now - 600, node_id=nid, gpu_pk=gpk[name][3], kind="xid", code=79,
                                               message="GPU has fallen off the bus <b>bold?</b>"))
                c.execute(insert(Event).values(ts=now - 900, node_id=nid, gpu_pk=gpk[name][2], kind="ecc_sbe",
                                               code=None, message="single-bit ECC errors: 3"))

        def job(job_id: str, *, name: str, user: str, state: str, start_ts: float, end_ts: float | None,
                cluster: int = cid, labels: dict[str, Any] | None = None) -> int:
            return c.execute(insert(Job).values(cluster_id=cluster, job_id=job_id, source="slurm", user=user, name=name,
                                                account="ml", partition="gpu", state=state, start_ts=start_ts,
                                                end_ts=end_ts, last_sample_ts=end_ts or now, num_nodes=1,
                                                labels=labels or {}).returning(Job.id)).scalar_one()

        good = job("1001", name="llama-pretrain", user="alice", state="running", start_ts=start, end_ts=None)
        idle = job("1002", name="notebook", user="bob", state="running", start_ts=start, end_ts=None)
        ended = job("1003", name="eval-sweep", user="carol", state="ended", start_ts=start, end_ts=start + 1800)
        xss = job("666", name=XSS_NAME, user=XSS_USER, state="running", start_ts=start + 600, end_ts=None,
                  labels={"team": "<b>x</b>"})
        job("1001", name="same id, other cluster", user="dave", state="ended", start_ts=start - 86400,
            end_ts=start - 80000, cluster=cid2)

        plan = [(good, gpk["node-a"], 0.92, 0.55, 0.40, 620.0, 1980.0, start, None),
                (idle, gpk["node-b"][:2], 0.01, 0.0, 0.01, 75.0, 345.0, start, None),
                (ended, gpk["node-b"][2:3], 0.5, 0.2, 0.3, 400.0, 1800.0, start, start + 1800),
                (xss, gpk["node-b"][3:4], 0.3, 0.1, 0.2, 300.0, 1500.0, start + 600, None)]
        s.jobs = {"1001": {"pk": good, "gpus": 4, "sm": 0.92}, "1002": {"pk": idle, "gpus": 2, "sm": 0.01},
                  "1003": {"pk": ended, "gpus": 1, "sm": 0.5}, "666": {"pk": xss, "gpus": 1, "sm": 0.3}}
        grows: list[dict[str, Any]] = []
        jrows: list[dict[str, Any]] = []
        for jpk, pks, sm, tensor, dram, power, clock, t0, t1 in plan:
            for pk in pks:
                c.execute(insert(Allocation).values(job_pk=jpk, gpu_pk=pk, start_ts=t0, end_ts=t1))
            for m in range(minutes):
                ts = start + m * 60
                if ts < t0 or (t1 is not None and ts >= t1):
                    continue
                wobble = 0.03 * math.sin(m / 7)
                rows = [_row(ts, pk, jpk, max(0.0, min(1.0, sm + wobble + 0.01 * k)), tensor, dram, power, clock,
                             reasons=0x4 if (jpk == xss and m % 3 == 0) else 0) for k, pk in enumerate(pks)]
                grows.extend(rows)
                agg = {f: (sum(r[f] for r in rows) / len(rows) if rows[0][f] is not None else None)
                       for f in CATALOG.names}
                agg["clock_event_reasons"] = max(r["clock_event_reasons"] for r in rows)
                jrows.append({**agg, "bucket": ts, "last_ts": ts + 59, "job_pk": jpk, "n": 60 * len(rows)})
        c.execute(insert(gpu_samples_1m), grows)
        c.execute(insert(job_samples_1m), jrows)

        hours = minutes / 60
        c.execute(insert(JobReport).values(
            job_pk=good, computed_at=now, analyzed_until=now, goodput_score=0.95, allocated_gpu_hours=4 * hours,
            wasted_gpu_hours=0.4,  # (its ledger below: 0.4 of 8 GPU-h, so the score is 0.95)
            report=_report(4, hours, 0.92, 0.55, {"straggler": 0.4}, s.gpu_uuids["node-a"], "node-a")))
        c.execute(insert(JobReport).values(
            job_pk=idle, computed_at=now, analyzed_until=now, goodput_score=0.05, allocated_gpu_hours=2 * hours,
            wasted_gpu_hours=1.9 * hours, report=_report(2, hours, 0.01, 0.0, {"idle_gpu": 1.9 * hours},
                                                         s.gpu_uuids["node-b"][:2], "node-b")))
        c.execute(insert(Flag).values(
            job_pk=idle, kind="idle_gpu", scope="", severity="critical", start_ts=start, end_ts=now,
            wasted_gpu_hours=1.9 * hours, evidence={"sm_active_mean": 0.01, "idle_fraction": 0.97, "gpus": 2},
            suggestion="Both GPUs sat idle: release the allocation or run the work on them.", open=True,
            opened_at=start + 600))
        c.execute(insert(Flag).values(
            job_pk=idle, kind="no_tensor_cores", scope="", severity="warning", start_ts=start, end_ts=now,
            wasted_gpu_hours=0.0, evidence={"tensor_active_mean": 0.0}, suggestion="Use bf16 autocast.",
            open=False, opened_at=start, resolved_at=now - 60))
        c.execute(insert(Flag).values(
            job_pk=xss, kind="throttled", scope="GPU-0103aaaa", severity="warning", start_ts=start + 600, end_ts=now,
            wasted_gpu_hours=0.2, evidence={"note": XSS_NAME, "throttled_fraction": 0.33},
            suggestion=f"Check cooling {XSS_USER}", open=True, opened_at=start + 900))
        # Their ledgers (what the fleet summary's waste sums), as the analysis would store them:
        # the reports' and flags' waste spread over the jobs' minutes, the rest productive.
        for jpk, n, t0, t1, waste in ((good, 4, start, None, {"straggler": 0.4}),
                                      (idle, 2, start, None, {"idle_gpu": 1.9 * hours}),
                                      (ended, 1, start, start + 1800, {}),
                                      (xss, 1, start + 600, None, {"throttled": 0.2})):
            mins = [int((start + m * 60) // 60) for m in range(minutes)
                    if t0 <= start + m * 60 and (t1 is None or start + m * 60 < t1)]
            per = {k: v * 3600 / len(mins) for k, v in waste.items()}
            c.execute(insert(GpuLedgerMinute), [
                {"job_pk": jpk, "minute": m, "category": k, "gpu_s": v}
                for m in mins for k, v in {**per, "productive": n * 60.0 - sum(per.values())}.items()])
    return s


def _report(n: int, hours: float, sm: float, tensor: float, waste: dict[str, float],
            uuids: list[str], node: str) -> dict[str, Any]:
    return {
        "window": {"start": 0, "end": 0}, "n_gpus": n, "gpu_model": "NVIDIA H100 80GB HBM3",
        "allocated_gpu_hours": n * hours, "active_gpu_hours": n * hours * sm, "goodput_score": sm,
        "stats": {k: {"mean": v, "p50": v, "p95": v} for k, v in
                  (("sm_active", sm), ("sm_occupancy", sm * 0.6), ("tensor_active", tensor), ("dram_active", 0.3))},
        "mfu": {"estimate": tensor * 0.8, "achieved_tflops": 989 * tensor * 0.8, "peak_tflops": 989, "basis": "tensor"},
        "wasted_gpu_hours": waste, "wasted_gpu_hours_total": sum(waste.values()),
        "per_gpu": [{"gpu_uuid": u, "node": node, "index": i, "sm_active_mean": sm, "tensor_active_mean": tensor,
                     "dram_active_mean": 0.3, "power_w_mean": 500.0, "sm_clock_mhz_mean": 1900.0,
                     "fb_used_bytes_max": 30.0 * GIB} for i, u in enumerate(uuids)],
    }


def seed_big_job(engine: Engine, *, n_gpus: int = 64, hours: float = 24.0, job_id: str = "big",
                 now: float | None = None) -> int:
    """One job on ``n_gpus`` GPUs (8 per node) with ``hours`` of 1-minute rollups: the job
    page's render budget case. Returns the number of per-GPU rollup rows written."""
    now = now or time.time()
    minutes = int(hours * 60)
    end_min = math.floor(now / 60) * 60
    start = end_min - (minutes - 1) * 60
    ensure_partitions(engine, {day_of(start + d * 86400) for d in range(int(hours / 24) + 2)} | {day_of(now)})
    with engine.begin() as c:
        cid = c.execute(select(Cluster.id).where(Cluster.name == "default")).scalar_one()
        jpk = c.execute(insert(Job).values(cluster_id=cid, job_id=job_id, user="erin", name="moe-pretrain-64",
                                           state="running", start_ts=start, last_sample_ts=now, num_nodes=n_gpus // 8,
                                           labels={}).returning(Job.id)).scalar_one()
        pks: list[int] = []
        for ni in range(math.ceil(n_gpus / 8)):
            nid = c.execute(insert(Node).values(cluster_id=cid, name=f"big-{ni:03d}", last_seen=now, labels={})
                            .returning(Node.id)).scalar_one()
            for i in range(min(8, n_gpus - ni * 8)):
                pk = c.execute(insert(Gpu).values(node_id=nid, uuid=f"GPU-big-{ni:03d}-{i}", index=i,
                                                  model="NVIDIA H100 80GB HBM3", last_seen=now)
                               .returning(Gpu.id)).scalar_one()
                c.execute(insert(Allocation).values(job_pk=jpk, gpu_pk=pk, start_ts=start, end_ts=None))
                pks.append(pk)
        rows: list[dict[str, Any]] = []
        jrows: list[dict[str, Any]] = []
        for m in range(minutes):
            ts = start + m * 60
            phase = 0.75 + 0.15 * math.sin(m / 45)
            batch = [_row(ts, pk, jpk, max(0.0, min(1.0, phase - 0.004 * k)), 0.45 * phase, 0.35, 550.0, 1900.0)
                     for k, pk in enumerate(pks)]
            rows.extend(batch)
            jrows.append({**batch[0], "gpu_pk": None, "bucket": ts, "last_ts": ts + 59, "job_pk": jpk,
                          "n": 60 * len(batch)})
        for i in range(0, len(rows), 20000):
            c.execute(insert(gpu_samples_1m), rows[i:i + 20000])
        c.execute(insert(job_samples_1m), [{k: v for k, v in r.items() if k != "gpu_pk"} for r in jrows])
    return len(rows)

"""Rows the goodput engine would write (its output contract), inserted directly."""

from __future__ import annotations

from typing import Any


def add_job(engine: Any, job_id: str, *, user: str = "alice", name: str = "train", account: str = "nlp",
            n_gpus: int = 4, node: str = "node-a", start: float, state: str = "running",
            cluster: str = "default") -> int:
    from sqlalchemy import insert, select

    from gpufleet.storage.models import Allocation, Cluster, Gpu, Job, Node

    with engine.begin() as c:
        cid = c.execute(select(Cluster.id).where(Cluster.name == cluster)).scalar()
        if cid is None:
            cid = c.execute(insert(Cluster).values(name=cluster)).inserted_primary_key[0]
        nid = c.execute(select(Node.id).where(Node.name == node, Node.cluster_id == cid)).scalar()
        if nid is None:
            nid = c.execute(insert(Node).values(cluster_id=cid, name=node)).inserted_primary_key[0]
        pk = c.execute(insert(Job).values(cluster_id=cid, job_id=job_id, source="slurm", user=user, name=name,
                                          account=account, partition="gpu", state=state, start_ts=start)
                       ).inserted_primary_key[0]
        for i in range(n_gpus):
            gid = c.execute(insert(Gpu).values(node_id=nid, uuid=f"GPU-{job_id}-{node}-{i}", index=i,
                                               model="H100 80GB HBM3")).inserted_primary_key[0]
            c.execute(insert(Allocation).values(job_pk=pk, gpu_pk=gid, start_ts=start))
    return int(pk)


def add_flag(engine: Any, job_pk: int, kind: str, *, severity: str = "warning", wasted: float = 5.0,
             scope: str = "", now: float, evidence: dict[str, Any] | None = None, suggestion: str = "fix it") -> None:
    from sqlalchemy import insert

    from gpufleet.storage.models import Flag

    with engine.begin() as c:
        c.execute(insert(Flag).values(job_pk=job_pk, kind=kind, scope=scope, severity=severity, start_ts=now - 3600,
                                      end_ts=now, wasted_gpu_hours=wasted, evidence=evidence or {"sm_active": 0.05},
                                      suggestion=suggestion, open=True, opened_at=now))


def close_flags(engine: Any, job_pk: int, now: float) -> None:
    from sqlalchemy import update

    from gpufleet.storage.models import Flag

    with engine.begin() as c:
        c.execute(update(Flag).where(Flag.job_pk == job_pk).values(open=False, resolved_at=now))


def add_report(engine: Any, job_pk: int, *, now: float, score: float = 0.3, allocated: float = 20.0,
               wasted: float = 10.0) -> None:
    from sqlalchemy import insert

    from gpufleet.storage.models import JobReport

    with engine.begin() as c:
        c.execute(insert(JobReport).values(job_pk=job_pk, computed_at=now, analyzed_until=now, goodput_score=score,
                                           allocated_gpu_hours=allocated, wasted_gpu_hours=wasted,
                                           report={"goodput_score": score, "wasted_gpu_hours_total": wasted}))

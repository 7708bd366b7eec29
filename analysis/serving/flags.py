"""Serving findings into ``flags`` (the thin database side of ``detect_serving``), so that the flags
page and the alert rules read them like every other kind (docs/serving.md).

``flags`` rows belong to a job: a finding goes on the job of each replica it names (a deployment-wide
finding on every replica's job), under the scope ``serving:<deployment>`` (a replica's finding:
``serving:<deployment>:<replica>``). Each pass judges the last ``window_s`` of stored minutes; a flag
whose finding is gone is resolved, its row kept. Their ``wasted_gpu_hours`` is 0: the serving
ledger is not stored per job yet, and a flag never claims waste the ledger does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine

from gpufleet.flagkinds import FLAG_KINDS
from gpufleet.serving_expo import measures_from_json
from gpufleet.storage.models import Cluster, Flag, Job
from gpufleet.storage.serving import StoredMinute, deployment_labels, deployment_names, read_minutes

from .detectors import DeploymentView, ServingFinding, detect_serving
from .measures import ServingMinute
from .slo import DEFAULT, Slo, SloError, slo_from_labels

SCOPE = "serving"
WINDOW_S = 3600


@dataclass
class ServingPass:
    deployments: int = 0
    opened: int = 0
    resolved: int = 0
    errors: list[str] = field(default_factory=list)


def is_serving_scope(scope: str) -> bool:
    return scope == SCOPE or scope.startswith(SCOPE + ":")


def serving_minutes(rows: list[StoredMinute]) -> list[ServingMinute]:
    """Stored rows as the analysis's minutes (stored rows were checked on intake)."""
    return [ServingMinute(r.deployment, r.replica, r.minute, r.gpus, r.engine, measures_from_json(r.measures)[0])
            for r in rows]


def slo_of(labels: dict[str, Any] | None) -> tuple[Slo, str | None]:
    """The deployment's SLO from its stored labels; the default, and why, when they are bad."""
    try:
        return slo_from_labels({str(k): str(v) for k, v in (labels or {}).items()}), None
    except SloError as e:
        return DEFAULT, f"SLO labels ignored ({e}); the default {DEFAULT.source} applies"


def _scope(f: ServingFinding) -> str:
    s = f"{SCOPE}:{f.deployment}" if f.scope == "deployment" else f"{SCOPE}:{f.deployment}:{f.target}"
    return s[:255]


def _findings(conn: Connection, start: int, end: int) -> tuple[dict[tuple[int, str, str], ServingFinding], int]:
    """(job_pk, kind, scope) -> finding, over every deployment with minutes in [start, end)."""
    pairs = deployment_names(conn, start, end)
    labels = deployment_labels(conn, pairs)
    cids = {n: i for i, n in conn.execute(select(Cluster.id, Cluster.name))}
    out: dict[tuple[int, str, str], ServingFinding] = {}
    for c, name in pairs:
        rows = read_minutes(conn, start, end, c, name)
        job_of = {r.replica: r.job_id for r in rows if r.job_id}  # the latest wins (rows are in time order)
        wanted = {j for j in job_of.values()}
        pks = {j: pk for pk, j in conn.execute(select(Job.id, Job.job_id).where(
            Job.cluster_id == cids.get(c, -1), Job.job_id.in_(wanted)))} if wanted and c in cids else {}
        for f in detect_serving(DeploymentView(name, slo_of(labels.get((c, name)))[0], serving_minutes(rows))):
            if f.kind not in FLAG_KINDS:  # a newer detector than the registry: stays on the API only
                continue
            reps = [f.target] if f.scope == "replica" else sorted(job_of)
            for rep in reps:
                pk = pks.get(job_of.get(rep, ""))
                if pk is not None:
                    out.setdefault((pk, f.kind, _scope(f)), f)
    return out, len(pairs)


def run_serving_pass(engine: Engine, now: float, window_s: int = WINDOW_S) -> ServingPass:
    """Open, update and resolve the serving flags from the last ``window_s`` of minutes."""
    p = ServingPass()
    end = int(now // 60 * 60)
    start = end - window_s
    t = Flag.__table__
    with engine.begin() as conn:
        found, p.deployments = _findings(conn, start, end)
        existing = {(r["job_pk"], r["kind"], r["scope"]): r for r in conn.execute(
            select(t).where(t.c.scope.like(f"{SCOPE}:%"))).mappings()}
        for key, f in found.items():
            values = {"severity": f.severity, "start_ts": float(start), "end_ts": float(end), "evidence": f.evidence,
                      "suggestion": f.suggestion, "open": True, "wasted_gpu_hours": 0.0}
            old = existing.get(key)
            if old is None:
                conn.execute(t.insert().values(job_pk=key[0], kind=key[1], scope=key[2], opened_at=now,
                                               resolved_at=None, **values))
                p.opened += 1
                continue
            if old["open"]:
                values["start_ts"] = min(float(old["start_ts"]), float(start))  # the episode keeps its start
            else:
                values.update(opened_at=now, resolved_at=None)  # reopened: a new episode
                p.opened += 1
            conn.execute(t.update().where(t.c.id == old["id"]).values(**values))
        for key, old in existing.items():
            if key not in found and old["open"]:
                conn.execute(t.update().where(t.c.id == old["id"]).values(open=False, resolved_at=now))
                p.resolved += 1
    return p


__all__ = ["SCOPE", "ServingPass", "is_serving_scope", "run_serving_pass", "serving_minutes", "slo_of"]

"""Serving findings into ``flags`` (the thin database side of ``detect_serving``), so that the flags
page and the alert rules read them like every other kind (docs/serving.md).

``flags`` rows belong to a job: a finding goes on the job of each replica it names (a deployment-wide
finding on every replica's job), under the scope ``serving:<deployment>`` (a replica's finding:
``serving:<deployment>:<replica>``). Each pass judges the last ``window_s`` of stored minutes; a flag
whose finding is gone is resolved, its row kept. Their ``wasted_gpu_hours`` is their share of the
job's stored ledger (analysis/flag_shares.py ``serving_flag_shares``), stored after every flag change
here and after every ledger change by the runner.

The runner's side: ``job_serving_cells`` reads a replica job's minutes for its ledger fold, and
``serving_jobs`` the jobs whose minutes are recent (due every pass, as progress-only jobs are).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from gpufleet.flagkinds import FLAG_KINDS
from gpufleet.serving_expo import measures_from_json
from gpufleet.storage.gpu_ledger import read_job_ledger
from gpufleet.storage.models import Cluster, Flag, Job
from gpufleet.storage.serving import StoredMinute, deployment_labels, deployment_names, read_minutes, replica_activity
from gpufleet.storage.serving_models import ServingMinuteRow

from ..flag_shares import SERVING_SCOPE as SCOPE
from ..flag_shares import is_serving_scope, serving_flag_shares
from ..ledger import ServingCell
from .detectors import DeploymentView, ServingFinding, detect_serving
from .detectors.overprovisioned_deployment import KIND as OVERPROVISIONED
from .ledger import Surplus, serving_cells
from .measures import ServingMinute
from .slo import DEFAULT, Slo, SloError, slo_from_labels

WINDOW_S = 3600


@dataclass
class ServingPass:
    deployments: int = 0
    opened: int = 0
    resolved: int = 0
    errors: list[str] = field(default_factory=list)


def serving_minutes(rows: list[StoredMinute], conn: Connection | None = None) -> list[ServingMinute]:
    """Stored rows as the analysis's minutes (stored rows were checked on intake). With ``conn``,
    each minute carries its replica's GPU activity that minute (mean SM activity and NVML
    utilisation over the replica's GPUs, else over its job's) from the folded minute features:
    the hardware side that over-provisioning sizing, the host-bound cause and engine_hw_disagree
    read. A replica whose GPUs sent no samples that minute keeps None (unknown, not idle)."""
    hw: dict[tuple[str, str, int], dict[str, tuple[float | None, float | None]]] = {}
    if conn is not None and rows:
        by_cluster: dict[str, set[str]] = {}
        for r in rows:
            if r.job_id:
                by_cluster.setdefault(r.cluster, set()).add(r.job_id)
        start, end = min(r.minute for r in rows), max(r.minute for r in rows) + 60
        for c, jobs in by_cluster.items():
            hw.update(((c, j, m), v) for (j, m), v in replica_activity(conn, c, jobs, start, end).items())
    out = []
    for r in rows:
        per_gpu = hw.get((r.cluster, r.job_id, r.minute), {}) if r.job_id else {}
        if r.gpu_uuids:  # the replica's own GPUs; the job's only when the minute does not name them
            per_gpu = {u: v for u, v in per_gpu.items() if u in r.gpu_uuids}
        out.append(ServingMinute(r.deployment, r.replica, r.minute, r.gpus, r.engine, measures_from_json(r.measures)[0],
                                 sm_active=_mean(v[0] for v in per_gpu.values()),
                                 gpu_util=_mean(v[1] for v in per_gpu.values())))
    return out


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


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
        for f in detect_serving(DeploymentView(name, slo_of(labels.get((c, name)))[0], serving_minutes(rows, conn))):
            if f.kind not in FLAG_KINDS:  # a newer detector than the registry: stays on the API only
                continue
            reps = [f.target] if f.scope == "replica" else sorted(job_of)
            for rep in reps:
                pk = pks.get(job_of.get(rep, ""))
                if pk is not None:
                    out.setdefault((pk, f.kind, _scope(f)), f)
    return out, len(pairs)


def _job_pks(conn: Connection | Session, pairs: list[tuple[str, str]]) -> list[int]:
    """(cluster name, job id) -> the jobs' pks (those that exist)."""
    by_cluster: dict[str, set[str]] = {}
    for c, j in pairs:
        by_cluster.setdefault(c, set()).add(j)
    cids = {n: i for i, n in conn.execute(select(Cluster.id, Cluster.name).where(Cluster.name.in_(sorted(by_cluster))))}
    out: set[int] = set()
    for c, ids in by_cluster.items():
        if c in cids:
            out.update(conn.execute(select(Job.id).where(Job.cluster_id == cids[c], Job.job_id.in_(sorted(ids))))
                       .scalars())
    return sorted(out)


def serving_jobs(conn: Connection | Session, since: float, until: float | None = None,
                 cluster: str | None = None) -> list[int]:
    """Jobs with a replica-minute in [since, until): the serving replicas' jobs. The runner refolds
    the ledger of those with minutes in the last ``WINDOW_S`` every pass, so a minute arriving
    after the job's GPU samples (a replica's last minutes, a late remote write) still reaches it;
    the fleet summary splits its waste by them (training / serving)."""
    t = ServingMinuteRow.__table__
    q = select(t.c.cluster, t.c.job_id).where(t.c.minute >= int(since), t.c.job_id.is_not(None))
    if until is not None:
        q = q.where(t.c.minute < until)
    if cluster is not None:
        q = q.where(t.c.cluster == cluster)
    pairs = [(str(c), str(j)) for c, j in conn.execute(q.group_by(t.c.cluster, t.c.job_id))]
    return _job_pks(conn, pairs) if pairs else []


def job_serving_cells(conn: Connection, job_pk: int, start: float, end: float) -> list[ServingCell]:
    """The job's replica-minutes in [start, end) as ledger cells (``serving.ledger.serving_cells``):
    each deployment's SLO from its labels, and the over-provisioning episodes of the job's
    ``overprovisioned_deployment`` flags."""
    j, c = Job.__table__, Cluster.__table__
    row = conn.execute(select(j.c.job_id, c.c.name).select_from(j.join(c, c.c.id == j.c.cluster_id))
                       .where(j.c.id == job_pk)).first()
    if row is None:
        return []
    t = ServingMinuteRow.__table__
    q = (select(t.c.cluster, t.c.deployment, t.c.replica, t.c.minute, t.c.engine, t.c.node, t.c.job_id, t.c.gpus,
                t.c.gpu_uuids, t.c.measures)
         .where(t.c.minute >= int(start // 60 * 60), t.c.minute < end, t.c.cluster == row[1], t.c.job_id == row[0])
         .order_by(t.c.deployment, t.c.replica, t.c.minute))
    stored = [StoredMinute(a, d, r, int(m), e, n, jid, int(g), u, ms)
              for a, d, r, m, e, n, jid, g, u, ms in conn.execute(q)]
    if not stored:
        return []
    deps = sorted({m.deployment for m in stored})
    labels = deployment_labels(conn, [(row[1], d) for d in deps])
    slo = {d: slo_of(labels.get((row[1], d)))[0] for d in deps}
    f = Flag.__table__
    surplus = [s for kind_scope, t0, t1, ev in conn.execute(
        select(f.c.scope, f.c.start_ts, f.c.end_ts, f.c.evidence).where(
            f.c.job_pk == job_pk, f.c.kind == OVERPROVISIONED, f.c.scope.like(f"{SCOPE}:%")))
        if (s := Surplus.of(str(kind_scope)[len(SCOPE) + 1:], t0, t1, ev if isinstance(ev, dict) else {}))]
    return serving_cells(list(zip(serving_minutes(stored), (m.gpu_uuids for m in stored), strict=True)), slo, surplus)


def store_serving_shares(conn: Connection, job_pk: int) -> int:
    """Store each serving flag's share of the job's stored ledger (``serving_flag_shares``) where
    it changed; returns the flags updated."""
    f = Flag.__table__
    flags = conn.execute(select(f.c.id, f.c.kind, f.c.scope, f.c.start_ts, f.c.end_ts, f.c.wasted_gpu_hours)
                         .where(f.c.job_pk == job_pk, f.c.scope.like(f"{SCOPE}:%"))).all()
    if not flags:
        return 0
    shares = serving_flag_shares(read_job_ledger(conn, job_pk),
                                 ((k, s, float(a or 0.0), float(b or 0.0)) for _, k, s, a, b, _ in flags))
    n = 0
    for fid, kind, scope, _, _, old in flags:
        new = shares.get((kind, scope), 0.0)
        if abs(float(old or 0.0) - new) > 5e-5:
            conn.execute(f.update().where(f.c.id == fid).values(wasted_gpu_hours=new))
            n += 1
    return n


def run_serving_pass(engine: Engine, now: float, window_s: int = WINDOW_S) -> ServingPass:
    """Open, update and resolve the serving flags from the last ``window_s`` of minutes."""
    p = ServingPass()
    end = int(now // 60 * 60)
    start = end - window_s
    t = Flag.__table__
    touched: set[int] = set()
    with engine.begin() as conn:
        found, p.deployments = _findings(conn, start, end)
        existing = {(r["job_pk"], r["kind"], r["scope"]): r for r in conn.execute(
            select(t).where(t.c.scope.like(f"{SCOPE}:%"))).mappings()}
        for key, f in found.items():
            values = {"severity": f.severity, "start_ts": float(start), "end_ts": float(end), "evidence": f.evidence,
                      "suggestion": f.suggestion, "open": True}
            old = existing.get(key)
            touched.add(key[0])
            if old is None:
                conn.execute(t.insert().values(job_pk=key[0], kind=key[1], scope=key[2], opened_at=now,
                                               resolved_at=None, wasted_gpu_hours=0.0, **values))
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
                touched.add(key[0])
        for pk in sorted(touched):  # each flag's share of its job's ledger (its episode may have moved)
            store_serving_shares(conn, pk)
    return p


__all__ = ["SCOPE", "ServingPass", "is_serving_scope", "job_serving_cells", "run_serving_pass", "serving_jobs",
           "serving_minutes", "slo_of", "store_serving_shares"]

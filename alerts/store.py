"""Database side of the lifecycle: read facts and alert state, write one job's decision
(alert rows, group counter, outbox row) in one transaction."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from gpufleet.alerts import outbox
from gpufleet.alerts.config import AlertConfig
from gpufleet.alerts.decide import JobDecision, summarize
from gpufleet.alerts.facts import AlertState, FlagFact, GroupState, JobFacts, SilenceFact
from gpufleet.alerts.render import render_job
from gpufleet.storage.alert_models import Alert, AlertGroup, AlertSilence
from gpufleet.storage.models import Allocation, Cluster, Flag, Gpu, Job, JobReport, Node

log = logging.getLogger(__name__)
A, G, S = Alert.__table__, AlertGroup.__table__, AlertSilence.__table__
F, J, R = Flag.__table__, Job.__table__, JobReport.__table__


def _flag(f: Any) -> FlagFact:
    return FlagFact(kind=f.kind, scope=f.scope or "", severity=f.severity, wasted_gpu_hours=f.wasted_gpu_hours or 0.0,
                    evidence=f.evidence if isinstance(f.evidence, dict) else {}, suggestion=f.suggestion or "",
                    start_ts=f.start_ts, end_ts=f.end_ts, open=bool(f.open))


def candidate_job_pks(engine: Engine) -> list[int]:
    """Jobs with an open flag, or with an alert still pending/firing (which may resolve)."""
    with engine.connect() as c:
        a = set(c.execute(select(Flag.job_pk).where(Flag.open.is_(True)).distinct()).scalars())
        b = set(c.execute(select(Alert.job_pk).where(Alert.state.in_(("firing", "pending"))).distinct()).scalars())
    return sorted(a | b)


def load_jobs(engine: Engine, job_pks: list[int]) -> dict[int, JobFacts]:
    out: dict[int, JobFacts] = {}
    with engine.connect() as c:
        for i in range(0, len(job_pks), 500):
            chunk = job_pks[i:i + 500]
            jobs = c.execute(select(J, Cluster.name.label("cluster_name")).join(Cluster, Cluster.id == J.c.cluster_id)
                             .where(J.c.id.in_(chunk))).all()
            flags: dict[int, list[FlagFact]] = {}
            for f in c.execute(select(F).where(F.c.job_pk.in_(chunk), F.c.open.is_(True))):
                flags.setdefault(f.job_pk, []).append(_flag(f))
            reports = {r.job_pk: r for r in c.execute(select(R).where(R.c.job_pk.in_(chunk)))}
            gpus: dict[int, list[tuple[str, str, int]]] = {}
            for jp, node, model, gid in c.execute(
                    select(Allocation.job_pk, Node.name, Gpu.model, Gpu.id).join(Gpu, Gpu.id == Allocation.gpu_pk)
                    .join(Node, Node.id == Gpu.node_id).where(Allocation.job_pk.in_(chunk))):
                gpus.setdefault(jp, []).append((node, model or "", gid))
            for job in jobs:
                cluster = job.cluster_name
                rep = reports.get(job.id)
                doc = rep.report if rep is not None and isinstance(rep.report, dict) else {}
                g = gpus.get(job.id, [])
                n_gpus = int(doc.get("n_gpus") or len({x[2] for x in g}))
                out[job.id] = JobFacts(
                    job_pk=job.id, cluster=cluster, job_id=job.job_id, user=job.user, name=job.name,
                    account=job.account, partition=job.partition, state=job.state, start_ts=job.start_ts,
                    end_ts=job.end_ts, n_gpus=n_gpus, nodes=tuple(sorted({x[0] for x in g})),
                    gpu_models=tuple(sorted({x[1] for x in g if x[1]})),
                    goodput_score=rep.goodput_score if rep is not None else doc.get("goodput_score"),
                    allocated_gpu_hours=float(rep.allocated_gpu_hours if rep is not None else 0.0),
                    wasted_gpu_hours_total=float(doc.get("wasted_gpu_hours_total",
                                                         rep.wasted_gpu_hours if rep is not None else
                                                         sum(f.wasted_gpu_hours for f in flags.get(job.id, [])))),
                    flags=tuple(flags.get(job.id, [])),
                    ledger=doc.get("ledger") if isinstance(doc.get("ledger"), dict) else None,
                )
    return out


def load_faulty_node_inputs(engine: Engine) -> tuple[list[tuple[FlagFact, list[str]]], dict[str, str]]:
    """Open hw_fault flags with their job's nodes, and a GPU name -> node map for GPU scopes."""
    with engine.connect() as c:
        rows = c.execute(select(F).where(F.c.open.is_(True), F.c.kind == "hw_fault")).all()
        nodes: dict[int, list[str]] = {}
        if rows:
            for jp, n in c.execute(select(Allocation.job_pk, Node.name).join(Gpu, Gpu.id == Allocation.gpu_pk)
                                   .join(Node, Node.id == Gpu.node_id)
                                   .where(Allocation.job_pk.in_({r.job_pk for r in rows})).distinct()):
                nodes.setdefault(jp, []).append(n)
        scopes = {r.scope for r in rows if r.scope}
        g2n: dict[str, str] = {}
        if scopes:
            for uuid, idx, node in c.execute(select(Gpu.uuid, Gpu.index, Node.name).join(Node, Node.id == Gpu.node_id)):
                for name in (uuid, f"{node}/{idx}", f"{node}/gpu{idx}", f"{node}:{idx}"):
                    if name in scopes:
                        g2n[name] = node
    return [(_flag(r), nodes.get(r.job_pk, [])) for r in rows], g2n


def load_states(engine: Engine, job_pks: list[int]) -> tuple[dict[int, dict[str, AlertState]], dict[int, GroupState]]:
    alerts: dict[int, dict[str, AlertState]] = {}
    groups: dict[int, GroupState] = {}
    with engine.connect() as c:
        for i in range(0, len(job_pks), 500):
            chunk = job_pks[i:i + 500]
            # Groups before alerts: each SELECT may see a newer commit than the previous one
            # (SQLite outside a transaction, PostgreSQL READ COMMITTED). Read in this order,
            # the alert rows are never older than the group's message counter, so a racing
            # evaluator cannot see "not firing yet" beside an already-bumped counter and send
            # the same "firing" message again under the next sequence number.
            for g in c.execute(select(G).where(G.c.job_pk.in_(chunk))):
                groups[g.job_pk] = GroupState(g.state, g.notify_seq, g.last_notified_at)
            for a in c.execute(select(A).where(A.c.job_pk.in_(chunk))):
                alerts.setdefault(a.job_pk, {})[a.kind] = AlertState(a.kind, a.state, a.suppressed_by, a.fired_at,
                                                                     a.last_notified_at)
    return alerts, groups


def active_silences(engine: Engine, now: float) -> list[SilenceFact]:
    with engine.connect() as c:
        return [SilenceFact(s.id, s.expires_at, s.job, s.user, s.kind, s.cluster)
                for s in c.execute(select(S).where(S.c.expires_at > now))]


def apply_decision(engine: Engine, job: JobFacts, d: JobDecision, group: GroupState | None, config: AlertConfig,
                   now: float) -> int | None:
    """Write one job's decision atomically. Returns the new outbox id, if any. A concurrent
    evaluator that already wrote the same message makes this one roll back (returns None)."""
    if not d.changes and d.notification is None and (d.group_state is None or
                                                     (group is not None and group.state == d.group_state)):
        return None
    n = d.notification
    summaries = summarize(job.flags)
    try:
        with engine.begin() as c:
            oid = None
            if n is not None:
                if group is None:
                    c.execute(insert(G).values(job_pk=job.job_pk, state=d.group_state or "firing", notify_seq=n.seq,
                                               first_fired_at=now, last_notified_at=now))
                else:
                    won = c.execute(update(G).where(G.c.job_pk == job.job_pk, G.c.notify_seq == group.notify_seq)
                                    .values(notify_seq=n.seq, last_notified_at=now,
                                            state=d.group_state or group.state,
                                            resolved_at=now if d.group_state == "resolved" else None)).rowcount
                    if won != 1:
                        raise _Lost()
                payload = render_job(config, job, n, now)
                oid = outbox.enqueue(c, key=n.key, event=n.event, webhook=n.webhook, payload=payload, now=now,
                                     job_pk=job.job_pk)
            elif group is not None and d.group_state and d.group_state != group.state:
                c.execute(update(G).where(G.c.job_pk == job.job_pk).values(
                    state=d.group_state, resolved_at=now if d.group_state == "resolved" else None))
            notified = set(n.firing) if n is not None and n.event != "resolved" else set()
            existing = {r.kind: r for r in c.execute(select(A).where(A.c.job_pk == job.job_pk))}
            for ch in d.changes:
                s = summaries.get(ch.kind)
                vals: dict[str, Any] = {"state": ch.state, "suppressed_by": ch.suppressed_by}
                if ch.state != "resolved":
                    vals.update(severity=ch.severity, scopes=list(ch.scopes), wasted_gpu_hours=ch.wasted_gpu_hours,
                                resolved_at=None)
                else:
                    vals["resolved_at"] = now
                if ch.newly_fired:
                    vals["fired_at"] = now
                if ch.kind in notified:
                    vals["last_notified_at"] = now
                if ch.kind in existing:
                    c.execute(update(A).where(A.c.id == existing[ch.kind].id).values(**vals))
                else:
                    vals.setdefault("severity", s.severity if s else "info")
                    vals.setdefault("wasted_gpu_hours", 0.0)
                    c.execute(insert(A).values(job_pk=job.job_pk, kind=ch.kind, first_seen_at=now, **vals))
            return oid
    except (_Lost, IntegrityError):
        log.info("job %s: another evaluator notified first; skipping", job.job_pk)
        return None


class _Lost(Exception):
    """The optimistic update of the job's message counter lost a race."""


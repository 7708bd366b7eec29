"""Daily digest: top wasters per team (Slurm account / K8s namespace), one message per webhook.

``group_digest`` is pure; ``enqueue_digest`` reads job reports and writes one outbox row per
webhook per UTC day (the key carries the day, so a day's digest is sent once)."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine, or_, select
from sqlalchemy.exc import IntegrityError

from gpufleet.alerts import outbox
from gpufleet.alerts.config import AlertConfig
from gpufleet.alerts.decide import route_for
from gpufleet.alerts.facts import JobFacts
from gpufleet.alerts.render import render_digest
from gpufleet.storage.alert_models import AlertOutbox
from gpufleet.storage.models import Cluster, Job, JobReport

log = logging.getLogger(__name__)


def group_digest(rows: Iterable[tuple[JobFacts, float]], config: AlertConfig
                 ) -> dict[str, list[tuple[str, float, list[dict[str, Any]]]]]:
    """(job, wasted GPU-h) -> {webhook: [(team, team waste, top jobs)] worst team first}."""
    per_hook: dict[str, dict[str, list[tuple[JobFacts, float]]]] = {}
    for job, wasted in rows:
        if wasted < config.digest.min_wasted_gpu_hours:
            continue
        hook = route_for(job, config)
        if not hook:
            continue
        team = job.account or job.user or "-"
        per_hook.setdefault(hook, {}).setdefault(team, []).append((job, wasted))
    out: dict[str, list[tuple[str, float, list[dict[str, Any]]]]] = {}
    for hook, teams in per_hook.items():
        lst = []
        for team, jobs in teams.items():
            jobs.sort(key=lambda x: -x[1])
            top = [{"job_id": j.job_id, "user": j.user, "name": j.name, "wasted": w, "score": j.goodput_score}
                   for j, w in jobs[: config.digest.top_n]]
            lst.append((team, sum(w for _, w in jobs), top))
        lst.sort(key=lambda t: -t[1])
        out[hook] = lst
    return out


def digest_due(config: AlertConfig, now: float) -> str | None:
    """The UTC day whose digest is due now, or None."""
    if not config.digest.enabled:
        return None
    t = dt.datetime.fromtimestamp(now, dt.UTC)
    return t.strftime("%Y-%m-%d") if t.hour >= config.digest.hour_utc else None


def digest_key(day: str, webhook: str) -> str:
    return f"gpufleet:digest:{day}:{hashlib.sha256(webhook.encode()).hexdigest()[:16]}"


def enqueue_digest(engine: Engine, config: AlertConfig, now: float) -> list[int]:
    day = digest_due(config, now)
    if day is None:
        return []
    since = now - config.digest.window_s
    with engine.connect() as c:
        if c.execute(select(AlertOutbox.id).where(AlertOutbox.idempotency_key.like(f"gpufleet:digest:{day}:%"))
                     .limit(1)).first():
            return []  # today's digest is already in the outbox
        q = (select(Job.id, Job.job_id, Job.user, Job.name, Job.account, Job.partition, Cluster.name.label("cl"),
                    JobReport.goodput_score, JobReport.wasted_gpu_hours)
             .join(Cluster, Cluster.id == Job.cluster_id).join(JobReport, JobReport.job_pk == Job.id)
             .where(or_(Job.end_ts.is_(None), Job.end_ts >= since), JobReport.wasted_gpu_hours > 0))
        rows = [(JobFacts(job_pk=r.id, cluster=r.cl, job_id=r.job_id, user=r.user, name=r.name, account=r.account,
                          partition=r.partition, goodput_score=r.goodput_score), float(r.wasted_gpu_hours))
                for r in c.execute(q)]
    ids: list[int] = []
    try:
        # one transaction for all webhooks: the "already queued today" check above stays exact
        with engine.begin() as c:
            for hook, teams in group_digest(rows, config).items():
                if teams:
                    ids.append(outbox.enqueue(c, key=digest_key(day, hook), event="digest", webhook=hook,
                                              payload=render_digest(config, teams, day), now=now))
    except IntegrityError:
        log.info("digest %s already queued by another evaluator", day)
        return []
    return ids

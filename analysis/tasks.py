"""Celery tasks (thin wrappers around ``runner.run_analysis``).

Beat sends ``analyze_due_jobs`` every ``analysis.interval_s`` (60 s). It only fans out: one
``analyze_shard(shard, n_shards)`` and one ``analyze_progress_shard(shard, n_shards)`` per shard
(``analysis.shards``, 8), so N workers share a pass. A shard task reads the due jobs (the
progress shard: the jobs with recent progress or an open progress flag) and analyzes those whose
stable hash (``analysis.shards.shard_of``) is its shard; ``analyze_job(job_pk)`` analyzes one job
on demand, ``analyze_progress`` runs the whole progress pass in one task (by hand, and messages
sent before the progress pass was sharded).

Each shard holds its own Redis lock (``shard_lock_key``; the progress shard
``progress_lock_key``, so a slow hardware shard never holds back the hang checks), refreshed
after every job: a slow shard
is not doubled by the next tick's message for it (that one returns "skipped"), and a killed
worker stops refreshing, so its shard is redone within ``analysis.lock_ttl_s`` by whichever worker
takes the next tick's message. The lock's value is the Celery task id: when the broker hands the
same message back (acks_late + task_reject_on_worker_lost: the worker process died mid-task)
the redelivered task takes its own lock over at once instead of waiting for it to expire.
Everything is idempotent (the runner writes only what changed; each job is its own transaction),
so redone work writes nothing twice, and jobs not reached stay due for the next run.

Shards are not routed to particular workers (one queue): see docs/goodput.md, "Sharded analysis",
for why. After a task that changed flags or reports the alerts engineer's
``gpufleet.alerts.evaluate_alerts`` is nudged, when that task exists.

Settings come from the Celery app the tasks are bound to (``settings_of``)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import shared_task
from sqlalchemy import Engine

from gpufleet.settings import Settings, settings_of

from .shards import progress_lock_key, shard_lock_key, shard_of

log = logging.getLogger(__name__)

# Take the lock if free, or over if it holds our own token (our message, redelivered).
_ACQUIRE = ("if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end "
            "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 2 end "
            "return 0")
_REFRESH = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"

# Called with each job's pk after it is analyzed and committed, inside the task. An extension
# point (progress metrics, and the tests' crash injection: tests/support/crash_worker.py).
job_done_hooks: list[Callable[[int], None]] = []
# The same after each job a progress shard synced (its progress flags committed).
progress_done_hooks: list[Callable[[int], None]] = []


def _settings() -> Settings:
    return settings_of(analyze_due_jobs.app)


def _engine_for_process(settings: Settings) -> Engine:
    from gpufleet.storage.db import engine_for_process

    return engine_for_process(settings.database_url())


def _thresholds(settings: Settings) -> Any:
    from gpufleet.analysis.config import load_thresholds

    path = settings.analysis.thresholds
    return load_thresholds(str(path) if path else None)


_caches: dict[float, Any] = {}


def _cache(settings: Settings) -> Any:
    """This process's job-feature cache, sized by the settings (one per size, in practice one)."""
    from gpufleet.analysis.state import StateCache

    mb = settings.analysis.cache_mb
    if mb not in _caches:
        _caches[mb] = StateCache(max_bytes=int(mb * 2**20))
    return _caches[mb]


_clients: dict[str, Any] = {}


def _redis(url: str) -> Any:
    """One client (connection pool) per process and URL, not one per task."""
    if url not in _clients:
        import redis

        _clients[url] = redis.Redis.from_url(url)
    return _clients[url]


@dataclass
class Lock:
    """A held Redis lock; ``client`` None when there is nothing to coordinate with (no Redis
    URL: eager mode, tests), where every lock is granted."""

    client: Any
    key: str
    token: str
    ttl_ms: int
    taken_over: bool = False

    def refresh(self) -> None:
        if self.client is not None:
            self.client.eval(_REFRESH, 1, self.key, self.token, self.ttl_ms)

    def release(self) -> None:
        # Delete only our own lock (a run slower than the TTL must not free someone else's).
        if self.client is not None:
            self.client.eval(_RELEASE, 1, self.key, self.token)


def acquire(settings: Settings, key: str, token: str | None) -> Lock | None:
    """The lock ``key`` for ``token`` (the task id), or None while another task holds it.
    A lock already holding ``token`` is ours from an earlier delivery of the same message
    whose worker died: taken over (the broker redelivers a message only once its consumer is
    gone, so that holder is not running any more)."""
    ttl_ms = int(settings.analysis.lock_ttl_s * 1000)
    token = token or uuid.uuid4().hex
    url = settings.celery.redis_url
    if not url:
        return Lock(None, key, token, ttl_ms)
    got = int(_redis(url).eval(_ACQUIRE, 1, key, token, ttl_ms))
    if not got:
        return None
    return Lock(_redis(url), key, token, ttl_ms, taken_over=got == 2)


def _progress(held: Lock, hooks: list[Callable[[int], None]] = job_done_hooks) -> Callable[[int], None]:
    """After each job: keep the lock alive (a killed worker stops refreshing it, so the next
    run starts within the TTL), then the hooks."""

    def done(job_pk: int) -> None:
        held.refresh()
        for hook in hooks:
            hook(job_pk)

    return done


ALERTS_TASK = "gpufleet.alerts.evaluate_alerts"


def _nudge_alerts(changed: bool) -> bool:
    """Send the alerts task by name (analysis sits below alerts and does not import it),
    only when the app knows it and this task changed something."""
    if not changed:
        return False
    app = analyze_due_jobs.app
    if ALERTS_TASK not in app.tasks:
        return False
    app.send_task(ALERTS_TASK)
    return True


def _changed(summary: Any) -> bool:
    return bool(summary.job_pks_changed or summary.flags_opened or summary.flags_resolved)


def _result(summary: Any) -> dict[str, Any]:
    d: dict[str, Any] = summary.as_dict()
    d["job_pks_changed"] = d["job_pks_changed"][:100]
    d["errors"] = d["errors"][:20]
    return d


def _expires(settings: Settings) -> float:
    """A pass's messages expire before the next tick: a backlog (workers down for an hour) is
    not replayed, the next tick catches up anyway (the same rule as beat's own message)."""
    return max(1.0, settings.analysis.interval_s * 0.9)


@shared_task(name="gpufleet.analysis.analyze_due_jobs", ignore_result=True)
def analyze_due_jobs(now: float | None = None) -> dict[str, Any]:
    """One pass: per shard, a message for its due jobs and one for its progress pass; nothing
    analyzed here."""
    settings = _settings()
    n = settings.analysis.shards
    expires = _expires(settings)
    for shard in range(n):
        analyze_shard.apply_async((shard, n, now), expires=expires)
        analyze_progress_shard.apply_async((shard, n, now), expires=expires)
    return {"shards": n}


@shared_task(name="gpufleet.analysis.analyze_progress_due", ignore_result=True)
def analyze_progress_due(now: float | None = None) -> dict[str, Any]:
    """The progress pass alone, one message per shard, at its own cadence
    (``analysis.progress_interval_s``): the short-latency kinds (hung, slow_rank) are judged
    from the windows the collector already stored, without waiting for the hardware pass."""
    settings = _settings()
    n = settings.analysis.shards
    expires = max(1.0, settings.analysis.progress_interval_s * 0.9)
    for shard in range(n):
        analyze_progress_shard.apply_async((shard, n, now), expires=expires)
    return {"shards": n}


def _check_shard(shard: int, n_shards: int) -> tuple[int, int]:
    shard, n_shards = int(shard), int(n_shards)
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} is not in 0..{n_shards - 1}")
    return shard, n_shards


@shared_task(name="gpufleet.analysis.analyze_shard", bind=True, ignore_result=True)
def analyze_shard(self: Any, shard: int, n_shards: int, now: float | None = None) -> dict[str, Any]:
    """The due jobs of one shard (read when the task runs, so a late or redelivered message
    sees what is due now, not what was due when it was sent)."""
    from gpufleet.analysis.runner import due_jobs, run_analysis

    shard, n_shards = _check_shard(shard, n_shards)
    settings = _settings()
    held = acquire(settings, shard_lock_key(shard, n_shards), self.request.id)
    if held is None:
        return {"shard": shard, "n_shards": n_shards, "skipped": "another task holds this shard's lock"}
    try:
        engine = _engine_for_process(settings)
        with engine.connect() as conn:
            mine = [pk for pk in due_jobs(conn) if shard_of(pk, n_shards) == shard]
        summary = run_analysis(engine, now=now, job_pks=mine, thresholds=_thresholds(settings),
                               cache=_cache(settings), on_job_done=_progress(held)) if mine else None
        serving = _serving_pass(engine, now) if shard == 0 else None
    finally:
        held.release()
    out: dict[str, Any] = {"shard": shard, "n_shards": n_shards, "taken_over": held.taken_over}
    if summary is not None:
        out |= _result(summary)
    if serving is not None:
        out["serving_flags_opened"], out["serving_flags_resolved"] = serving
    out["alerts_nudged"] = _nudge_alerts((summary is not None and _changed(summary)) or bool(serving and any(serving)))
    log.info("analysis shard %d/%d: %s", shard, n_shards,
             {k: v for k, v in out.items() if k not in ("job_pks_changed", "shard", "n_shards")})
    return out


def _serving_pass(engine: Engine, now: float | None) -> tuple[int, int]:
    """The serving flags (docs/serving.md) judge every deployment at once, so shard 0 runs them,
    under its lock; (opened, resolved)."""
    import time

    from gpufleet.analysis.serving.flags import run_serving_pass

    sp = run_serving_pass(engine, time.time() if now is None else now)
    return sp.opened, sp.resolved


@shared_task(name="gpufleet.analysis.analyze_progress_shard", bind=True, ignore_result=True)
def analyze_progress_shard(self: Any, shard: int, n_shards: int, now: float | None = None) -> dict[str, Any]:
    """The progress pass (docs/progress.md) over one shard's jobs, under the shard's progress
    lock: the jobs with recent progress or an open progress flag, read when the task runs."""
    shard, n_shards = _check_shard(shard, n_shards)
    out = _progress_pass(self.request.id, shard, n_shards, now)
    log.info("progress shard %d/%d: %s", shard, n_shards, {k: v for k, v in out.items() if k not in ("shard",
                                                                                                   "n_shards")})
    return out


@shared_task(name="gpufleet.analysis.analyze_progress", bind=True, ignore_result=True)
def analyze_progress(self: Any, now: float | None = None) -> dict[str, Any]:
    """The whole progress pass in one task (shard 0 of 1): by hand, or a message sent by a
    fan-out from before the pass was sharded."""
    return _progress_pass(self.request.id, 0, 1, now)


def _progress_pass(task_id: str | None, shard: int, n_shards: int, now: float | None) -> dict[str, Any]:
    import time

    from gpufleet.analysis.progress.flags import progress_jobs, run_progress_pass

    settings = _settings()
    held = acquire(settings, progress_lock_key(shard, n_shards), task_id)
    if held is None:
        return {"shard": shard, "n_shards": n_shards, "skipped": "another task holds this progress shard's lock"}
    at = time.time() if now is None else now
    try:
        engine = _engine_for_process(settings)
        with engine.connect() as conn:
            mine = [pk for pk in progress_jobs(conn, at) if shard_of(pk, n_shards) == shard]
        pp = run_progress_pass(engine, at, job_pks=mine, on_job_done=_progress(held, progress_done_hooks))
    finally:
        held.release()
    changed = bool(pp.opened or pp.resolved or pp.changed)
    return {"shard": shard, "n_shards": n_shards, "taken_over": held.taken_over, "jobs": pp.jobs,
            "flags_opened": pp.opened, "flags_resolved": pp.resolved, "errors": pp.errors[:20],
            "alerts_nudged": _nudge_alerts(changed)}


@shared_task(name="gpufleet.analysis.analyze_job", ignore_result=True)
def analyze_job(job_pk: int, now: float | None = None) -> dict[str, Any]:
    from gpufleet.analysis.runner import run_analysis

    settings = _settings()
    summary = run_analysis(_engine_for_process(settings), now=now, job_pks=[int(job_pk)],
                           thresholds=_thresholds(settings), cache=_cache(settings))
    out = _result(summary)
    out["alerts_nudged"] = _nudge_alerts(_changed(summary))
    return out

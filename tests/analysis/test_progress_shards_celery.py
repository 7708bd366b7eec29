"""The progress pass sharded like the hardware analysis (``analyze_progress_shard``, one per
shard, same stable hash, its own per-shard Redis lock): with real Celery worker processes on
Redis and PostgreSQL, two workers share one pass and every job's progress flags are synced by
exactly one shard task; a worker SIGKILLed in the middle of a progress shard leaves that shard's
lock to expire, the next ticks' messages for it are skipped meanwhile, then the survivor redoes
it. Either way the flags end exactly as one fleet-wide pass leaves them (a fleet-wide pass run
afterwards at the same ``now`` changes nothing), with no duplicated flag row.

The fleet: jobs whose two ranks report a 10 s progress window (stored rows, ``job_progress``);
every other job stopped stepping 400 s before ``NOW`` while alive (``hung``), the rest step on.
Every task of a pass gets the same explicit ``NOW``, so the outcome does not depend on when a
worker gets to it."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select

from gpufleet.storage.db import make_engine
from gpufleet.storage.models import Flag, Job, Node
from gpufleet.storage.progress_models import JobProgress
from tests.collector.conftest import make_batch, store

from .test_goodput_celery import _wait
from .test_shards_celery import Worker, _env, broker, kill_mid_shard  # noqa: F401 - broker is a fixture

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(1200)]  # waits only catch hangs
N_JOBS = 10
HUNG_FOR_S = 400.0


def _windows(job_pk: int, node_id: int, now: float, hung: bool) -> list[dict[str, Any]]:
    rows = []
    stopped = now - HUNG_FOR_S
    for rank in (0, 1):
        for k in range(60):
            start = now - 610 + 10 * k
            end = start + 10
            stepping = not hung or end <= stopped
            rows.append({"job_pk": job_pk, "node_id": node_id, "rank": rank, "pid": 100 + rank, "start_ts": start,
                         "end_ts": end, "steps": 20 if stepping else 0, "first_step": 20 * k + 1 if stepping else None,
                         "last_step": 20 * k + 20 if stepping else None, "restarts": 0, "lost_steps": 0,
                         "productive_s": 10.0 if stepping else 0.0, "stall_s": 0.0 if stepping else 10.0,
                         "unfinished_s": 0.0, "step_time_p50_s": 0.5 if stepping else None,
                         "step_time_p95_s": 0.55 if stepping else None, "step_time_max_s": 0.6 if stepping else None,
                         "last_step_ts": end - 0.1 if stepping else stopped,
                         "since_step_s": 0.1 if stepping else end - stopped, "alive": True, "ended": False,
                         "dropped": 0})
    return rows


def _fleet(url: str, now: float) -> dict[int, bool]:
    """N_JOBS jobs with progress windows: job pk -> hung."""
    engine = make_engine(url)
    try:
        hung: dict[str, bool] = {}
        with engine.begin() as c:
            for i in range(N_JOBS):
                jid = f"prog-{i:02d}"
                store(c, [make_batch(f"pnode-{i:02d}", job=jid, start=now - 600, gpus=1, seconds=2)], now)
                hung[jid] = i % 2 == 0
            pks = dict(c.execute(select(Job.job_id, Job.id)).all())
            nodes = dict(c.execute(select(Node.name, Node.id)).all())
            for i, (jid, is_hung) in enumerate(hung.items()):
                c.execute(insert(JobProgress.__table__), _windows(pks[jid], nodes[f"pnode-{i:02d}"], now, is_hung))
    finally:
        engine.dispose()
    return {pks[jid]: h for jid, h in hung.items()}


def _send_pass(url: str, now: float) -> None:
    """What beat sends every tick, with the pass's time fixed."""
    from celery import Celery

    app = Celery("test-beat", broker=url)
    try:
        app.send_task("gpufleet.analysis.analyze_due_jobs", args=[now])
    finally:
        app.close()


def _assert_as_one_fleet_wide_pass(url: str, fleet: dict[int, bool], now: float) -> None:
    from gpufleet.analysis.progress.flags import SCOPE, run_progress_pass

    engine: Engine = make_engine(url)
    try:
        with engine.connect() as c:
            f = Flag.__table__
            rows = c.execute(select(f.c.job_pk, f.c.kind, f.c.scope, f.c.open)
                             .where(f.c.scope.like(f"{SCOPE}%"))).all()
        assert len(rows) == len({(r.job_pk, r.kind, r.scope) for r in rows}), "a progress flag stored twice"
        hung = {r.job_pk for r in rows if r.kind == "hung" and r.open}
        assert hung == {pk for pk, h in fleet.items() if h}
        again = run_progress_pass(engine, now)
        assert again.jobs == len(fleet) and again.errors == []
        assert (again.opened, again.resolved, again.changed) == (0, 0, []), "the sharded pass left work undone"
    finally:
        engine.dispose()


@pytest.mark.slow
def test_two_workers_share_the_progress_pass_each_job_synced_once(pg_url: str, broker: str,  # noqa: F811
                                                                  tmp_path: Path) -> None:
    from gpufleet.analysis.shards import shard_of

    now = time.time()
    fleet = _fleet(pg_url, now)
    n = 4
    env = _env(pg_url, broker, GPUFLEET_ANALYSIS_SHARDS=str(n))
    workers = [Worker(tmp_path, "p1", env, "progress:record", str(tmp_path / "p1.progress")),
               Worker(tmp_path, "p2", env, "progress:record", str(tmp_path / "p2.progress"))]
    try:
        _wait(lambda: all(w.ready() for w in workers), 180, "both workers ready", workers[0].log)
        _send_pass(broker, now)

        def finished() -> bool:
            lines = [ln for w in workers for ln in w.text().splitlines() if "succeeded" in ln]
            return sum("analyze_progress_shard[" in ln for ln in lines) == n

        _wait(finished, 120, f"{n} progress shards to finish", workers[1].log)
        per_worker = [_synced(tmp_path / f"{w.name}.progress") for w in workers]
        assert Counter(pk for jobs in per_worker for pk in jobs) == Counter(dict.fromkeys(fleet, 1))
        shards = [{shard_of(pk, n) for pk in jobs} for jobs in per_worker]
        assert not shards[0] & shards[1], "a progress shard was split between workers or done twice"
        _assert_as_one_fleet_wide_pass(pg_url, fleet, now)
    finally:
        for w in workers:
            w.stop()


def _synced(path: Path) -> list[int]:
    return [int(line.split()[1]) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


@pytest.mark.slow
def test_a_worker_killed_mid_progress_shard_the_survivor_redoes_it(pg_url: str, broker: str,  # noqa: F811
                                                                   tmp_path: Path) -> None:

    now = time.time()
    fleet = _fleet(pg_url, now)
    n = 2
    ttl = 20.0  # long enough that a loaded box still delivers a tick while the dead lock lives
    env = _env(pg_url, broker, GPUFLEET_ANALYSIS_SHARDS=str(n), GPUFLEET_ANALYSIS_LOCK_TTL_S=str(ttl))
    stalled = tmp_path / "stalled"
    record = tmp_path / "survivor.progress"
    victim = Worker(tmp_path, "victim", env, "progress:stall", str(stalled))
    survivor = Worker(tmp_path, "survivor", env, "progress:record", str(record))
    try:
        _, shard, rest_of_shard, killed_at = kill_mid_shard(victim, survivor, stalled, fleet, n,
                                                            lambda: _send_pass(broker, now))

        last_tick = [0.0]
        redone_at = [0.0]

        def redone() -> bool:
            if rest_of_shard <= set(_synced(record)):
                redone_at[0] = redone_at[0] or time.monotonic()
                return True
            if time.monotonic() - last_tick[0] >= 1.0:  # beat's ticks, one a second
                _send_pass(broker, now)
                last_tick[0] = time.monotonic()
            return False

        _wait(redone, 120, "the survivor to redo the victim's progress shard", survivor.log)
        # While the dead worker's lock lived, the ticks' messages for its progress shard were
        # skipped, not run beside it; the redo came once the lock expired.
        skipped = [ln for ln in survivor.text().splitlines()
                   if "analyze_progress_shard[" in ln and f"'shard': {shard}," in ln and "'skipped'" in ln]
        assert skipped, survivor.text()[-3000:]
        assert redone_at[0] - killed_at >= ttl - 1.0  # 1 s: the stall's last refresh
        _wait(lambda: not _busy(survivor), 180, "the survivor's queue to drain", survivor.log)
        _assert_as_one_fleet_wide_pass(pg_url, fleet, now)
    finally:
        victim.stop()
        survivor.stop()


def _busy(w: Worker) -> bool:
    """Ticks sent just before the redo may still be running: wait until its log is quiet."""
    before = len(w.text())
    time.sleep(2.0)
    return len(w.text()) != before


def test_one_pass_in_process_syncs_each_progress_job_once_on_sqlite(sqlite_url: str, broker: str,  # noqa: F811
                                                                    tmp_path: Path) -> None:
    """The fan-out and its progress shards inline (Celery's eager mode, locks on real Redis):
    every job with progress is synced by exactly the shard its hash names, once."""
    from gpufleet.analysis import tasks
    from gpufleet.analysis.shards import shard_of
    from gpufleet.celery_app import make_celery
    from gpufleet.settings import Settings

    now = time.time()
    fleet = _fleet(sqlite_url, now)
    n = 3
    app = make_celery(Settings.from_env({"GPUFLEET_DATABASE_URL": sqlite_url, "GPUFLEET_REDIS_URL": broker,
                                         "GPUFLEET_ANALYSIS_SHARDS": str(n)}))
    app.conf.task_always_eager = True
    seen: list[int] = []
    tasks.progress_done_hooks.append(seen.append)
    try:
        assert tasks.analyze_due_jobs.apply((now,)).get() == {"shards": n}
        results = [tasks.analyze_progress_shard.apply((shard, n, now)).get() for shard in range(n)]
    finally:
        tasks.progress_done_hooks.remove(seen.append)
        app.close()
    # Once per job in the pass, and once more in the three shard tasks run by hand after it.
    assert Counter(seen) == Counter(dict.fromkeys(fleet, 2))
    assert [r["jobs"] for r in results] == [sum(shard_of(pk, n) == s for pk in fleet) for s in range(n)]
    assert {shard_of(pk, n) for pk in fleet} == set(range(n))  # every shard had work
    assert all(r["flags_opened"] == r["flags_resolved"] == 0 for r in results)  # the pass had done it all
    _assert_as_one_fleet_wide_pass(sqlite_url, fleet, now)

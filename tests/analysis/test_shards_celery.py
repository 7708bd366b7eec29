"""Sharded analysis with real Celery worker processes on Redis and PostgreSQL: two workers share
one pass (every job analyzed exactly once, both did work), and a worker SIGKILLed in the middle
of a shard: the survivor redoes that shard once its lock expires, and no job is analyzed twice,
lost, or left with a duplicated report or flag. Plus the per-shard lock itself, on real Redis.

The jobs go in through the collector's write path (``conftest.ingest``); the test sends the
beat's message itself (``analyze_due_jobs``), so it knows when a pass starts. Each worker records
the jobs it finished (``tests/support/crash_worker.py analysis:record``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gpufleet.agent.simulator import make_job

from .conftest import ingest
from .test_goodput_celery import _wait

CRASH_WORKER = Path(__file__).resolve().parent.parent / "support" / "crash_worker.py"
pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(1200)]  # waits only catch hangs

PROFILES = {"idle_gpu": {"idle_gpu"}, "vision_train": set()}
N_JOBS = 10


@pytest.fixture
def broker(redis_url: str) -> Iterator[str]:
    """A Redis database of these tests' own (no other test's queue or locks), emptied: number 9
    of the test Redis, or ``GPUFLEET_TEST_BROKER_URL`` where several people share one server."""
    import redis

    url = os.environ.get("GPUFLEET_TEST_BROKER_URL") or redis_url.rsplit("/", 1)[0] + "/9"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


def _fleet(pg_url: str) -> dict[int, tuple[str, set[str]]]:
    """N_JOBS running 1-GPU jobs with 40 minutes of samples: job pk -> (job id, expected flags)."""
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Job

    now = time.time()
    start = now - 40 * 60
    names = list(PROFILES)
    expected = {}
    engine = make_engine(pg_url)
    try:
        for i in range(N_JOBS):
            profile = names[i % len(names)]
            job = make_job(profile, f"shard-{i:02d}", 1, start, 4 * 3600, node_prefix="shard")
            ingest(engine, job, start, now - 2, chunk_s=600)
            expected[job.job_id] = PROFILES[profile]
        with engine.connect() as c:
            pks = dict(c.execute(select(Job.job_id, Job.id)).all())
    finally:
        engine.dispose()
    return {pks[jid]: (jid, kinds) for jid, kinds in expected.items()}


class Worker:
    def __init__(self, tmp_path: Path, name: str, env: dict[str, str], *points: str) -> None:
        self.name = name
        self.log = tmp_path / f"{name}.log"
        self.record = tmp_path / f"{name}.jobs"
        self.record.touch()
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(CRASH_WORKER), "analysis:record", str(self.record), *points, "--", "worker",
                 "--concurrency=1", "--loglevel=INFO", f"--hostname={name}@%h", "--without-gossip",
                 "--without-mingle", "--without-heartbeat"],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"worker {self.name} exited\n{self.text()[-3000:]}")
        return " ready." in self.text()

    def jobs(self) -> list[int]:
        return [int(line.split()[1]) for line in self.record.read_text().splitlines() if line.strip()]

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and its pool child): no cleanup, no ack."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(20)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def kill_mid_shard(victim: Worker, survivor: Worker, stalled: Path, fleet: Iterable[int], n: int,
                   send_pass: Callable[[], None]) -> tuple[int, int, set[int], float]:
    """Both workers up, one pass sent, the victim stalled after its first job of a shard, then
    SIGKILLed: (the job it finished, its shard, the rest of that shard, when it was killed)."""
    from gpufleet.analysis.shards import shard_of

    _wait(lambda: victim.ready() and survivor.ready(), 180, "both workers ready", victim.log)
    send_pass()
    _wait(stalled.exists, 180, "the victim to stop in the middle of a shard", victim.log)
    stalled_pk = int(stalled.read_text().split()[1])
    shard = shard_of(stalled_pk, n)
    rest_of_shard = {pk for pk in fleet if shard_of(pk, n) == shard} - {stalled_pk}
    assert rest_of_shard, "the fleet must put at least two jobs in the victim's shard"
    victim.kill()
    return stalled_pk, shard, rest_of_shard, time.monotonic()


def _env(pg_url: str, broker: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "GPUFLEET_REDIS_URL": broker, "GPUFLEET_DATABASE_URL": pg_url, **extra}


def _send_pass(broker: str) -> None:
    """What beat sends every tick."""
    from celery import Celery

    app = Celery("test-beat", broker=broker)
    try:
        app.send_task("gpufleet.analysis.analyze_due_jobs")
    finally:
        app.close()


def _reports_and_flags(pg_url: str) -> tuple[dict[int, int], dict[int, set[str]], int]:
    """job pk -> report rows, job pk -> flag kinds, the largest row count of one (job, kind, scope)."""
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Flag, JobReport

    engine = make_engine(pg_url)
    try:
        with engine.connect() as c:
            reports = dict(c.execute(select(JobReport.job_pk, func.count()).group_by(JobReport.job_pk)).all())
            flags: dict[int, set[str]] = {}
            for pk, kind in c.execute(select(Flag.job_pk, Flag.kind)):
                flags.setdefault(pk, set()).add(kind)
            dup = c.execute(select(func.count()).select_from(Flag).group_by(Flag.job_pk, Flag.kind, Flag.scope)
                            .order_by(func.count().desc()).limit(1)).scalar() or 0
    finally:
        engine.dispose()
    return reports, flags, int(dup)


def _assert_outcome(pg_url: str, fleet: dict[int, tuple[str, set[str]]]) -> None:
    reports, flags, dup = _reports_and_flags(pg_url)
    assert reports == {pk: 1 for pk in fleet}
    assert dup <= 1
    assert {pk: flags.get(pk, set()) for pk in fleet} == {pk: kinds for pk, (_, kinds) in fleet.items()}


@pytest.mark.slow
def test_two_workers_share_one_pass_each_job_once(pg_url: str, broker: str, tmp_path: Path) -> None:
    from gpufleet.analysis.shards import shard_of

    fleet = _fleet(pg_url)
    n = 4
    env = _env(pg_url, broker, GPUFLEET_ANALYSIS_SHARDS=str(n))
    workers = [Worker(tmp_path, "w1", env), Worker(tmp_path, "w2", env)]
    try:
        _wait(lambda: all(w.ready() for w in workers), 180, "both workers ready", workers[0].log)
        _send_pass(broker)

        def finished() -> bool:
            lines = [ln for w in workers for ln in w.text().splitlines() if "succeeded" in ln]
            return (sum("analyze_shard[" in ln for ln in lines) == n
                    and sum("analyze_progress_shard[" in ln for ln in lines) == n)

        _wait(finished, 120, f"the fan-out, {n} shards and their progress passes to finish", workers[1].log)
        per_worker = [w.jobs() for w in workers]
        assert Counter(pk for jobs in per_worker for pk in jobs) == Counter(dict.fromkeys(fleet, 1))
        assert all(per_worker), f"one worker did the whole pass: {per_worker}"
        # Each worker's jobs are whole shards: no shard was split between them or done twice.
        shards = [{shard_of(pk, n) for pk in jobs} for jobs in per_worker]
        assert not shards[0] & shards[1]
        _assert_outcome(pg_url, fleet)
    finally:
        for w in workers:
            w.stop()


@pytest.mark.slow
def test_a_worker_killed_mid_shard_the_survivor_redoes_it_once(pg_url: str, broker: str, tmp_path: Path) -> None:

    fleet = _fleet(pg_url)
    n = 2
    ttl = 20.0  # long enough that a loaded box still delivers a tick while the dead lock lives
    env = _env(pg_url, broker, GPUFLEET_ANALYSIS_SHARDS=str(n), GPUFLEET_ANALYSIS_LOCK_TTL_S=str(ttl))
    stalled = tmp_path / "stalled"
    victim = Worker(tmp_path, "victim", env, "analysis:stall", str(stalled))
    survivor = Worker(tmp_path, "survivor", env)
    try:
        stalled_pk, shard, rest_of_shard, killed_at = kill_mid_shard(victim, survivor, stalled, fleet, n,
                                                                     lambda: _send_pass(broker))

        last_tick = [0.0]

        def all_reported() -> bool:
            if time.monotonic() - last_tick[0] >= 1.0:  # beat's ticks, one a second
                _send_pass(broker)
                last_tick[0] = time.monotonic()
            return len(_reports_and_flags(pg_url)[0]) == len(fleet)

        _wait(all_reported, 120, "the survivor to finish every shard", survivor.log)
        redone_after = time.monotonic() - killed_at
        survivor_jobs = survivor.jobs()
        # The job the victim finished was committed and is not redone; the rest of its shard is
        # the survivor's, once; no job is analyzed twice.
        assert victim.jobs() == [stalled_pk]
        assert Counter(victim.jobs() + survivor_jobs) == Counter(dict.fromkeys(fleet, 1))
        assert rest_of_shard <= set(survivor_jobs)
        # While the dead worker's lock lived, the next ticks' messages for that shard did not
        # start a second run of it: they were skipped.
        assert f"'shard': {shard}, 'n_shards': {n}, 'skipped'" in survivor.text()
        assert redone_after >= ttl - 1.0  # not before the lock expired (1 s: the stall's last refresh)
        _assert_outcome(pg_url, fleet)
    finally:
        victim.stop()
        survivor.stop()


def test_shard_lock_excludes_others_and_is_taken_over_by_its_own_message(broker: str) -> None:
    import redis

    from gpufleet.analysis.tasks import acquire
    from gpufleet.settings import Settings

    settings = Settings.from_env({"GPUFLEET_REDIS_URL": broker, "GPUFLEET_ANALYSIS_LOCK_TTL_S": "5"})
    client = redis.Redis.from_url(broker)
    key = "gpufleet:analysis:shard:test"
    first = acquire(settings, key, "task-1")
    assert first is not None and not first.taken_over
    assert acquire(settings, key, "task-2") is None  # another message: the shard is busy
    again = acquire(settings, key, "task-1")  # the same message redelivered (its worker died)
    assert again is not None and again.taken_over
    assert 0 < client.pttl(key) <= 5000
    other = first.__class__(first.client, key, "task-2", first.ttl_ms)
    other.release()  # a holder whose lock expired must not free the new holder's
    assert client.get(key) == b"task-1"
    first.release()
    assert client.get(key) is None
    assert acquire(settings, key, "task-2") is not None
    client.close()


def test_one_pass_in_process_covers_every_job_once_on_sqlite(sqlite_url: str, broker: str, tmp_path: Path) -> None:
    """The fan-out and its shards run inline (Celery's eager mode, locks on real Redis): every
    due job is analyzed by exactly one shard, and a second pass finds nothing left to do."""
    from gpufleet.analysis import tasks
    from gpufleet.analysis.shards import shard_of
    from gpufleet.celery_app import make_celery
    from gpufleet.settings import Settings

    fleet = _fleet(sqlite_url)
    n = 3
    app = make_celery(Settings.from_env({"GPUFLEET_DATABASE_URL": sqlite_url, "GPUFLEET_REDIS_URL": broker,
                                         "GPUFLEET_ANALYSIS_SHARDS": str(n)}))
    app.conf.task_always_eager = True
    seen: list[int] = []
    tasks.job_done_hooks.append(seen.append)
    try:
        assert tasks.analyze_due_jobs.apply().get() == {"shards": n}
        first = sorted(seen)
        seen.clear()
        again = [tasks.analyze_shard.apply((shard, n)).get() for shard in range(n)]
    finally:
        tasks.job_done_hooks.remove(seen.append)
        app.close()
    assert first == sorted(fleet)
    assert seen == [], again  # nothing is due after a full pass
    assert {shard_of(pk, n) for pk in fleet} == set(range(n))  # every shard had work
    _assert_outcome(sqlite_url, fleet)

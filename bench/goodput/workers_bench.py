"""One full analysis pass over a fleet in PostgreSQL, done by 1 real Celery worker and by 2
(issue 16: the sharded pass, analysis/tasks.py), interleaved round by round; reports the wall
time, the workers' CPU and the speedup ratio.

    .venv/bin/python bench/goodput/workers_bench.py --quick        # 2 seeds of the job mix, 2 rounds
    .venv/bin/python bench/goodput/workers_bench.py --seeds 6 --rounds 3

The fleet is make_history.py's job mix (every simulator profile, sizes 1-32 GPUs, 1 Hz), written
as NDJSON and stored through the collector's import path into a throwaway database
(``--pg-url`` names the server: default $GPUFLEET_TEST_PG_URL). Each measurement starts its
workers fresh (``celery -A gpufleet.celery_app worker --concurrency=1``: cold caches, as after
a deploy), deletes every report and flag so every job is due, sends the beat's message
(``analyze_due_jobs``: one task per shard) and waits until every job has its report. Wall time
runs from the send to the last report; CPU is the workers' processes (user + system), not
PostgreSQL's. On a 2-core machine a second worker cannot give 2x: PostgreSQL and the Redis
broker share the same two cores."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import func, select, text

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simjobs import plan_jobs

from gpufleet.agent.simulator import write_ndjson_history


def _admin(admin_url: str, sql: str) -> list[Any]:
    from sqlalchemy import create_engine

    admin = create_engine(admin_url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            res = c.execute(text(sql))
            return list(res) if res.returns_rows else []
    finally:
        admin.dispose()


def _make_db(admin_url: str, name: str, reuse: bool) -> tuple[str, bool]:
    """(URL, whether it already holds a fleet): a fresh migrated database, or with ``reuse``
    the one of that name when it exists (loading a fleet takes minutes on a busy machine)."""
    from gpufleet.storage.migrate import upgrade

    url = admin_url.rsplit("/", 1)[0] + "/" + name
    exists = bool(_admin(admin_url, f"SELECT 1 FROM pg_database WHERE datname = '{name}'"))
    if not (reuse and exists):
        _admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _admin(admin_url, f'CREATE DATABASE "{name}"')
    upgrade(url)
    from gpufleet.storage.db import make_engine

    engine = make_engine(url)
    with engine.connect() as c:
        has_jobs = bool(c.execute(text("SELECT count(*) FROM jobs")).scalar())
    engine.dispose()
    return url, has_jobs


def _load_fleet(url: str, seeds: int, minutes: tuple[float, float]) -> tuple[int, int]:
    """The job mix into the database; returns (jobs, GPU-samples)."""
    from gpufleet.collector.ndjson import import_file
    from gpufleet.storage.db import make_engine

    # Ended within the last day (retention keeps them; the workers' housekeeping closes nothing).
    jobs = plan_jobs(range(seeds), min_minutes=minutes[0], max_minutes=minutes[1],
                     start_ts=time.time() - 86400 - 3 * 3600)
    engine = make_engine(url)
    try:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "fleet.ndjson")
            with open(path, "w") as fh:
                rows = write_ndjson_history(fh, jobs)
            import_file(engine, path)
    finally:
        engine.dispose()
    return len(jobs), rows


def _reset(url: str) -> int:
    """Every report and flag gone: every job with samples is due again. Returns the jobs due."""
    from gpufleet.analysis.runner import due_jobs
    from gpufleet.storage.db import make_engine

    engine = make_engine(url)
    try:
        with engine.begin() as c:
            c.execute(text("DELETE FROM flags"))
            c.execute(text("DELETE FROM job_reports"))
        with engine.connect() as c:
            return len(due_jobs(c))
    finally:
        engine.dispose()


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        for q in [p, *p.children(recursive=True)]:
            try:
                t = q.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
    return total


def _backends(db: str, exclude: int) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving ``db`` (by its process title), but ours."""
    out = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] != exclude and cmd.startswith("postgres:") and f" {db} " in cmd:
            try:
                t = p.cpu_times()
                out[p.info["pid"]] = t.user + t.system
            except psutil.NoSuchProcess:
                pass
    return out


def _warm_up(app: Any, broker: str, workers: int) -> None:
    """A few on-demand analyses of a job that does not exist: each pool process connects to the
    database, loads the thresholds and runs the runner's code once, so the timed pass measures
    the steady state of long-lived workers (``--cold`` skips this: a pass right after a deploy)."""
    import redis

    for _ in range(4 * workers):
        app.send_task("gpufleet.analysis.analyze_job", (-1,))
    client = redis.Redis.from_url(broker)
    deadline = time.monotonic() + 120
    while client.llen("celery") or any((app.control.inspect(timeout=0.5).active() or {"?": [1]}).values()):
        if time.monotonic() > deadline:
            raise SystemExit("the warm-up did not finish")
        time.sleep(0.2)


def _one_pass(url: str, broker: str, workers: int, shards: int, timeout: float, cold: bool) -> dict[str, float]:
    import redis
    from celery import Celery

    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import JobReport

    redis.Redis.from_url(broker).flushdb()  # no message or lock left from the previous run
    env = {**os.environ, "GPUFLEET_DATABASE_URL": url, "GPUFLEET_REDIS_URL": broker,
           "GPUFLEET_ANALYSIS_SHARDS": str(shards), "GPUFLEET_ANALYSIS_INTERVAL_S": "600"}
    cmd = [sys.executable, "-m", "celery", "-A", "gpufleet.celery_app", "worker", "--concurrency=1",
           "--loglevel=WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    # Each worker in a session of its own, as on its own host: with the kernel's autogroup
    # scheduling (Debian's default) processes of one session share one CPU share, so on a busy
    # machine two workers started from this script would get no more CPU than one.
    procs = [subprocess.Popen([*cmd, f"--hostname=bench{i}@%h"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True) for i in range(workers)]
    app = Celery("workers-bench", broker=broker)
    engine = make_engine(url)
    db = url.rsplit("/", 1)[1]
    poll = engine.connect()
    me = int(poll.execute(text("SELECT pg_backend_pid()")).scalar_one())
    try:
        deadline = time.monotonic() + 120
        while len(app.control.ping(timeout=0.5) or []) < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit("the workers did not start")
        if not cold:
            _warm_up(app, broker, workers)
        due = _reset(url)
        ps = [psutil.Process(p.pid) for p in procs]
        cpu0, pg0 = _cpu(ps), _backends(db, me)
        t0 = time.perf_counter()
        app.send_task("gpufleet.analysis.analyze_due_jobs")
        while True:
            done = poll.execute(select(func.count()).select_from(JobReport)).scalar_one()
            poll.rollback()
            if done >= due:
                break
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"{done}/{due} jobs analyzed after {timeout:.0f} s")
            time.sleep(0.1)
        wall = time.perf_counter() - t0
        cpu = _cpu(ps) - cpu0
        pg = sum(v - pg0.get(pid, 0.0) for pid, v in _backends(db, me).items())
    finally:
        poll.close()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        engine.dispose()
        app.close()
    return {"wall_s": wall, "cpu_s": cpu, "pg_cpu_s": pg, "due": due}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds of 35-45 minute jobs, 2 rounds")
    ap.add_argument("--seeds", type=int, default=4, help="copies of the job mix (17 jobs each)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved 1-worker/2-worker rounds")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--pg-url", default=os.environ.get("GPUFLEET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/11", help="a Redis database the bench may empty")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--cold", action="store_true", help="time the workers' first pass (no warm-up)")
    ap.add_argument("--db", default=None, help="keep the fleet in this database and reuse it when it exists "
                    "(default: a fresh one, dropped at the end)")
    a = ap.parse_args(argv)
    seeds, rounds, minutes = (2, 2, (35.0, 45.0)) if a.quick else (a.seeds, a.rounds, (40.0, 100.0))
    name = a.db or f"gpufleet_workers_bench_{os.getpid()}"
    url, loaded = _make_db(a.pg_url, name, reuse=bool(a.db))
    try:
        return _measure(a, url, loaded, seeds, rounds, minutes)
    finally:
        if not a.db:
            _admin(a.pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _measure(a: argparse.Namespace, url: str, loaded: bool, seeds: int, rounds: int,
             minutes: tuple[float, float]) -> int:
    if loaded:
        print("fleet: reusing the one in", url.rsplit("/", 1)[1])
    else:
        t = time.perf_counter()
        n_jobs, rows = _load_fleet(url, seeds, minutes)
        print(f"fleet: {n_jobs} jobs, {rows:,} GPU-samples (loaded in {time.perf_counter() - t:.0f} s)")
    print(f"{a.shards} shards; {psutil.cpu_count()} CPUs; {'cold' if a.cold else 'warmed-up'} workers")
    results: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for r in range(rounds):
        order = (1, 2) if r % 2 == 0 else (2, 1)  # interleaved, alternating who goes first
        for workers in order:
            res = _one_pass(url, a.redis_url, workers, a.shards, a.timeout, a.cold)
            results[workers].append(res)
            print(f"round {r + 1}: {workers} worker(s): {res['due']:.0f} jobs in {res['wall_s']:.2f} s wall, "
                  f"{res['cpu_s']:.2f} s worker CPU, {res['pg_cpu_s']:.2f} s PostgreSQL CPU", flush=True)
    med: dict[int, Any] = {w: {k: statistics.median(x[k] for x in rs) for k in ("wall_s", "cpu_s", "pg_cpu_s")}
                           for w, rs in results.items()}
    ratios = [one["wall_s"] / two["wall_s"] for one, two in zip(results[1], results[2], strict=True)]
    print(f"median wall: 1 worker {med[1]['wall_s']:.2f} s, 2 workers {med[2]['wall_s']:.2f} s; "
          f"speedup {statistics.median(ratios):.2f}x (per round: {', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"median worker CPU: 1 worker {med[1]['cpu_s']:.2f} s, 2 workers {med[2]['cpu_s']:.2f} s "
          f"({med[2]['cpu_s'] / med[1]['cpu_s']:.2f}x); PostgreSQL CPU {med[1]['pg_cpu_s']:.2f} s vs "
          f"{med[2]['pg_cpu_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A simulated day of a small two-cluster fleet, written straight into a migrated PostgreSQL
database: 16 nodes x 8 GPUs, 4-hour job slots, 1-minute rollups for every catalog field,
findings, reports and events. Values follow each job's profile (idle, low activity, no tensor
cores, healthy) so every panel has something to show.

The rollups are generated inside PostgreSQL (generate_series), which loads ~185k rows in a few
seconds on a 2-core machine; Python only writes the small dimension tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpufleet.catalog import CATALOG, Field

CLUSTERS = ("default", "alpha")
NODES_PER_CLUSTER = 8
GPUS_PER_NODE = 8
HOURS = 24
SLOT_S = 4 * 3600
TEAMS = ("vision", "nlp", "speech", "rl")
# job profile -> (sm_active level, tensor_active level, finding kind or None)
PROFILES = (
    (0.01, 0.0, "idle_gpu"),
    (0.15, 0.05, "low_sm_activity"),
    (0.85, 0.45, None),
    (0.70, 0.01, "no_tensor_cores"),
    (0.92, 0.60, None),
)


@dataclass(frozen=True)
class SimFleet:
    now: int
    start: int
    job_pks: tuple[int, ...]
    gpu_count: int


def _value_sql(f: Field) -> str:
    """SQL for one catalog field from ``act``/``ten`` (the job profile's levels), ``b.bucket``,
    ``g.id`` and ``random()``; within the field's catalog range."""
    noise = "(0.9 + 0.2 * random())"
    by_unit = {
        "ratio": f"least(1.0, {'ten' if f.name == 'tensor_active' else 'act'} * {noise})",
        "bytes": "85899345920" if f.name == "fb_total_bytes" else f"85899345920 * least(1.0, 0.05 + act * {noise})",
        "bytes/s": f"1.0e10 * act * {noise}",
        "W": f"70 + 600 * act * {noise}",
        "J": "(b.bucket - :start) * 400",
        "C": f"32 + 45 * act * {noise} + CASE WHEN g.id % 29 = 0 THEN 15 ELSE 0 END",
        "MHz": "CASE WHEN g.id % 29 = 0 AND act > 0.5 THEN 1400 ELSE 1980 END"
        if f.name == "sm_clock_mhz" else "2619",
        "bitmask": "CASE WHEN act < 0.05 THEN 1 WHEN g.id % 29 = 0 THEN 64 ELSE 0 END",
        "xid": "CASE WHEN g.id % 37 = 0 AND b.bucket > :now - 7200 THEN 79 ELSE 0 END",
        "count": "CASE WHEN g.id % 31 = 0 THEN floor((b.bucket - :start) / 3600) ELSE 0 END",
        "bool": "CASE WHEN g.id % 41 = 0 THEN 1 ELSE 0 END",
    }
    expr = by_unit.get(f.unit, "0")
    if f.dtype == "i8":
        expr = f"({expr})::bigint"
    return expr


def _job_agg(f: Field) -> str:
    return {"mean": "avg", "max": "max", "last": "max", "sum_rate": "avg"}[f.rollup]


def _ensure_day_partitions(cur, start: int, now: int) -> None:  # type: ignore[no-untyped-def]
    """Daily partitions for the simulated range, when the rollups are partitioned (the
    collector's maintenance loop creates them in production); named as the collector does."""
    import datetime as dt

    for table in ("gpu_samples_1m", "job_samples_1m"):
        partitioned = cur.execute(
            "SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(%s)", (table,)).fetchone()
        if not partitioned:
            continue
        for day in range(start // 86400 * 86400, now + 86400, 86400):
            name = f"{table}_p{dt.datetime.fromtimestamp(day, dt.UTC):%Y%m%d}"
            cur.execute(f'CREATE TABLE IF NOT EXISTS "{name}" PARTITION OF {table} '
                        f"FOR VALUES FROM ({day}) TO ({day + 86400})")


def load(conn, now: int) -> SimFleet:  # type: ignore[no-untyped-def]
    """Fill the database behind ``conn`` (psycopg, autocommit off) with the simulated fleet."""
    start = now - HOURS * 3600
    cur = conn.cursor()
    cur.execute("SELECT setseed(0.42)")
    cur.execute("INSERT INTO clusters (name) VALUES ('alpha') ON CONFLICT DO NOTHING")
    clusters = dict(cur.execute("SELECT name, id FROM clusters").fetchall())
    gpu_ids: dict[tuple[str, int], list[int]] = {}
    for ci, cname in enumerate(CLUSTERS):
        for n in range(NODES_PER_CLUSTER):
            node = f"{cname[:1]}-gpu{n + 1:02d}"
            # one silent node per cluster: its agent stopped an hour ago
            seen = now - 3600 if n == NODES_PER_CLUSTER - 1 else now - 5
            node_id = cur.execute(
                "INSERT INTO nodes (cluster_id, name, agent_version, last_seen) VALUES (%s, %s, '0.1.0', %s) "
                "RETURNING id", (clusters[cname], node, seen)).fetchone()[0]
            ids = []
            for i in range(GPUS_PER_NODE):
                ids.append(cur.execute(
                    "INSERT INTO gpus (node_id, uuid, index, model, memory_total_bytes, last_seen) "
                    "VALUES (%s, %s, %s, 'NVIDIA H100 80GB HBM3', 85899345920, %s) RETURNING id",
                    (node_id, f"GPU-{ci:02d}{n:02d}{i:02d}-sim", i, seen)).fetchone()[0])
            gpu_ids[(cname, n)] = ids

    job_pks: list[int] = []
    slots = HOURS * 3600 // SLOT_S
    for (cname, n), gpus in gpu_ids.items():
        for s in range(slots):
            if (n + s) % 4 == 0:
                continue  # the node sits unallocated during this slot
            t0 = start + s * SLOT_S
            running = s == slots - 1
            t1 = None if running else t0 + SLOT_S - 60
            team = TEAMS[n % len(TEAMS)]
            user = f"u{(n * 3 + s) % 12:02d}"
            job_pk = cur.execute(
                'INSERT INTO jobs (cluster_id, job_id, source, "user", name, account, partition, num_nodes, '
                "ntasks, state, start_ts, end_ts, last_sample_ts) "
                "VALUES (%s, %s, 'slurm', %s, %s, %s, 'gpu', 1, 8, %s, %s, %s, %s) RETURNING id",
                (clusters[cname], f"{1000 + n * 10 + s}", user, f"train-{team}-{s}", team,
                 "running" if running else "ended", t0, t1, t1 or now)).fetchone()[0]
            job_pks.append(job_pk)
            cur.executemany("INSERT INTO allocations (job_pk, gpu_pk, start_ts, end_ts) VALUES (%s, %s, %s, %s)",
                            [(job_pk, g, t0, t1) for g in gpus])

    _ensure_day_partitions(cur, start, now)
    rollup_cols = {r[0] for r in cur.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'gpu_samples_1m'").fetchall()}
    # the collector's rollups may carry the newest raw sample's time folded into each bucket
    last_col, last_val = (", last_ts", ", b.bucket + 59") if "last_ts" in rollup_cols else ("", "")
    fields = CATALOG.fields
    levels = ", ".join(f"({i}, {a}, {t})" for i, (a, t, _) in enumerate(PROFILES))
    cols = ", ".join(f.name for f in fields)
    # "%" is psycopg's placeholder character: the modulo operators in the expressions double it.
    exprs = ",\n".join(_value_sql(f) for f in fields).replace("%", "%%")
    # Bucket-major order, as the collector appends them (what the BRIN index expects).
    cur.execute(f"""
        INSERT INTO gpu_samples_1m (bucket, gpu_pk, job_pk, n{last_col}, {cols})
        SELECT b.bucket, g.id, a.job_pk, 60{last_val},
        {exprs}
        FROM generate_series(%(start)s::bigint, %(now)s::bigint - 60, 60) AS b(bucket)
        CROSS JOIN gpus g
        LEFT JOIN allocations a ON a.gpu_pk = g.id AND b.bucket >= a.start_ts
             AND b.bucket < coalesce(a.end_ts, 'infinity'::float8)
        LEFT JOIN (VALUES {levels}) AS p(profile, a_level, t_level) ON p.profile = a.job_pk %% {len(PROFILES)}
        CROSS JOIN LATERAL (SELECT coalesce(p.a_level, 0.0) AS act, coalesce(p.t_level, 0.0) AS ten) lv
        ORDER BY b.bucket, g.id
    """.replace(":start", "%(start)s").replace(":now", "%(now)s"), {"start": start, "now": now})
    aggs = ", ".join(f"{_job_agg(f)}({f.name})" for f in fields)
    cur.execute(f"""
        INSERT INTO job_samples_1m (bucket, job_pk, n{last_col}, {cols})
        SELECT bucket, job_pk, sum(n){last_col and ", max(last_ts)"}, {aggs}
        FROM gpu_samples_1m WHERE job_pk IS NOT NULL
        GROUP BY bucket, job_pk ORDER BY bucket, job_pk
    """)

    jobs = cur.execute("SELECT id, start_ts, coalesce(end_ts, %s) FROM jobs WHERE id = ANY(%s)",
                       (now, job_pks)).fetchall()
    for job_pk, t0, t1 in jobs:
        act, _ten, kind = PROFILES[job_pk % len(PROFILES)]
        hours = 8 * (t1 - t0) / 3600
        wasted = 0.0
        if kind:
            wasted = hours * (1 - act) * (0.5 if kind == "no_tensor_cores" else 1.0)
            cur.execute(
                "INSERT INTO flags (job_pk, kind, scope, severity, start_ts, end_ts, wasted_gpu_hours, evidence, "
                "suggestion, open, opened_at) VALUES (%s, %s, '', %s, %s, %s, %s, %s, %s, %s, %s)",
                (job_pk, kind, "critical" if kind == "idle_gpu" else "warning", t0 + 600, t1, wasted,
                 json.dumps({"sm_active_mean": act}), f"simulated suggestion for {kind}", t1 >= now, t0 + 600))
        if job_pk % 2 == 0:
            extra = hours * 0.1
            wasted += extra
            cur.execute(
                "INSERT INTO flags (job_pk, kind, scope, severity, start_ts, end_ts, wasted_gpu_hours, evidence, "
                "suggestion, open, opened_at) VALUES (%s, 'memory_underuse', '', 'info', %s, %s, %s, '{}', "
                "'request a smaller GPU or a MIG slice', false, %s)", (job_pk, t0 + 900, t1, extra, t0 + 900))
        cur.execute(
            "INSERT INTO job_reports (job_pk, computed_at, analyzed_until, goodput_score, allocated_gpu_hours, "
            "wasted_gpu_hours, report) VALUES (%s, %s, %s, %s, %s, %s, '{}')",
            (job_pk, now, t1, max(0.0, 1 - wasted / hours), hours, wasted))
        # The job's stored ledger (migration 0015): 8 GPUs x 60 s a minute, split once between
        # productive, its flags' kinds and a tenth unobserved, adding up to the allocation.
        share_w = min(wasted / hours, 0.9) if hours > 0 else 0.0
        cur.execute(
            "INSERT INTO gpu_ledger (job_pk, minute, category, gpu_s) "
            "SELECT %s, m, c.cat, 480.0 * c.share "
            "FROM generate_series(floor(%s / 60.0)::int, ceil(%s / 60.0)::int - 1) AS m, "
            "(VALUES ('productive', %s::float8), ('unobserved', %s::float8), (%s, %s::float8)) AS c(cat, share) "
            "WHERE c.share > 0",
            (job_pk, t0, t1, 0.9 * (1 - share_w), 0.1 * (1 - share_w), kind or "idle", share_w))
        if job_pk % 3 == 0:
            gpu, node = cur.execute(
                "SELECT a.gpu_pk, g.node_id FROM allocations a JOIN gpus g ON g.id = a.gpu_pk "
                "WHERE a.job_pk = %s ORDER BY a.gpu_pk LIMIT 1", (job_pk,)).fetchone()
            cur.execute("INSERT INTO events (ts, node_id, gpu_pk, kind, code, message) VALUES (%s, %s, %s, 'xid', 79, "
                        "'GPU has fallen off the bus')", (t0 + 1800, node, gpu))
    conn.commit()
    # What autovacuum would have done by the time anyone looks at a dashboard.
    conn.autocommit = True
    cur.execute("ANALYZE")
    conn.autocommit = False
    return SimFleet(now=now, start=start, job_pks=tuple(job_pks), gpu_count=sum(map(len, gpu_ids.values())))

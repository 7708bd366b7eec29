"""Waste by team and cause: wasted GPU-hours from the goodput findings, prorated to the range,
split by team (Slurm account or Kubernetes namespace), cause (flag kind) and user."""

from __future__ import annotations

from .builders import (
    Dashboard,
    Panel,
    Query,
    Row,
    barchart,
    column_unit,
    piechart,
    query_variable,
    stat,
    table,
    timeseries,
)
from .common import OVERLAPS_RANGE, RANGE_FRACTION, cluster_variable

UID = "gpufleet-waste"

# "(none)" is always an option, so "All" never expands to an empty IN () list.
TEAM_VAR_QUERY = Query(
    """
    SELECT '(none)' AS team
    UNION
    SELECT DISTINCT team FROM grafana_jobs
    WHERE cluster IN ($cluster) AND start_ts <= $__unixEpochTo()
      AND coalesce(end_ts, 'infinity') >= $__unixEpochFrom()
    ORDER BY 1
    """, ("team",), "table")

SELECTED_FLAGS = f"cluster IN ($cluster) AND team IN ($team) AND {OVERLAPS_RANGE}"
WASTED = f"sum(wasted_gpu_hours * {RANGE_FRACTION})"
JOB_RANGE_FRACTION = "grafana_overlap(start_ts, coalesce(end_ts, last_sample_ts, $__unixEpochTo()), " \
                     "$__unixEpochFrom(), $__unixEpochTo())"
# Ledger minutes of the range (minute = floor(ts / 60)) of the selected jobs.
LEDGER_SELECTED = "j.cluster IN ($cluster) AND j.team IN ($team) " \
                  "AND l.minute >= floor($__unixEpochFrom() / 60) AND l.minute < ceil($__unixEpochTo() / 60)"
SELECTED_JOBS = "cluster IN ($cluster) AND team IN ($team) AND start_ts <= $__unixEpochTo() " \
                "AND coalesce(end_ts, 'infinity') >= $__unixEpochFrom()"


def build() -> Dashboard:
    team_var = query_variable("team", "Team", TEAM_VAR_QUERY, multi=True, include_all=True, refresh_on_time=True)
    items: list[Panel | Row] = [
        Row("Totals"),
        stat("Wasted GPU-hours", Query(
            f"SELECT coalesce({WASTED}, 0) AS wasted_gpu_hours FROM grafana_flags WHERE {SELECTED_FLAGS}",
            ("wasted_gpu_hours",), "table"), decimals=1, w=6),
        stat("Allocated GPU-hours", Query(
            f"""
            SELECT coalesce(sum(allocated_gpu_hours * {JOB_RANGE_FRACTION}), 0) AS allocated_gpu_hours
            FROM grafana_jobs WHERE {SELECTED_JOBS}
            """, ("allocated_gpu_hours",), "table"), decimals=1, w=6,
            description="From the job reports, prorated to the range."),
        stat("Waste share", Query(
            f"""
            SELECT (SELECT coalesce({WASTED}, 0) FROM grafana_flags WHERE {SELECTED_FLAGS})
                 / nullif((SELECT sum(allocated_gpu_hours * {JOB_RANGE_FRACTION})
                           FROM grafana_jobs WHERE {SELECTED_JOBS}), 0) AS waste_share
            """, ("waste_share",), "table"), unit="percentunit", decimals=1, w=6),
        stat("Jobs with findings", Query(
            f"SELECT count(DISTINCT job_pk) AS jobs FROM grafana_flags WHERE {SELECTED_FLAGS}",
            ("jobs",), "table"), w=6),
        Row("GPU-time ledger"),
        # The stored per-minute ledger (docs/goodput.md): every allocated GPU-second once, so the
        # categories add up to the allocation and coverage is observed over allocated.
        stat("Ledger goodput (productive / observed)", Query(
            f"""
            SELECT sum(l.gpu_s) FILTER (WHERE l.category = 'productive')
                 / nullif(sum(l.gpu_s) FILTER (WHERE l.category <> 'unobserved'), 0) AS goodput
            FROM gpu_ledger l JOIN grafana_jobs j ON j.job_pk = l.job_pk
            WHERE {LEDGER_SELECTED}
            """, ("goodput",), "table"), unit="percentunit", decimals=1, w=6,
            description="Productive over observed GPU time, from the stored ledger."),
        stat("Ledger coverage (observed / allocated)", Query(
            f"""
            SELECT sum(l.gpu_s) FILTER (WHERE l.category <> 'unobserved') / nullif(sum(l.gpu_s), 0) AS coverage
            FROM gpu_ledger l JOIN grafana_jobs j ON j.job_pk = l.job_pk
            WHERE {LEDGER_SELECTED}
            """, ("coverage",), "table"), unit="percentunit", decimals=1, w=6,
            description="Allocated time with telemetry or progress; the rest is unknown, not waste."),
        piechart("Allocated GPU-hours by ledger category", Query(
            f"""
            SELECT l.category, sum(l.gpu_s) / 3600.0 AS gpu_hours
            FROM gpu_ledger l JOIN grafana_jobs j ON j.job_pk = l.job_pk
            WHERE {LEDGER_SELECTED}
            GROUP BY l.category ORDER BY 2 DESC
            """, ("category", "gpu_hours"), "table"), w=12,
            description="Every category of the ledger, the serving causes (slo_missed, idle_replica, "
                        "overprovisioned_deployment) included."),
        # Serving waste beside training waste (docs/serving.md, "Ledger"): a job is a serving
        # replica when it has replica-minutes in the range, as the fleet page splits it.
        table("Wasted GPU-hours by workload and cause", Query(
            f"""
            SELECT CASE WHEN r.job_pk IS NULL THEN 'training' ELSE 'serving' END AS workload,
                   l.category AS cause, sum(l.gpu_s) / 3600.0 AS wasted_gpu_hours
            FROM gpu_ledger l JOIN grafana_jobs j ON j.job_pk = l.job_pk
            LEFT JOIN (SELECT DISTINCT gj.job_pk FROM serving_minutes s
                       JOIN grafana_jobs gj ON gj.cluster = s.cluster AND gj.job_id = s.job_id
                       WHERE s.minute >= $__unixEpochFrom() AND s.minute < $__unixEpochTo()) r
              ON r.job_pk = l.job_pk
            WHERE {LEDGER_SELECTED} AND l.category NOT IN ('productive', 'unobserved')
            GROUP BY 1, 2 ORDER BY 1 DESC, 3 DESC
            """, ("workload", "cause", "wasted_gpu_hours"), "table"), w=12,
            overrides=[column_unit("wasted_gpu_hours", "none")],
            description="The ledger's badput of the range: serving replicas' jobs (replica-minutes in the "
                        "range) and every other job (training), by cause."),
        Row("Who and why"),
        barchart("Wasted GPU-hours by team", Query(
            f"""
            SELECT team, {WASTED} AS wasted_gpu_hours
            FROM grafana_flags WHERE {SELECTED_FLAGS}
            GROUP BY team ORDER BY 2 DESC LIMIT 30
            """, ("team", "wasted_gpu_hours"), "table"), w=12),
        piechart("Wasted GPU-hours by cause", Query(
            f"""
            SELECT cause, {WASTED} AS wasted_gpu_hours
            FROM grafana_flags WHERE {SELECTED_FLAGS}
            GROUP BY cause ORDER BY 2 DESC
            """, ("cause", "wasted_gpu_hours"), "table"), w=12),
        # Each day gets the part of every finding that fell inside it.
        timeseries("Wasted GPU-hours per day by cause", [Query(
            """
            SELECT d.day::float8 AS time, f.cause AS metric,
                   sum(f.wasted_gpu_hours * grafana_overlap(f.start_ts, f.end_ts, d.day, d.day + 86400))
                     AS wasted_gpu_hours
            FROM generate_series(floor($__unixEpochFrom() / 86400.0) * 86400, $__unixEpochTo(), 86400) AS d(day)
            JOIN grafana_flags f ON f.end_ts >= d.day AND f.start_ts < d.day + 86400
            WHERE f.cluster IN ($cluster) AND f.team IN ($team)
              AND f.end_ts >= $__unixEpochFrom() AND f.start_ts <= $__unixEpochTo()
            GROUP BY 1, 2
            ORDER BY 1
            """, ("time", "metric", "wasted_gpu_hours"))], w=24, stack=True, min=0),
        table("Team × cause", Query(
            f"""
            SELECT team, cause, {WASTED} AS wasted_gpu_hours, count(DISTINCT job_pk) AS jobs,
                   count(DISTINCT username) AS users
            FROM grafana_flags WHERE {SELECTED_FLAGS}
            GROUP BY team, cause ORDER BY 3 DESC
            """, ("team", "cause", "wasted_gpu_hours", "jobs", "users"), "table"), w=12, h=10),
        table("Top users", Query(
            f"""
            SELECT username, team, {WASTED} AS wasted_gpu_hours, count(DISTINCT job_pk) AS jobs,
                   string_agg(DISTINCT cause, ', ') AS causes
            FROM grafana_flags WHERE {SELECTED_FLAGS}
            GROUP BY username, team ORDER BY 3 DESC LIMIT 30
            """, ("username", "team", "wasted_gpu_hours", "jobs", "causes"), "table"), w=12, h=10),
        table("Goodput by team", Query(
            f"""
            SELECT team, count(*) AS jobs,
                   sum(allocated_gpu_hours * {JOB_RANGE_FRACTION}) AS allocated_gpu_hours,
                   sum(goodput_score * allocated_gpu_hours) / nullif(sum(allocated_gpu_hours), 0) AS goodput
            FROM grafana_jobs WHERE {SELECTED_JOBS}
            GROUP BY team ORDER BY 3 DESC
            """, ("team", "jobs", "allocated_gpu_hours", "goodput"), "table"),
            overrides=[column_unit("goodput", "percentunit")],
            description="Goodput weighted by allocated GPU-hours, from the job reports."),
    ]
    return Dashboard(UID, "gpufleet: waste by team and cause",
                     "Wasted GPU-hours from gpufleet's goodput findings by team, cause and user.",
                     items, variables=[cluster_variable(), (team_var, TEAM_VAR_QUERY)], time_from="now-7d",
                     refresh="5m")

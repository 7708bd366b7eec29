"""Goodput from the jobs' own progress (docs/progress.md): one job's step rate, step time per
rank, tokens/s and where its time went, from the 10 s ``job_progress`` windows."""

from __future__ import annotations

from .builders import Dashboard, Panel, Query, Row, barchart, query_variable, stat, table, timeseries
from .common import cluster_variable

UID = "gpufleet-goodput"

# Jobs in the range, those that report progress first (the others show empty panels: their
# goodput is the hardware view of the job dashboard).
JOB_VAR_QUERY = Query(
    """
    SELECT j.job_pk AS __value,
           j.job_id || ' · ' || coalesce(j.username, '?') || ' · ' || coalesce(j.name, '') AS __text
    FROM grafana_jobs j
    WHERE j.cluster = '$cluster' AND j.start_ts <= $__unixEpochTo()
      AND coalesce(j.end_ts, 'infinity') >= $__unixEpochFrom()
    ORDER BY EXISTS (SELECT 1 FROM job_progress p WHERE p.job_pk = j.job_pk) DESC, j.start_ts DESC
    LIMIT 1000
    """, ("__value", "__text"), "table")


IN_RANGE = "job_pk = '$job' AND $__unixEpochFilter(start_ts)"
SPAN_CAUSES = ("init", "compile", "data_wait", "checkpoint_save", "checkpoint_load", "eval")


def _causes_sql() -> str:
    # Per rank, then the mean over ranks: wall seconds, as the API's goodput (approximate in
    # Grafana: restart_lost and idle need the process view the API computes).
    spans = "\n        UNION ALL ".join(
        f"SELECT '{k}' AS cause, sum(coalesce((spans->>'{k}')::float8, 0)) / count(DISTINCT rank) AS seconds "
        f"FROM job_progress WHERE {IN_RANGE}" for k in SPAN_CAUSES)
    return f"""
    SELECT cause, seconds FROM (
        SELECT 'productive' AS cause, sum(productive_s) / count(DISTINCT rank) AS seconds
        FROM job_progress WHERE {IN_RANGE}
        UNION ALL SELECT 'stalled (hung)', sum(stall_s) / count(DISTINCT rank) FROM job_progress WHERE {IN_RANGE}
        UNION ALL SELECT 'unfinished at a crash', sum(unfinished_s) / count(DISTINCT rank)
        FROM job_progress WHERE {IN_RANGE}
        UNION ALL {spans}
    ) c WHERE seconds > 0 ORDER BY seconds DESC
    """


def build() -> Dashboard:
    job_var = query_variable("job", "Job", JOB_VAR_QUERY, multi=False, include_all=False, refresh_on_time=True)
    items: list[Panel | Row] = [
        Row("Progress"),
        stat("Steps", Query(f"SELECT coalesce(sum(steps), 0) / greatest(count(DISTINCT rank), 1) AS steps "
                            f"FROM job_progress WHERE {IN_RANGE}", ("steps",), "table"), w=4,
             description="Optimizer steps per rank in the range."),
        stat("Productive share", Query(
            f"""
            SELECT sum(productive_s) / nullif(sum(end_ts - start_ts), 0) AS productive_share
            FROM job_progress WHERE {IN_RANGE}
            """, ("productive_share",), "table"), unit="percentunit", decimals=1, w=4,
            description="Productive step time over the windows the processes reported (the API's ETTR also "
                        "counts allocated time with no process running)."),
        stat("Ranks", Query(f"SELECT count(DISTINCT rank) AS ranks FROM job_progress WHERE {IN_RANGE}",
                            ("ranks",), "table"), w=4),
        stat("Restarts", Query(
            f"SELECT greatest(count(DISTINCT (host, pid)) - count(DISTINCT rank), 0) + coalesce(sum(restarts), 0) "
            f"AS restarts FROM job_progress WHERE {IN_RANGE}", ("restarts",), "table"), w=4),
        stat("Dropped events", Query(f"SELECT coalesce(max(dropped), 0) AS dropped FROM job_progress WHERE {IN_RANGE}",
                                     ("dropped",), "table"), w=4,
             description="Events the client could not deliver (buffer full, no agent listening)."),
        stat("Since last step", Query(
            "SELECT min(since_step_s) AS since_step_s FROM job_progress WHERE job_pk = '$job' "
            "AND end_ts = (SELECT max(end_ts) FROM job_progress WHERE job_pk = '$job')", ("since_step_s",),
            "table"), unit="s", w=4, description="Newest window: the freshest rank's time since its last step."),
        timeseries("Step time p50 per rank", [Query(
            f"""
            SELECT $__unixEpochGroupAlias(start_ts, $__interval), 'rank ' || rank AS metric,
                   avg(step_time_p50_s) AS step_time_p50_s
            FROM job_progress WHERE {IN_RANGE} AND step_time_p50_s IS NOT NULL
            GROUP BY 1, 2
            ORDER BY 1
            """, ("time", "metric", "step_time_p50_s"))], unit="s", min=0, w=12,
            description="A rank above its peers is a slow rank; all rising together is a regression."),
        timeseries("Steps per second", [Query(
            f"""
            SELECT $__unixEpochGroupAlias(start_ts, $__interval), sum(steps) / greatest(count(DISTINCT rank), 1)
                   / max(end_ts - start_ts) AS steps_per_s
            FROM job_progress WHERE {IN_RANGE}
            GROUP BY 1
            ORDER BY 1
            """, ("time", "steps_per_s"))], min=0, w=12),
        timeseries("Tokens per second", [Query(
            f"""
            SELECT $__unixEpochGroupAlias(start_ts, $__interval), sum(tokens) / max(end_ts - start_ts) AS tokens_per_s
            FROM job_progress WHERE {IN_RANGE}
            GROUP BY 1
            ORDER BY 1
            """, ("time", "tokens_per_s"))], min=0, w=12),
        barchart("Where the time went (seconds per rank)", Query(_causes_sql(), ("cause", "seconds"), "table"),
                 unit="s", w=12),
        table("Ranks", Query(
            f"""
            SELECT rank, max(host) AS host, max(gpu) AS gpu, sum(steps) AS steps,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY step_time_p50_s) AS step_time_p50_s,
                   sum(stall_s) AS stall_s, max(last_step) AS last_step
            FROM job_progress WHERE {IN_RANGE}
            GROUP BY rank
            ORDER BY step_time_p50_s DESC NULLS LAST
            """, ("rank", "host", "gpu", "steps", "step_time_p50_s", "stall_s", "last_step"), "table"), h=8,
            description="Slowest rank first."),
    ]
    return Dashboard(UID, "gpufleet: goodput from progress",
                     "One job's own progress: step time per rank, step rate, tokens/s and where its time went.",
                     items, variables=[cluster_variable(multi=False), (job_var, JOB_VAR_QUERY)], time_from="now-6h")

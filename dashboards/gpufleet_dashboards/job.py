"""Job drilldown: one job's goodput report, findings, per-GPU series and every catalog field."""

from __future__ import annotations

from gpufleet.catalog import CATALOG

from .builders import Dashboard, Panel, Query, Row, query_variable, stat, table, timeseries
from .common import cluster_variable, describe, time_agg, unit_of

UID = "gpufleet-job"

# Series worth seeing per GPU (stragglers, memory imbalance); the rest are per job below.
PER_GPU_FIELDS = ("sm_active", "tensor_active", "fb_used_bytes", "power_w")

JOB_VAR_QUERY = Query(
    """
    SELECT job_pk AS __value,
           job_id || ' · ' || coalesce(username, '?') || ' · ' || coalesce(name, '') AS __text
    FROM grafana_jobs
    WHERE cluster = '$cluster' AND start_ts <= $__unixEpochTo()
      AND coalesce(end_ts, 'infinity') >= $__unixEpochFrom()
    ORDER BY start_ts DESC
    LIMIT 1000
    """, ("__value", "__text"), "table")


def _per_gpu(field: str) -> Panel:
    f = CATALOG[field]
    return timeseries(f"{field} per GPU", [Query(
        f"""
        SELECT $__unixEpochGroupAlias(s.bucket, $__interval), g.gpu_label AS metric,
               {time_agg(f)}(s.{field}) AS {field}
        FROM gpu_samples_1m s JOIN grafana_gpus g ON g.gpu_id = s.gpu_pk
        WHERE s.job_pk = '$job' AND $__unixEpochFilter(s.bucket)
        GROUP BY 1, 2
        ORDER BY 1
        """, ("time", "metric", field))],
        unit=unit_of(f), min=0, max=1 if f.unit == "ratio" else None, description=describe(f))


def _job_field(field: str) -> Panel:
    f = CATALOG[field]
    return timeseries(field, [Query(
        f"""
        SELECT $__unixEpochGroupAlias(bucket, $__interval), {time_agg(f)}({field}) AS {field}
        FROM job_samples_1m
        WHERE job_pk = '$job' AND $__unixEpochFilter(bucket)
        GROUP BY 1
        ORDER BY 1
        """, ("time", field))],
        unit=unit_of(f), w=6, h=6, min=0 if f.min >= 0 else None, max=1 if f.unit == "ratio" else None,
        description=describe(f))


def build() -> Dashboard:
    job_var = query_variable("job", "Job", JOB_VAR_QUERY, multi=False, include_all=False, refresh_on_time=True)
    items: list[Panel | Row] = [
        Row("Report"),
        stat("Goodput score", Query(
            "SELECT goodput_score FROM grafana_jobs WHERE job_pk = '$job'", ("goodput_score",), "table"),
            unit="percentunit", decimals=0,
            description="The goodput engine's score for the job (1 = every allocated GPU-hour used well)."),
        stat("Allocated GPU-hours", Query(
            "SELECT allocated_gpu_hours FROM grafana_jobs WHERE job_pk = '$job'",
            ("allocated_gpu_hours",), "table"), decimals=1),
        stat("Wasted GPU-hours", Query(
            "SELECT wasted_gpu_hours FROM grafana_jobs WHERE job_pk = '$job'", ("wasted_gpu_hours",), "table"),
            decimals=1),
        stat("GPUs", Query(
            "SELECT count(DISTINCT gpu_pk) AS gpus FROM allocations WHERE job_pk = '$job'", ("gpus",), "table")),
        stat("Tensor active (mean)", Query(
            """
            SELECT avg(tensor_active) AS tensor_active
            FROM job_samples_1m
            WHERE job_pk = '$job' AND $__unixEpochFilter(bucket)
            """, ("tensor_active",), "table"), unit="percentunit", decimals=1,
            description="Tensor pipe activity; times the GPU's peak dense tensor throughput it estimates MFU."),
        stat("Runtime", Query(
            """
            SELECT coalesce(end_ts, last_sample_ts, $__unixEpochTo()) - start_ts AS runtime_s
            FROM grafana_jobs WHERE job_pk = '$job'
            """, ("runtime_s",), "table"), unit="s"),
        table("Job", Query(
            """
            SELECT cluster, job_id, username, name, team, partition, namespace, source, state,
                   to_timestamp(start_ts) AS started, to_timestamp(end_ts) AS ended, num_nodes
            FROM grafana_jobs
            WHERE job_pk = '$job'
            """, ("cluster", "job_id", "username", "name", "team", "partition", "namespace", "source", "state",
                  "started", "ended", "num_nodes"), "table"), h=4),
        table("Findings", Query(
            """
            SELECT kind AS cause, severity, scope, wasted_gpu_hours, to_timestamp(start_ts) AS since,
                   to_timestamp(end_ts) AS until, open, suggestion
            FROM flags
            WHERE job_pk = '$job'
            ORDER BY wasted_gpu_hours DESC
            """, ("cause", "severity", "scope", "wasted_gpu_hours", "since", "until", "open", "suggestion"),
            "table"), h=7,
            description="Goodput findings (flags) with the engine's suggestion for each."),
        Row("Per GPU"),
        *[_per_gpu(name) for name in PER_GPU_FIELDS if name in CATALOG],
        table("Events on the job's GPUs", Query(
            """
            SELECT to_timestamp(e.ts) AS time, g.gpu_label AS gpu, e.kind, e.code, e.message
            FROM events e JOIN grafana_gpus g ON g.gpu_id = e.gpu_pk
            WHERE e.node_id IN (SELECT DISTINCT g2.node_id FROM allocations a
                                JOIN grafana_gpus g2 ON g2.gpu_id = a.gpu_pk WHERE a.job_pk = '$job')
              AND e.gpu_pk IN (SELECT gpu_pk FROM allocations WHERE job_pk = '$job')
              AND $__unixEpochFilter(e.ts)
            ORDER BY e.ts DESC
            LIMIT 200
            """, ("time", "gpu", "kind", "code", "message"), "table"), h=6),
        Row("Every catalog field (job aggregate)"),
        *[_job_field(f.name) for f in CATALOG.fields],
    ]
    return Dashboard(UID, "gpufleet: job drilldown",
                     "One job: goodput report, findings, per-GPU series and every catalog field.",
                     items, variables=[cluster_variable(multi=False), (job_var, JOB_VAR_QUERY)],
                     time_from="now-24h")

"""Fleet overview: how busy the fleet is, where GPU-hours go, which jobs to look at first."""

from __future__ import annotations

from gpufleet.catalog import CATALOG

from .builders import Dashboard, Panel, Query, Row, column_link, stat, table, timeseries
from .common import (
    FLEET_UNITS,
    GPUS_IN_CLUSTERS,
    JOB_URL,
    OVERLAPS_RANGE,
    RANGE_FRACTION,
    cluster_variable,
    fields_with_unit,
    unit_of,
)

UID = "gpufleet-fleet"


def _fleet_unit_panel(unit: str, title: str, across_gpus: str) -> Panel | None:
    fields = fields_with_unit(unit)
    if not fields:
        return None
    # Across GPUs within each minute first, then over the minutes of the interval: a sum of
    # power is the fleet's draw, not the sum over every minute of the interval.
    over_time = "max" if across_gpus == "max" else "avg"
    inner = ",\n    ".join(f"{across_gpus}({f.name}) AS {f.name}" for f in fields)
    outer = ",\n  ".join(f"{over_time}({f.name}) AS {f.name}" for f in fields)
    sql = f"""
        SELECT time,
          {outer}
        FROM (
          SELECT $__unixEpochGroupAlias(bucket, $__interval), bucket,
            {inner}
          FROM gpu_samples_1m
          WHERE $__unixEpochFilter(bucket) AND gpu_pk = {GPUS_IN_CLUSTERS}
          GROUP BY 1, 2
        ) per_minute
        GROUP BY 1
        ORDER BY 1
    """
    names = ", ".join(f.name for f in fields)
    return timeseries(
        title, [Query(sql, ("time", *(f.name for f in fields)))],
        unit=unit_of(fields[0]), w=24 if unit == "ratio" else 12, h=9 if unit == "ratio" else 8,
        min=0, max=1 if unit == "ratio" else None,
        description=f"Catalog fields in {unit}: {names}. From the 1-minute rollups.")


def build() -> Dashboard:
    activity = "sm_active" if "sm_active" in CATALOG else "gpu_util"
    items: list[Panel | Row] = [
        Row("Now"),
        stat("GPUs reporting", Query(
            """
            SELECT count(*) AS gpus
            FROM grafana_gpus
            WHERE cluster IN ($cluster) AND last_seen >= $__unixEpochTo() - 300
            """, ("gpus",), "table"),
            description="GPUs that sent a sample in the 5 minutes before the end of the range."),
        stat("Nodes silent > 5 min", Query(
            """
            SELECT count(*) AS nodes
            FROM nodes n JOIN clusters c ON c.id = n.cluster_id
            WHERE c.name IN ($cluster) AND (n.last_seen IS NULL OR n.last_seen < $__unixEpochTo() - 300)
            """, ("nodes",), "table"),
            description="Nodes whose agent has not reported for 5 minutes: see the node health dashboard."),
        stat("Running jobs", Query(
            """
            SELECT count(*) AS jobs
            FROM jobs j JOIN clusters c ON c.id = j.cluster_id
            WHERE j.state = 'running' AND c.name IN ($cluster)
            """, ("jobs",), "table")),
        stat(f"{activity} (fleet mean)", Query(
            f"""
            SELECT avg({activity}) AS {activity}
            FROM gpu_samples_1m
            WHERE $__unixEpochFilter(bucket) AND gpu_pk = {GPUS_IN_CLUSTERS}
            """, (activity,), "table"), unit="percentunit", decimals=1,
            description=CATALOG[activity].description),
        stat("Wasted GPU-hours", Query(
            f"""
            SELECT coalesce(sum(wasted_gpu_hours * {RANGE_FRACTION}), 0) AS wasted_gpu_hours
            FROM grafana_flags
            WHERE cluster IN ($cluster) AND {OVERLAPS_RANGE}
            """, ("wasted_gpu_hours",), "table"), decimals=1,
            description="GPU-hours lost to the goodput findings, prorated to the time range."),
        stat("Open findings", Query(
            """
            SELECT count(*) AS open_flags
            FROM grafana_flags
            WHERE cluster IN ($cluster) AND open
            """, ("open_flags",), "table")),
        Row("Allocation"),
        timeseries("GPUs reporting, allocated, allocated but idle", [Query(
            f"""
            SELECT time, avg(reporting) AS reporting, avg(allocated) AS allocated,
                   avg(allocated_idle) AS allocated_idle
            FROM (
              SELECT $__unixEpochGroupAlias(bucket, $__interval), bucket,
                     count(*) AS reporting,
                     count(job_pk) AS allocated,
                     count(*) FILTER (WHERE job_pk IS NOT NULL AND coalesce({activity}, 0) < 0.05) AS allocated_idle
              FROM gpu_samples_1m
              WHERE $__unixEpochFilter(bucket) AND gpu_pk = {GPUS_IN_CLUSTERS}
              GROUP BY 1, 2
            ) per_minute
            GROUP BY 1
            ORDER BY 1
            """, ("time", "reporting", "allocated", "allocated_idle"))],
            unit="short", min=0,
            description=f"Allocated but idle: a job holds the GPU and {activity} is below 5%."),
        timeseries(f"{activity} by cluster", [Query(
            f"""
            SELECT x.time, c.name AS metric, x.{activity}
            FROM (
              SELECT $__unixEpochGroupAlias(s.bucket, $__interval), n.cluster_id, avg(s.{activity}) AS {activity}
              FROM gpu_samples_1m s JOIN gpus g ON g.id = s.gpu_pk JOIN nodes n ON n.id = g.node_id
              WHERE $__unixEpochFilter(s.bucket) AND s.gpu_pk = {GPUS_IN_CLUSTERS}
              GROUP BY 1, 2
            ) x JOIN clusters c ON c.id = x.cluster_id
            ORDER BY 1, 2
            """, ("time", "metric", activity))],
            unit="percentunit", min=0, max=1),
        Row("Catalog fields across the fleet"),
    ]
    for unit, (title, across) in FLEET_UNITS.items():
        p = _fleet_unit_panel(unit, title, across)
        if p:
            items.append(p)
    items += [
        Row("Jobs to look at"),
        table("Top wasting jobs in range", Query(
            f"""
            SELECT cluster, job_id, username, team,
                   sum(wasted_gpu_hours * {RANGE_FRACTION}) AS wasted_gpu_hours,
                   string_agg(DISTINCT cause, ', ') AS causes, job_pk
            FROM grafana_flags
            WHERE cluster IN ($cluster) AND {OVERLAPS_RANGE}
            GROUP BY cluster, job_id, username, team, job_pk
            ORDER BY wasted_gpu_hours DESC
            LIMIT 20
            """, ("cluster", "job_id", "username", "team", "wasted_gpu_hours", "causes", "job_pk"), "table"),
            w=12, overrides=[column_link("job_id", "Job drilldown", JOB_URL)]),
        table("Running jobs with the lowest goodput", Query(
            """
            SELECT cluster, job_id, username, team, goodput_score, allocated_gpu_hours, wasted_gpu_hours,
                   to_timestamp(start_ts) AS started, job_pk
            FROM grafana_jobs
            WHERE cluster IN ($cluster) AND state = 'running' AND goodput_score IS NOT NULL
            ORDER BY goodput_score ASC
            LIMIT 20
            """, ("cluster", "job_id", "username", "team", "goodput_score", "allocated_gpu_hours",
                  "wasted_gpu_hours", "started", "job_pk"), "table"),
            w=12, overrides=[column_link("job_id", "Job drilldown", JOB_URL)]),
    ]
    return Dashboard(UID, "gpufleet: fleet overview",
                     "Fleet-wide GPU activity, allocation and waste from gpufleet's PostgreSQL rollups.",
                     items, variables=[cluster_variable()], time_from="now-6h")

"""What the four dashboards share: catalog groupings, SQL fragments, variables, links.

SQL conventions (see docs/grafana.md):
- times are epoch seconds, so filters use ``$__unixEpochFilter(col)`` and buckets
  ``$__unixEpochGroupAlias(col, $__interval)``: both compare the raw column, so indexes apply
  (``$__timeFilter(to_timestamp(col))`` would not);
- time series read the 1-minute rollups ``gpu_samples_1m`` / ``job_samples_1m``, never
  raw samples (compressed blocks that SQL cannot read);
- multi-value variables are used as ``IN ($var)`` (Grafana quotes each value); single-value
  ones as ``'$var'`` (Grafana doubles quotes inside), so a crafted URL cannot inject SQL.
"""

from __future__ import annotations

from typing import Any

from gpufleet.catalog import CATALOG, Field

from .builders import UNITS, Query, query_variable


def cluster_variable(multi: bool = True) -> tuple[dict[str, Any], Query]:
    q = Query("SELECT name FROM clusters ORDER BY 1", ("name",), "table")
    return query_variable("cluster", "Cluster", q, multi=multi, include_all=multi), q


# GPUs of the selected clusters, as ``gpu_pk = {GPUS_IN_CLUSTERS}``. ANY(ARRAY(subquery)) runs
# the subquery once and filters rollup rows while scanning them; "gpu_pk IN (subquery)" makes
# a hash semi-join over every row in the range, 3-5x slower on fleet-wide panels.
GPUS_IN_CLUSTERS = "ANY(ARRAY(SELECT gpu_id FROM grafana_gpus WHERE cluster IN ($cluster)))"

RANGE_FRACTION = "grafana_overlap(start_ts, end_ts, $__unixEpochFrom(), $__unixEpochTo())"
OVERLAPS_RANGE = "end_ts >= $__unixEpochFrom() AND start_ts <= $__unixEpochTo()"

JOB_URL = "/d/gpufleet-job/gpufleet-job-drilldown?var-cluster=${__data.fields.cluster}" \
          "&var-job=${__data.fields.job_pk}&${__url_time_range}"

# Health counters live on the node dashboard; "count" fields are monotonic, so a range shows
# their increase (max - min) rather than their value.
HEALTH_UNITS = ("count", "xid", "bool")

# How fleet-wide panels combine GPUs, per unit (fields of other units appear per job/node only).
FLEET_UNITS: dict[str, tuple[str, str]] = {
    "ratio": ("Activity (fleet mean of GPUs)", "avg"),
    "bytes/s": ("PCIe, NVLink and InfiniBand throughput (fleet total)", "sum"),
    "W": ("Power (fleet total)", "sum"),
    "bytes": ("GPU memory (fleet total)", "sum"),
    "C": ("Temperature (hottest GPU)", "max"),
    "MHz": ("Clocks (fleet mean)", "avg"),
}


def unit_of(f: Field) -> str:
    return UNITS.get(f.unit, "none")


def fields_with_unit(unit: str) -> list[Field]:
    return [f for f in CATALOG.fields if f.unit == unit]


def time_agg(f: Field) -> str:
    """How to fold 1-minute buckets into a longer interval: the catalog's rollup, in SQL."""
    return {"mean": "avg", "max": "max", "last": "max", "sum_rate": "avg"}[f.rollup]


def describe(f: Field) -> str:
    dcgm = f" DCGM: {', '.join(f.dcgm)}." if f.dcgm else ""
    return f"{f.description} Unit: {f.unit}. Catalog field `{f.name}` ({f.rollup} per minute).{dcgm}"

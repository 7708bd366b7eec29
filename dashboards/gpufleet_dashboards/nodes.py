"""Node health: silent agents, hardware counters (XID, ECC, row remap, NVLink, PCIe), heat,
throttling and the event log, per node."""

from __future__ import annotations

from gpufleet.catalog import CATALOG, Field

from .builders import Dashboard, Panel, Query, Row, query_variable, stat, table, timeseries
from .common import HEALTH_UNITS, cluster_variable, describe, unit_of

UID = "gpufleet-nodes"

NODE_VAR_QUERY = Query(
    """
    SELECT n.name AS node
    FROM nodes n JOIN clusters c ON c.id = n.cluster_id
    WHERE c.name IN ($cluster)
    ORDER BY 1
    """, ("node",), "table")

# As common.GPUS_IN_CLUSTERS: used as ``gpu_pk = {SELECTED_GPUS}``.
SELECTED_GPUS = "ANY(ARRAY(SELECT gpu_id FROM grafana_gpus WHERE cluster IN ($cluster) AND node IN ($node)))"

# Clock event reasons that mean the hardware slowed the GPU down: HW slowdown 0x8,
# SW thermal 0x20, HW thermal 0x40, power brake 0x80 (idle 0x1 and SW power cap 0x4 are not).
HW_THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80


def health_fields() -> list[Field]:
    return [f for f in CATALOG.fields if f.unit in HEALTH_UNITS]


def _per_gpu_health(f: Field) -> str:
    # Monotonic counters: what happened in the range. Last-value fields: the worst seen.
    if f.unit == "count":
        return f"max({f.name}) - min({f.name}) AS {f.name}"
    return f"max({f.name}) AS {f.name}"


def _per_node_health(f: Field) -> str:
    return f"{'sum' if f.unit == 'count' else 'max'}(s.{f.name}) AS {f.name}"


def _health_table() -> Panel:
    fields = health_fields()
    per_gpu = ",\n    ".join(_per_gpu_health(f) for f in fields)
    per_node = ",\n  ".join(_per_node_health(f) for f in fields)
    sql = f"""
        WITH s AS (
          SELECT gpu_pk, max(temp_c) AS max_temp_c,
            {per_gpu}
          FROM gpu_samples_1m
          WHERE $__unixEpochFilter(bucket) AND gpu_pk = {SELECTED_GPUS}
          GROUP BY gpu_pk
        )
        SELECT g.cluster, g.node, count(*) AS gpus, min(g.model) AS model, min(g.agent_version) AS agent,
          $__unixEpochTo() - max(g.node_last_seen) AS silent_s,
          max(s.max_temp_c) AS max_temp_c,
          {per_node}
        FROM grafana_gpus g LEFT JOIN s ON s.gpu_pk = g.gpu_id
        WHERE g.cluster IN ($cluster) AND g.node IN ($node)
        GROUP BY g.cluster, g.node
        ORDER BY silent_s DESC, g.node
    """
    cols = ("cluster", "node", "gpus", "model", "agent", "silent_s", "max_temp_c", *(f.name for f in fields))
    return table("Node health in range", Query(sql, cols, "table"), h=10,
                 description="Per node over the range: seconds since the agent last reported, hottest GPU, "
                             "worst XID and row-remap state, and how much each error counter grew ("
                             + ", ".join(f.name for f in fields) + ").")


def _per_node_series(title: str, expr: str, column: str, unit: str, description: str = "") -> Panel:
    return timeseries(title, [Query(
        f"""
        SELECT x.time, n.name AS metric, x.{column}
        FROM (
          SELECT $__unixEpochGroupAlias(s.bucket, $__interval), g.node_id, {expr} AS {column}
          FROM gpu_samples_1m s JOIN gpus g ON g.id = s.gpu_pk
          WHERE $__unixEpochFilter(s.bucket) AND s.gpu_pk = {SELECTED_GPUS}
          GROUP BY 1, 2
        ) x JOIN nodes n ON n.id = x.node_id
        ORDER BY 1, 2
        """, ("time", "metric", column))], unit=unit, min=0, description=description)


def build() -> Dashboard:
    node_var = query_variable("node", "Node", NODE_VAR_QUERY, multi=True, include_all=True)
    items: list[Panel | Row] = [
        Row("Status"),
        stat("Nodes", Query(
            """
            SELECT count(*) AS nodes FROM nodes n JOIN clusters c ON c.id = n.cluster_id
            WHERE c.name IN ($cluster) AND n.name IN ($node)
            """, ("nodes",), "table")),
        stat("Silent > 5 min", Query(
            """
            SELECT count(*) AS nodes FROM nodes n JOIN clusters c ON c.id = n.cluster_id
            WHERE c.name IN ($cluster) AND n.name IN ($node)
              AND (n.last_seen IS NULL OR n.last_seen < $__unixEpochTo() - 300)
            """, ("nodes",), "table")),
        stat("GPUs with hardware errors", Query(
            f"""
            SELECT count(DISTINCT gpu_pk) AS gpus
            FROM gpu_samples_1m
            WHERE $__unixEpochFilter(bucket) AND gpu_pk = {SELECTED_GPUS}
              AND (coalesce(xid_last, 0) > 0 OR coalesce(row_remap_failure, 0) > 0 OR coalesce(ecc_dbe_volatile, 0) > 0)
            """, ("gpus",), "table"),
            description="GPUs that reported an XID, an uncorrectable ECC error or a row-remap failure in the range."),
        stat("Events in range", Query(
            """
            SELECT count(*) AS events
            FROM events e JOIN nodes n ON n.id = e.node_id JOIN clusters c ON c.id = n.cluster_id
            WHERE c.name IN ($cluster) AND n.name IN ($node) AND $__unixEpochFilter(e.ts)
            """, ("events",), "table")),
        _health_table(),
        Row("Heat, power, clocks"),
        _per_node_series("Hottest GPU per node", "max(s.temp_c)", "temp_c", "celsius",
                         describe(CATALOG["temp_c"])),
        _per_node_series("Power per node", "sum(s.power_w) / greatest(count(DISTINCT s.bucket), 1)", "power_w",
                         "watt", "Mean board power summed over the node's GPUs."),
        _per_node_series("SM clock per node (mean)", "avg(s.sm_clock_mhz)", "sm_clock_mhz", "suffix: MHz",
                         describe(CATALOG["sm_clock_mhz"])),
        _per_node_series("GPUs slowed by hardware or thermal limits",
                         f"count(DISTINCT s.gpu_pk) FILTER (WHERE (s.clock_event_reasons & {HW_THROTTLE_MASK}) <> 0)",
                         "throttled_gpus", "short",
                         "GPUs whose clock event reasons include HW slowdown, SW/HW thermal or power brake."),
        Row("Error counters"),
        *[_per_node_series(f.name, f"max(s.{f.name})", f.name, unit_of(f), describe(f)) for f in health_fields()],
        Row("Events"),
        table("Events", Query(
            """
            SELECT to_timestamp(e.ts) AS time, c.name AS cluster, n.name AS node, g."index" AS gpu,
                   e.kind, e.code, e.message
            FROM events e
            JOIN nodes n ON n.id = e.node_id
            JOIN clusters c ON c.id = n.cluster_id
            LEFT JOIN gpus g ON g.id = e.gpu_pk
            WHERE c.name IN ($cluster) AND n.name IN ($node) AND $__unixEpochFilter(e.ts)
            ORDER BY e.ts DESC
            LIMIT 500
            """, ("time", "cluster", "node", "gpu", "kind", "code", "message"), "table"), h=10),
    ]
    return Dashboard(UID, "gpufleet: node health",
                     "Per-node health: agents that went silent, XID/ECC/row-remap/NVLink/PCIe counters, "
                     "temperature, power, clocks and the event log.",
                     items, variables=[cluster_variable(), (node_var, NODE_VAR_QUERY)], time_from="now-6h")

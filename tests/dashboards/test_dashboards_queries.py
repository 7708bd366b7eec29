"""Every dashboard query, expanded as Grafana would (variables, then macros), run on a real
PostgreSQL holding a simulated day of a 128-GPU fleet, as Grafana's read-only role: each returns
rows with the expected columns. How fast they answer is measured by bench/dashboards/query_times.py
(which runs this module with GPUFLEET_QUERY_RUNS=3 and reads the times it records), not asserted."""

from __future__ import annotations

import os
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from .conftest import DASHBOARDS  # noqa: F401  (puts the generator package on sys.path)
from .grafana_sql import TimeRange, auto_interval, render

# Each query runs once in the suite; bench/dashboards/query_times.py asks for more runs.
RUNS = int(os.environ.get("GPUFLEET_QUERY_RUNS", "1"))


def _specs() -> list[Any]:
    from gpufleet_dashboards import queries

    return queries()


SPECS = _specs()


def _range(fleet: Any, time_from: str) -> TimeRange:
    span = {"now-6h": timedelta(hours=6), "now-24h": timedelta(hours=24), "now-7d": timedelta(days=7)}[time_from]
    end = datetime.fromtimestamp(fleet.now, UTC)
    return TimeRange(end - span, end)


def _timed(conn: Any, sql: str) -> tuple[list[str], list[tuple[Any, ...]], list[float]]:
    times = []
    cols: list[str] = []
    rows: list[tuple[Any, ...]] = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        cur = conn.execute(sql)
        rows = cur.fetchall()
        times.append(time.perf_counter() - t0)
        cols = [c.name for c in cur.description]
    return cols, rows, times


def _interesting_job(admin: Any) -> str:
    """The job a person would drill into: one with findings and a GPU event."""
    row = admin.execute(
        """
        SELECT j.id FROM jobs j
        WHERE EXISTS (SELECT 1 FROM flags f WHERE f.job_pk = j.id)
          AND EXISTS (SELECT 1 FROM events e JOIN allocations a ON a.gpu_pk = e.gpu_pk WHERE a.job_pk = j.id)
          AND j.cluster_id = (SELECT id FROM clusters WHERE name = 'alpha')
        ORDER BY j.start_ts DESC LIMIT 1
        """).fetchone()
    return str(row[0])


@pytest.fixture(scope="session")
def resolved(sim_fleet: tuple[str, Any], grafana_conn: Any) -> dict[str, Any]:
    """Per dashboard: its time range, $__interval and the variables' values, resolved the way
    Grafana does on load (each variable's query runs with the ones before it; include-All
    variables default to All; single-value ones to a chosen option)."""
    import psycopg
    from gpufleet_dashboards import dashboards

    dsn, fleet = sim_fleet
    with psycopg.connect(dsn, autocommit=True) as admin:
        job = _interesting_job(admin)
    out: dict[str, Any] = {}
    for d in dashboards():
        rng = _range(fleet, d.time_from)
        interval = auto_interval(rng.start, rng.end)
        values: dict[str, list[str]] = {}
        multi: dict[str, bool] = {}
        for var, q in d.variables:
            rows = grafana_conn.execute(render(q.sql, rng, interval, values, multi)).fetchall()
            options = [str(r[0]) for r in rows]
            assert options, f"{d.uid}: variable {var['name']} has no options"
            name = var["name"]
            multi[name] = bool(var["multi"] or var["includeAll"])
            if multi[name]:
                values[name] = options
            elif name == "job":
                assert job in options, "the job to drill into is not offered by the job variable"
                values[name] = [job]
            elif name == "cluster":
                values[name] = ["alpha"]
            else:
                values[name] = options[:1]
        out[d.uid] = (rng, interval, values, multi)
    return out


@pytest.mark.postgres
@pytest.mark.parametrize("spec", SPECS, ids=[f"{s.dashboard}/{s.where}/{s.ref_id}" for s in SPECS])
def test_query_returns_expected_columns(spec: Any, resolved: dict[str, Any], grafana_conn: Any,
                                             record_property: Any) -> None:
    rng, interval, values, multi = resolved[spec.dashboard]
    if spec.where.startswith("var:"):
        # a variable sees only the variables before it
        name = spec.where[4:]
        names = list(values)
        values = {n: values[n] for n in names[: names.index(name)]}
    sql = render(spec.query.sql, rng, interval, values, multi)
    cols, rows, times = _timed(grafana_conn, sql)
    record_property("ms", [round(t * 1000, 1) for t in times])
    assert cols == list(spec.query.columns), f"columns differ for:\n{sql}"
    assert rows, f"no rows from:\n{sql}"
    if spec.query.format == "time_series":
        stamps = [r[0] for r in rows]
        assert stamps == sorted(stamps), "time series rows must be sorted by time"
        assert rng.from_s - 86400 <= float(stamps[0]) and float(stamps[-1]) <= rng.to_s


@pytest.mark.postgres
def test_grafana_role_is_read_only_and_cannot_read_tokens(grafana_conn: Any) -> None:
    import psycopg

    assert grafana_conn.execute("SHOW transaction_read_only").fetchone()[0] == "on"
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        grafana_conn.execute("SELECT count(*) FROM api_tokens")
    with pytest.raises((psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.InsufficientPrivilege)):
        grafana_conn.execute("DELETE FROM jobs")


@pytest.mark.postgres
@pytest.mark.parametrize("title", ["Power (fleet total)", "Activity (fleet mean of GPUs)"])
def test_fleet_panels_read_only_the_range(title: str, sim_fleet: tuple[str, Any]) -> None:
    """A fleet-wide panel over 6 of the 24 simulated hours reads one daily partition of the
    rollup through an index, not every partition nor a full scan."""
    import psycopg
    from gpufleet_dashboards import fleet

    dsn, sim = sim_fleet
    d = fleet.build()
    spec = next(s for s in d.queries() if s.where == title)
    rng = _range(sim, d.time_from)
    sql = render(spec.query.sql, rng, 60, {"cluster": ["default", "alpha"]}, {"cluster": True})
    with psycopg.connect(dsn, autocommit=True) as c:
        plan = "\n".join(r[0] for r in c.execute("EXPLAIN " + sql).fetchall())
    tables = re.findall(r"(?<!Bitmap Index )Scan(?: using \S+)? on (gpu_samples_1m\w*)", plan)
    assert tables and "Seq Scan on gpu_samples_1m" not in plan, plan
    assert len(set(tables)) == 1, f"more than one partition read:\n{plan}"

"""The committed dashboards: generated from code, structurally valid Grafana JSON, every SQL
query well-formed for Grafana's PostgreSQL macro engine, reading rollups, covering the catalog."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpufleet.catalog import CATALOG

from .conftest import DASHBOARDS, REPO
from .grafana_sql import _VAR_RE, TimeRange, render

JSON_DIR = DASHBOARDS / "json"
FILES = sorted(JSON_DIR.glob("*.json"))

TARGET = {
    "type": "object",
    "required": ["refId", "datasource", "rawSql", "format", "rawQuery", "editorMode"],
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "rawSql": {"type": "string", "minLength": 10},
        "format": {"enum": ["time_series", "table"]},
        "rawQuery": {"const": True},
        "editorMode": {"const": "code"},
    },
}
GRID = {
    "type": "object",
    "required": ["x", "y", "w", "h"],
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 23},
                   "y": {"type": "integer", "minimum": 0},
                   "w": {"type": "integer", "minimum": 1, "maximum": 24},
                   "h": {"type": "integer", "minimum": 1}},
}
PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": ["row", "stat", "timeseries", "table", "barchart", "piechart"]},
        "title": {"type": "string", "minLength": 1},
        "gridPos": GRID,
    },
    "if": {"properties": {"type": {"not": {"const": "row"}}}},
    "then": {"required": ["datasource", "targets", "fieldConfig", "options"],
             "properties": {"targets": {"type": "array", "minItems": 1, "items": TARGET},
                            "fieldConfig": {"type": "object", "required": ["defaults", "overrides"]}}},
    "else": {"required": ["collapsed", "panels"]},
}
VARIABLE = {
    "type": "object",
    "required": ["name", "type", "datasource", "query", "refresh", "multi", "includeAll"],
    "properties": {"name": {"type": "string", "pattern": r"^[a-z_]+$"}, "type": {"const": "query"},
                   "refresh": {"enum": [1, 2]}},
}
DASHBOARD_SCHEMA = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time", "tags", "annotations"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "time": {"type": "object", "required": ["from", "to"]},
        "templating": {"type": "object", "required": ["list"],
                       "properties": {"list": {"type": "array", "items": VARIABLE}}},
        "panels": {"type": "array", "minItems": 1, "items": PANEL},
    },
}


def _load(p: Path) -> dict[str, Any]:
    return json.loads(p.read_text())


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in d["panels"] if p["type"] != "row"]


def _sqls(d: dict[str, Any]) -> list[tuple[str, str]]:
    out = [(f"var:{v['name']}", v["query"]) for v in d["templating"]["list"]]
    return out + [(p["title"], t["rawSql"]) for p in _panels(d) for t in p["targets"]]


def test_the_dashboards_are_committed_and_up_to_date() -> None:
    import generate  # dashboards/generate.py, on sys.path via conftest

    assert [p.name for p in FILES] == ["gpufleet-fleet.json", "gpufleet-goodput.json", "gpufleet-job.json",
                                       "gpufleet-nodes.json", "gpufleet-waste.json"]
    assert generate.stale() == [], "run: python dashboards/generate.py"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_dashboard_json_structure(path: Path) -> None:
    from gpufleet_dashboards import DATASOURCE_TYPE, DATASOURCE_UID

    d = _load(path)
    jsonschema.validate(d, DASHBOARD_SCHEMA)
    assert path.stem == d["uid"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    # No two panels overlap on the 24-column grid, and none sticks out of it.
    cells: dict[tuple[int, int], str] = {}
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
    for p in _panels(d):
        assert p["datasource"] == {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"]
    for v in d["templating"]["list"]:
        assert v["datasource"] == {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_queries_use_only_defined_variables_and_known_macros(path: Path) -> None:
    d = _load(path)
    names = [v["name"] for v in d["templating"]["list"]]
    rng = TimeRange(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC))
    for where, sql in _sqls(d):
        if where.startswith("var:"):
            # a variable may use only the variables defined before it
            own = where[4:]
            allowed = set(names[: names.index(own)])
        else:
            allowed = set(names)
        for m in _VAR_RE.finditer(sql):
            name = m.group(1) or m.group(2) or m.group(3)
            follows = sql[m.end():m.end() + 1]
            if name.startswith("__"):
                assert follows == "(" or name in ("__interval", "__interval_ms"), f"{where}: ${name}"
            else:
                assert name in allowed, f"{where}: ${name} is not a variable defined before it"
        values = {n: ["x"] for n in names}
        expanded = render(sql, rng, 300, values, {n: True for n in names})
        assert "$" not in expanded, f"{where}: left unexpanded: {expanded}"


def test_panel_queries_read_rollups_not_raw_samples() -> None:
    raw = re.compile(r"\bgpu_samples\b(?!_)")
    for p in FILES:
        for where, sql in _sqls(_load(p)):
            assert not raw.search(sql), f"{p.stem} / {where} reads raw gpu_samples; use gpu_samples_1m"


def test_every_time_series_query_returns_time_first_and_is_ordered() -> None:
    from gpufleet_dashboards import queries

    for q in queries():
        if q.query.format == "time_series":
            assert q.query.columns[0] == "time", q
            assert "ORDER BY 1" in q.query.sql, f"{q.dashboard}/{q.where}: Grafana needs time-sorted rows"


def test_every_catalog_field_has_a_job_panel_described_from_the_catalog() -> None:
    job = _load(JSON_DIR / "gpufleet-job.json")
    by_title = {p["title"]: p for p in _panels(job)}
    for f in CATALOG.fields:
        assert f.name in by_title, f"no job drilldown panel for catalog field {f.name}"
        p = by_title[f.name]
        assert f.description in p["description"]
        assert f.name in p["targets"][0]["rawSql"]


def test_links_point_at_dashboards_that_exist() -> None:
    uids = {_load(p)["uid"] for p in FILES}
    text = "".join(p.read_text() for p in FILES)
    for uid in re.findall(r"/d/([a-z0-9-]+)/", text):
        assert uid in uids


def test_helm_chart_carries_the_same_dashboards() -> None:
    chart = REPO / "helm" / "gpufleet" / "dashboards"
    assert sorted(p.name for p in chart.glob("*.json")) == [p.name for p in FILES]
    for p in FILES:
        assert (chart / p.name).read_text() == p.read_text()


def test_render_matches_grafana_macro_expansions() -> None:
    """The expander the query tests rely on, checked against Grafana's documented expansions."""
    start = datetime(2017, 7, 18, 11, 15, 52, tzinfo=UTC)
    rng = TimeRange(start, start + timedelta(hours=1))
    f, t = int(start.timestamp()), int(start.timestamp()) + 3600

    def r(sql: str, **values: list[str]) -> str:
        return render(sql, rng, 300, values, {"c": True, "j": False})

    assert r("$__timeFilter(time_col)") == \
        "time_col BETWEEN '2017-07-18T11:15:52Z' AND '2017-07-18T12:15:52Z'"
    assert r("$__timeGroupAlias(time_col, '5m')") == 'floor(extract(epoch from time_col)/300)*300 AS "time"'
    assert r("$__timeGroup(time_col, '1h', NULL)") == "floor(extract(epoch from time_col)/3600)*3600"
    assert r("SELECT $__timeGroup(c, '5m'), 1") == 'SELECT floor(extract(epoch from c)/300)*300 AS "time", 1'
    assert r("$__unixEpochFilter(ts)") == f"ts >= {f} AND ts <= {t}"
    assert r("$__unixEpochGroupAlias(bucket, $__interval)") == 'floor((bucket)/300)*300 AS "time"'
    assert r("$__unixEpochFrom() $__unixEpochTo() $__interval_ms") == f"{f} {t} 300000"
    assert r("$__time(c) $__timeEpoch(c)") == 'c AS "time" extract(epoch from c) as "time"'
    assert r("$__timeFrom() $__timeTo()") == "'2017-07-18T11:15:52Z' '2017-07-18T12:15:52Z'"
    assert r("IN ($c)", c=["a", "o'k"]) == "IN ('a','o''k')"
    assert r("= '$j' ${j} [[j]]", j=["o'k"]) == "= 'o''k' o''k o''k"
    with pytest.raises(ValueError, match="unknown macro"):
        r("$__nope(x)")

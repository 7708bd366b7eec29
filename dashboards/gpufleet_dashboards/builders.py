"""Small builders for Grafana dashboard JSON (schemaVersion 39, Grafana 10.4 / 11 / 12).

Plain dicts rather than grafana-foundation-sdk: the output is a handful of panel kinds, the
JSON is what gets reviewed and provisioned, and the generator stays dependency-free (it needs
only ``gpufleet.catalog``). Every query is recorded as a :class:`Query` with the columns it
must return, so tests can run each one against PostgreSQL and check the result's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATASOURCE_UID = "gpufleet-pg"
DATASOURCE_TYPE = "grafana-postgresql-datasource"
DATASOURCE = {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}
SCHEMA_VERSION = 39
GRID_WIDTH = 24
# The rollups hold one row per minute: a shorter $__interval only multiplies groups.
MIN_INTERVAL = "1m"
REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # a panel's queries are A, B, C, ...

# Grafana unit ids for catalog units (fields with other units show as plain numbers).
UNITS = {
    "ratio": "percentunit",
    "bytes": "bytes",
    "bytes/s": "Bps",
    "W": "watt",
    "J": "joule",
    "C": "celsius",
    "MHz": "suffix: MHz",
    "count": "short",
    "xid": "none",
    "bool": "bool",
    "bitmask": "hex0x",
}


@dataclass(frozen=True)
class Query:
    """One SQL query and the column names its result must have, in order."""

    sql: str
    columns: tuple[str, ...]
    format: str = "time_series"  # or "table"

    def target(self, ref_id: str) -> dict[str, Any]:
        return {
            "refId": ref_id,
            "datasource": DATASOURCE,
            "editorMode": "code",
            "format": self.format,
            "rawQuery": True,
            "rawSql": _dedent(self.sql),
        }


@dataclass(frozen=True)
class QuerySpec:
    """Where a query lives (for test ids and error messages) and what it must return."""

    dashboard: str
    where: str  # panel title or "var:<name>"
    ref_id: str
    query: Query


@dataclass
class Panel:
    title: str
    kind: str  # Grafana panel type
    queries: list[Query]
    w: int = 12
    h: int = 8
    description: str = ""
    unit: str | None = None
    min: float | None = None
    max: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)
    links: list[dict[str, Any]] = field(default_factory=list)
    overrides: list[dict[str, Any]] = field(default_factory=list)
    decimals: int | None = None


@dataclass
class Row:
    title: str
    collapsed: bool = False


def _dedent(sql: str) -> str:
    lines = [ln.rstrip() for ln in sql.strip("\n").splitlines()]
    indent = min((len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()), default=0)
    return "\n".join(ln[indent:] for ln in lines)


def query_variable(name: str, label: str, query: Query, *, multi: bool, include_all: bool,
                   refresh_on_time: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": _dedent(query.sql),
        "definition": _dedent(query.sql),
        # 1 = on dashboard load, 2 = on time range change (for queries using the time macros)
        "refresh": 2 if refresh_on_time else 1,
        "multi": multi,
        "includeAll": include_all,
        "current": {},
        "options": [],
        "sort": 0,
        "hide": 0,
        "skipUrlSync": False,
    }


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"custom": dict(p.custom)}
    if p.unit:
        defaults["unit"] = p.unit
    if p.min is not None:
        defaults["min"] = p.min
    if p.max is not None:
        defaults["max"] = p.max
    if p.decimals is not None:
        defaults["decimals"] = p.decimals
    if p.links:
        defaults["links"] = p.links
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "interval": MIN_INTERVAL,
        "gridPos": {"x": x, "y": y, "w": p.w, "h": p.h},
        "targets": [q.target(REF_IDS[i]) for i, q in enumerate(p.queries)],
        "fieldConfig": {"defaults": defaults, "overrides": p.overrides},
        "options": p.options,
    }


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    items: list[Panel | Row]
    variables: list[tuple[dict[str, Any], Query]] = field(default_factory=list)
    time_from: str = "now-6h"
    tags: tuple[str, ...] = ("gpufleet",)
    refresh: str = "1m"

    def to_json(self) -> dict[str, Any]:
        """Lay panels out left to right in rows of 24 columns; rows start a new line."""
        panels: list[dict[str, Any]] = []
        x = y = line_h = 0
        pid = 1
        for item in self.items:
            if isinstance(item, Row):
                if x:
                    y, x, line_h = y + line_h, 0, 0
                panels.append({"id": pid, "type": "row", "title": item.title, "collapsed": item.collapsed,
                               "gridPos": {"x": 0, "y": y, "w": GRID_WIDTH, "h": 1}, "panels": []})
                y += 1
            else:
                if x + item.w > GRID_WIDTH:
                    y, x, line_h = y + line_h, 0, 0
                panels.append(_panel_json(item, pid, x, y))
                x += item.w
                line_h = max(line_h, item.h)
            pid += 1
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": list(self.tags),
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "refresh": self.refresh,
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "fiscalYearStartMonth": 0,
            "liveNow": False,
            "weekStart": "",
            "annotations": {"list": []},
            "links": [{"title": "gpufleet", "type": "dashboards", "tags": ["gpufleet"], "asDropdown": True,
                       "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False,
                       "tooltip": "", "url": ""}],
            "templating": {"list": [v for v, _ in self.variables]},
            "panels": panels,
        }

    def queries(self) -> list[QuerySpec]:
        specs = [QuerySpec(self.uid, f"var:{v['name']}", "var", q) for v, q in self.variables]
        for item in self.items:
            if isinstance(item, Panel):
                specs += [QuerySpec(self.uid, item.title, REF_IDS[i], q) for i, q in enumerate(item.queries)]
        return specs


def stat(title: str, query: Query, *, unit: str | None = None, description: str = "", w: int = 4,
         decimals: int | None = None) -> Panel:
    return Panel(title, "stat", [query], w=w, h=4, description=description, unit=unit, decimals=decimals,
                 options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "colorMode": "value", "graphMode": "none", "justifyMode": "auto",
                          "textMode": "auto", "orientation": "auto"})


def timeseries(title: str, queries: list[Query], *, unit: str | None = None, description: str = "",
               w: int = 12, h: int = 8, min: float | None = None, max: float | None = None,
               stack: bool = False) -> Panel:
    custom: dict[str, Any] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                              "spanNulls": 120000, "axisSoftMin": 0}
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
        custom["fillOpacity"] = 60
    return Panel(title, "timeseries", queries, w=w, h=h, description=description, unit=unit, min=min, max=max,
                 custom=custom,
                 options={"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max"],
                                     "showLegend": True},
                          "tooltip": {"mode": "multi", "sort": "desc"}})


def table(title: str, query: Query, *, description: str = "", w: int = 24, h: int = 8,
          links: list[dict[str, Any]] | None = None, overrides: list[dict[str, Any]] | None = None) -> Panel:
    return Panel(title, "table", [query], w=w, h=h, description=description,
                 custom={"align": "auto", "filterable": True},
                 options={"showHeader": True, "cellHeight": "sm", "footer": {"show": False}},
                 links=links or [], overrides=overrides or [])


def barchart(title: str, query: Query, *, unit: str | None = None, description: str = "", w: int = 12,
             h: int = 8, stack: bool = False) -> Panel:
    return Panel(title, "barchart", [query], w=w, h=h, description=description, unit=unit,
                 custom={"fillOpacity": 80, "lineWidth": 1},
                 options={"orientation": "horizontal", "xTickLabelRotation": 0, "showValue": "auto",
                          "stacking": "normal" if stack else "none", "barWidth": 0.8, "groupWidth": 0.7,
                          "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                          "tooltip": {"mode": "multi", "sort": "desc"}})


def piechart(title: str, query: Query, *, unit: str | None = None, description: str = "", w: int = 12,
             h: int = 8) -> Panel:
    return Panel(title, "piechart", [query], w=w, h=h, description=description, unit=unit,
                 options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": True},
                          "pieType": "donut", "displayLabels": ["name", "percent"],
                          "legend": {"displayMode": "table", "placement": "right", "showLegend": True,
                                     "values": ["value", "percent"]},
                          "tooltip": {"mode": "single", "sort": "none"}})


def column_link(column: str, title: str, url: str) -> dict[str, Any]:
    """A field override that turns one table column into a link (e.g. to the job drilldown)."""
    return {"matcher": {"id": "byName", "options": column},
            "properties": [{"id": "links", "value": [{"title": title, "url": url}]}]}


def column_unit(column: str, unit: str) -> dict[str, Any]:
    return {"matcher": {"id": "byName", "options": column}, "properties": [{"id": "unit", "value": unit}]}

"""gpufleet's Grafana dashboards, generated from code and the metric catalog.

``build_all()`` returns every dashboard as Grafana JSON keyed by file name, and ``queries()``
every SQL query with the columns it must return (what tests/dashboards runs against PostgreSQL).
Regenerate the committed JSON with ``python dashboards/generate.py``.
"""

from __future__ import annotations

from typing import Any

from . import fleet, goodput, job, nodes, waste
from .builders import DATASOURCE_TYPE, DATASOURCE_UID, Dashboard, QuerySpec

__all__ = ["DATASOURCE_TYPE", "DATASOURCE_UID", "build_all", "dashboards", "queries"]


def dashboards() -> list[Dashboard]:
    return [fleet.build(), job.build(), nodes.build(), waste.build(), goodput.build()]


def build_all() -> dict[str, dict[str, Any]]:
    return {f"{d.uid}.json": d.to_json() for d in dashboards()}


def queries() -> list[QuerySpec]:
    return [q for d in dashboards() for q in d.queries()]

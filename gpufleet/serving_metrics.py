"""Serving metrics registry, loaded from ``serving_metrics.toml`` (data, not code).

Which inference-engine series (vLLM, SGLang, TGI, Triton, Dynamo) feed which gpufleet serving
measure, with their scale to the measure's unit. The exposition parser and minute fold live in
``serving_expo.py``; this module only reads and checks the table.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SERVING_METRICS_PATH = Path(__file__).with_name("serving_metrics.toml")

KINDS = ("histogram", "counter", "gauge")
UNITS = ("seconds", "tokens", "count", "ratio")
AGGS = ("sum", "mean")
FROMS = ("value", "sum")


@dataclass(frozen=True, slots=True)
class Measure:
    name: str
    kind: str
    unit: str
    agg: str
    meaning: str


@dataclass(frozen=True, slots=True)
class EngineMetric:
    name: str
    measure: str
    scale: float = 1.0
    source: str = "value"  # "sum": a counter read from a histogram's _sum
    buckets: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Engine:
    name: str
    docs: str
    metrics: tuple[EngineMetric, ...]

    def for_measure(self, measure: str) -> tuple[EngineMetric, ...]:
        """The engine's series for ``measure``, preferred first."""
        return tuple(m for m in self.metrics if m.measure == measure)


@dataclass(frozen=True, slots=True)
class ServingRegistry:
    measures: dict[str, Measure]
    engines: dict[str, Engine]

    def engine(self, name: str) -> Engine:
        try:
            return self.engines[name]
        except KeyError:
            raise KeyError(f"unknown serving engine {name!r}: one of {sorted(self.engines)}") from None


def parse_registry(text: str, where: str = "serving_metrics.toml") -> ServingRegistry:
    """Build the registry from TOML text; ValueError names the entry that is wrong."""
    raw = tomllib.loads(text)
    measures: dict[str, Measure] = {}
    for name, d in raw.get("measure", {}).items():
        for key, allowed in (("kind", KINDS), ("unit", UNITS), ("agg", AGGS)):
            if d.get(key) not in allowed:
                raise ValueError(f"{where}: measure {name}: {key} {d.get(key)!r} is not one of {list(allowed)}")
        measures[name] = Measure(name, d["kind"], d["unit"], d["agg"], str(d.get("meaning", "")))
    engines: dict[str, Engine] = {}
    for ename, d in raw.get("engine", {}).items():
        metrics = []
        seen: set[str] = set()
        for m in d.get("metric", []):
            label = f"{where}: engine {ename}: metric {m.get('name')!r}"
            if m.get("measure") not in measures:
                raise ValueError(f"{label}: measure {m.get('measure')!r} is not declared")
            source = m.get("from", "value")
            if source not in FROMS:
                raise ValueError(f"{label}: from {source!r} is not one of {list(FROMS)}")
            if source == "sum" and measures[m["measure"]].kind != "counter":
                raise ValueError(f"{label}: from = \"sum\" feeds only a counter measure")
            if m["name"] in seen:
                raise ValueError(f"{label}: listed twice")
            seen.add(m["name"])
            buckets = tuple(float(b) for b in m.get("buckets", ()))
            if list(buckets) != sorted(set(buckets)):
                raise ValueError(f"{label}: buckets must be strictly increasing")
            metrics.append(EngineMetric(m["name"], m["measure"], float(m.get("scale", 1.0)), source, buckets))
        if not d.get("docs"):
            raise ValueError(f"{where}: engine {ename}: docs (where the names were looked up) is required")
        engines[ename] = Engine(ename, str(d["docs"]), tuple(metrics))
    return ServingRegistry(measures, engines)


@cache
def serving_registry() -> ServingRegistry:
    return parse_registry(SERVING_METRICS_PATH.read_text(), str(SERVING_METRICS_PATH.name))

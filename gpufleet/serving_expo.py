"""Engine metric pages -> gpufleet serving measures, and scrapes -> per-minute deltas (pure).

``parse_exposition`` reads Prometheus text exposition (and OpenMetrics text) into samples;
``snapshot`` maps one engine's samples onto the measures of ``serving_metrics.toml`` (histograms
keep their buckets, cumulative since the engine started); ``delta`` turns two snapshots of one
replica into what happened between them (a counter or bucket that went down means the engine
restarted: the later value is the increase since the restart); ``fold`` adds the deltas of one
minute. The agent's scrape and the remote-write receiver share these, so both give the same rows.
A measure absent from a page stays absent: unknown, never zero.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.serving_metrics import Engine, ServingRegistry, serving_registry

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Labels
    value: float

    def label(self, key: str) -> str | None:
        return next((v for k, v in self.labels if k == key), None)


@dataclass(frozen=True, slots=True)
class Hist:
    """A histogram in the measure's unit: ascending upper bounds (the last is +inf), cumulative counts."""

    bounds: tuple[float, ...]
    cum: tuple[float, ...]
    sum: float

    @property
    def count(self) -> float:
        return self.cum[-1] if self.cum else 0.0

    def on_bounds(self, bounds: tuple[float, ...]) -> Hist:
        """The same histogram read on a subset of its bounds (coarser buckets)."""
        at = dict(zip(self.bounds, self.cum, strict=True))
        return Hist(bounds, tuple(at[b] for b in bounds), self.sum)


Value = Hist | float
Snapshot = dict[str, Value]


class ExpositionError(ValueError):
    """A line of a metric page that cannot be read; ``line`` is its 1-based number."""

    def __init__(self, line: int, text: str, why: str) -> None:
        super().__init__(f"metric page line {line}: {why}: {text[:120]!r}")
        self.line = line


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LINE = re.compile(rf"^({_NAME})(\{{.*\}})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _float(text: str) -> float:
    low = text.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    return float(text)


def _labels(body: str, lineno: int, line: str) -> Labels:
    out = []
    pos = 0
    inner = body[1:-1]
    while pos < len(inner):
        m = _LABEL.match(inner, pos)
        if m is None:
            if inner[pos:].strip() in ("", ","):
                break
            raise ExpositionError(lineno, line, "malformed labels")
        value = re.sub(r"\\[\\\"n]", lambda x: _UNESCAPE[x.group(0)], m.group(2))
        out.append((m.group(1), value))
        pos = m.end()
    return tuple(sorted(out))


def parse_exposition(text: str) -> list[Sample]:
    """Every sample line of a Prometheus/OpenMetrics text page; comments and # TYPE lines skipped."""
    samples = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ExpositionError(lineno, line, "not a sample line")
        labels = _labels(m.group(2), lineno, line) if m.group(2) else ()
        try:
            value = _float(m.group(3))
        except ValueError:
            raise ExpositionError(lineno, line, "value is not a number") from None
        samples.append(Sample(m.group(1), labels, value))
    return samples


def _hist_of(samples: list[Sample], name: str, scale: float) -> Hist | None:
    by_le: dict[float, float] = {}
    total = 0.0
    for s in samples:
        if s.name == f"{name}_bucket":
            le = s.label("le")
            if le is None:
                continue
            bound = _float(le)
            by_le[bound] = by_le.get(bound, 0.0) + s.value
        elif s.name == f"{name}_sum":
            total += s.value
    if not by_le or math.inf not in by_le:
        return None
    bounds = sorted(by_le)
    return Hist(tuple(b * scale for b in bounds), tuple(by_le[b] for b in bounds), total * scale)


def _scalar_of(samples: list[Sample], names: tuple[str, ...], agg: str) -> float | None:
    for name in names:
        values = [s.value for s in samples if s.name == name and not math.isnan(s.value)]
        if values:
            return sum(values) / len(values) if agg == "mean" else sum(values)
    return None


def snapshot(samples: Iterable[Sample], engine: Engine | str, registry: ServingRegistry | None = None) -> Snapshot:
    """The measures one engine's page carries (cumulative histograms and counters, gauges now)."""
    reg = registry or serving_registry()
    eng = reg.engine(engine) if isinstance(engine, str) else engine
    prefixes = tuple({m.name for m in eng.metrics})
    mine = [s for s in samples if s.name.startswith(prefixes)]
    out: Snapshot = {}
    for mname, measure in reg.measures.items():
        for em in eng.for_measure(mname):
            value: Value | None
            if measure.kind == "histogram":
                value = _hist_of(mine, em.name, em.scale)
            elif em.source == "sum":
                v = _scalar_of(mine, (f"{em.name}_sum",), "sum")
                value = None if v is None else v * em.scale
            else:
                names = (em.name,) if em.name.endswith("_total") else (em.name, f"{em.name}_total")
                v = _scalar_of(mine, names, measure.agg)
                value = None if v is None else v * em.scale
            if value is not None:
                out[mname] = value
                break
    return out


def _hist_delta(prev: Hist, cur: Hist) -> Hist:
    if prev.bounds != cur.bounds:
        return cur  # the engine restarted with other buckets: everything it has is new
    diffs = [c - p for c, p in zip(cur.cum, prev.cum, strict=True)]
    if any(d < 0 for d in diffs):
        return cur  # reset: counts since the restart
    return Hist(cur.bounds, tuple(diffs), max(cur.sum - prev.sum, 0.0))


def delta(prev: Mapping[str, Value] | None, cur: Mapping[str, Value],
          registry: ServingRegistry | None = None) -> Snapshot:
    """What happened between two snapshots of one replica. Without ``prev`` only gauges are known."""
    reg = registry or serving_registry()
    out: Snapshot = {}
    for name, value in cur.items():
        kind = reg.measures[name].kind
        if kind == "gauge":
            out[name] = value
            continue
        before = None if prev is None else prev.get(name)
        if before is None:
            continue  # first sight: the increase since the last scrape is unknown
        if isinstance(value, Hist) and isinstance(before, Hist):
            out[name] = _hist_delta(before, value)
        elif isinstance(value, float | int) and isinstance(before, float | int):
            out[name] = float(value - before) if value >= before else float(value)
    return out


def add_hists(a: Hist, b: Hist) -> Hist:
    """Sum two histograms, on the bounds they share when an engine changed its buckets."""
    if a.bounds != b.bounds:
        common = tuple(sorted(set(a.bounds) & set(b.bounds)))
        a, b = a.on_bounds(common), b.on_bounds(common)
    return Hist(a.bounds, tuple(x + y for x, y in zip(a.cum, b.cum, strict=True)), a.sum + b.sum)


def fold(deltas: Iterable[Mapping[str, Value]], registry: ServingRegistry | None = None) -> Snapshot:
    """One minute from its scrape deltas: histograms and counters add up, gauges average."""
    reg = registry or serving_registry()
    out: Snapshot = {}
    gauges: dict[str, list[float]] = {}
    for d in deltas:
        for name, value in d.items():
            if reg.measures[name].kind == "gauge":
                if not isinstance(value, Hist):  # a gauge is a number (a histogram here would be a bug upstream)
                    gauges.setdefault(name, []).append(float(value))
                continue
            have = out.get(name)
            if have is None:
                out[name] = value
            elif isinstance(have, Hist) and isinstance(value, Hist):
                out[name] = add_hists(have, value)
            elif isinstance(have, float | int) and isinstance(value, float | int):
                out[name] = float(have) + float(value)
    for name, values in gauges.items():
        out[name] = sum(values) / len(values)
    return out


def minutes_of(scrapes: Iterable[tuple[float, Mapping[str, Value]]],
               registry: ServingRegistry | None = None) -> dict[int, Snapshot]:
    """Per-minute measures of one replica from its time-ordered snapshots (epoch seconds).

    Each scrape-to-scrape delta belongs to the minute in which its interval starts; the first
    scrape gives only gauges. Keys are the minutes' start times (epoch seconds, multiples of 60)."""
    reg = registry or serving_registry()
    parts: dict[int, list[Snapshot]] = {}
    prev: Mapping[str, Value] | None = None
    prev_t: float | None = None
    for t, snap in scrapes:
        d = delta(prev, snap, reg)
        start = t if prev_t is None else prev_t
        parts.setdefault(int(start // 60) * 60, []).append(d)
        prev, prev_t = snap, t
    return {m: fold(ds, reg) for m, ds in sorted(parts.items())}


def value_to_json(v: Value) -> Any:
    """A measure as it travels and is stored: a number, or {"b": bounds, "c": cumulative, "s": sum}
    with the +inf bound written as null (JSON has no infinity)."""
    if isinstance(v, Hist):
        return {"b": [None if math.isinf(b) else b for b in v.bounds], "c": list(v.cum), "s": v.sum}
    return float(v)


def measures_to_json(snap: Mapping[str, Value]) -> dict[str, Any]:
    return {k: value_to_json(v) for k, v in snap.items()}


def measures_from_json(d: Any, registry: ServingRegistry | None = None) -> tuple[Snapshot, list[str]]:
    """The measures of one record, and why any of them was refused (``measure: reason``); a refused
    measure is left out, the others kept."""
    reg = registry or serving_registry()
    out: Snapshot = {}
    errors: list[str] = []
    if not isinstance(d, dict):
        return out, ["measures: expected an object of measure -> value"]
    for name, raw in d.items():
        m = reg.measures.get(name)
        if m is None:
            errors.append(f"{name}: not a serving measure (one of {sorted(reg.measures)})")
            continue
        if m.kind == "histogram":
            why = _hist_problem(raw)
            if why:
                errors.append(f"{name}: {why}")
                continue
            bounds = tuple(math.inf if b is None else float(b) for b in raw["b"])
            out[name] = Hist(bounds, tuple(float(c) for c in raw["c"]), float(raw.get("s", 0.0)))
        else:
            if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
                errors.append(f"{name}: expected a finite number, got {raw!r}")
            elif raw < 0 or (m.unit == "ratio" and raw > 1.0):
                errors.append(f"{name}: {raw} is out of range for a {m.kind} in {m.unit}")
            else:
                out[name] = float(raw)
    return out, errors


def _hist_problem(raw: Any) -> str | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("b"), list) or not isinstance(raw.get("c"), list):
        return 'expected {"b": bounds, "c": cumulative counts, "s": sum}'
    b, c = raw["b"], raw["c"]
    if not b or len(b) != len(c) or len(b) > 256:
        return "bounds and counts must be non-empty lists of equal length (at most 256)"
    if b[-1] is not None or any(x is None or isinstance(x, bool) or not isinstance(x, int | float) for x in b[:-1]):
        return "bounds must be numbers with the last one null (+Inf)"
    if any(y <= x for x, y in itertools.pairwise(b[:-1])):
        return "bounds must increase"
    if any(isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < 0 for x in c):
        return "counts must be finite numbers >= 0"
    if any(y < x for x, y in itertools.pairwise(c)):
        return "counts must be cumulative (never decreasing)"
    s = raw.get("s", 0.0)
    if isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s):
        return "sum must be a finite number"
    return None


class MinuteFolder:
    """Per-replica scrapes in, whole minutes out (stateful; the agent's scrape and the remote-write
    receiver each keep one). ``add`` takes a replica's snapshot at time t (its delta against the
    replica's previous one goes to the minute the interval starts in); ``drain`` hands out each
    minute that ended before ``now`` once. At most ``max_minutes`` open minutes per replica are kept
    (the oldest go first) so a replica that is never drained cannot grow without bound."""

    def __init__(self, max_minutes: int = 60, registry: ServingRegistry | None = None) -> None:
        self.max_minutes = max_minutes
        self.registry = registry or serving_registry()
        self._last: dict[Any, tuple[float, Snapshot]] = {}
        self._parts: dict[Any, dict[int, list[Snapshot]]] = {}

    def add(self, key: Any, t: float, snap: Snapshot) -> None:
        prev = self._last.get(key)
        if prev is not None and t <= prev[0]:
            return  # a sample already seen (a resent body) or out of order: the delta would be wrong
        d = delta(prev[1] if prev else None, snap, self.registry)
        start = t if prev is None else prev[0]
        parts = self._parts.setdefault(key, {})
        parts.setdefault(int(start // 60) * 60, []).append(d)
        while len(parts) > self.max_minutes:
            parts.pop(min(parts))
        self._last[key] = (t, snap)

    def last_time(self, key: Any) -> float | None:
        """When the replica's newest folded snapshot was taken (None: never)."""
        last = self._last.get(key)
        return None if last is None else last[0]

    def forget(self, keep: Iterable[Any]) -> None:
        """Drop the state of replicas not in ``keep`` (gone targets)."""
        wanted = set(keep)
        for d in (self._last, self._parts):
            for k in [k for k in d if k not in wanted]:
                del d[k]

    def drain(self, now: float) -> list[tuple[Any, int, Snapshot]]:
        out = []
        for key, parts in self._parts.items():
            for minute in sorted(m for m in parts if m + 60 <= now):
                measures = fold(parts.pop(minute), self.registry)
                if measures:
                    out.append((key, minute, measures))
        return out

"""The flag-kind registry, loaded from ``flagkinds.toml`` (data, not code).

Core module: imports nothing of the project, so analysis, alerts and the API all read the same
kinds, titles, suggestions and evidence labels from here (and the web page gets them as JSON
from ``GET /api/v1/flag-kinds``)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

REGISTRY_PATH = Path(__file__).with_name("flagkinds.toml")

SCOPES = ("job", "node", "gpu", "node_or_gpu", "job_or_gpu", "progress", "deployment", "replica")
# Where a kind's detector lives, by the data it judges (tests/analysis/test_flagkinds.py holds
# every kind to exactly one detector module there): "hardware" = the job's telemetry windows
# (GPU samples, NCCL records, NIC counters; analysis/detectors/<name>.py), "progress" = the
# job's own progress windows (gpufleet.progress; analysis/progress/detectors/<name>.py),
# "serving" = a serving deployment's replica-minutes (docs/serving.md; analysis/serving/detectors/<name>.py).
SOURCES = {"hardware": "analysis/detectors", "progress": "analysis/progress/detectors",
           "serving": "analysis/serving/detectors"}
SEVERITIES = ("info", "warning", "critical")
WORKLOAD_CLASSES = ("training", "serving", "batch_inference", "interactive", "hpc")
UNITS = ("ratio", "count", "minutes", "seconds", "MHz", "W", "GiB", "bytes", "bytes/s", "per_minute", "text",
         "list", "map", "xid")
# "{key}" is the evidence value; "{key:restart|restarts}" is the value with the word that agrees
# with it ("1 restart", "3 restarts"); "[[ ... || ... ]]" is the first part when every placeholder
# in it has a value, else the second (which may be empty), so a template never prints "every n/a s".
_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)(?::([^{}|]*)\|([^{}]*))?\}")
_OPTIONAL = re.compile(r"\[\[(.*?)(?:\|\|(.*?))?\]\]", re.S)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_KIND_KEYS = {"name", "source", "scope", "severity", "title", "summary", "suggestion", "suggestion_by_class",
              "suggestion_by_cause", "waste", "docs", "evidence"}
_OPTIONAL_KIND_KEYS = {"suggestion_by_class", "suggestion_by_cause"}


@dataclass(frozen=True, slots=True)
class EvidenceField:
    key: str
    label: str
    unit: str
    meaning: str
    of: str = ""  # a list's or map's values: their unit ("" = mixed or the items' own keys say)

    def as_json(self) -> dict[str, str]:
        return {"label": self.label, "unit": self.unit, "meaning": self.meaning, **({"of": self.of} if self.of else {})}

    def text(self, value: Any) -> str:
        """The value as plain text in this key's unit, for messages (Slack); the web pages use
        api/static/evidence.js, which follows the same rules with folding and links."""
        return value_text(self.unit if self.unit not in ("list", "map") else self.of, value)


def _num(v: float) -> str:
    if float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _scaled(v: float, base: float, units: tuple[str, ...]) -> str:
    x, i = abs(v), 0
    while x >= base and i < len(units) - 1:
        x /= base
        i += 1
    return f"{'-' if v < 0 else ''}{float(f'{x:.3g}'):g} {units[i]}"


def value_text(unit: str, v: Any) -> str:
    """One evidence value in its unit: ratios as %, bytes/s as GB/s, integers without decimals;
    None reads "not measured" (unknown is not zero); lists and maps item by item."""
    if v is None:
        return "not measured"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list):
        return ", ".join(value_text(unit, x) for x in v[:8]) + (f" (+{len(v) - 8})" if len(v) > 8 else "")
    if isinstance(v, dict):
        return ", ".join(f"{str(k).replace('_', ' ')} {value_text(unit, x)}" for k, x in v.items())
    if not isinstance(v, int | float) or v != v or v in (float("inf"), float("-inf")):
        return str(v)
    if unit == "ratio":
        return f"{v * 100:.1f}".rstrip("0").rstrip(".") + "%"
    if unit == "bytes/s":
        return _scaled(float(v), 1000, ("B/s", "KB/s", "MB/s", "GB/s", "TB/s"))
    if unit == "bytes":
        return _scaled(float(v), 1024, ("B", "KiB", "MiB", "GiB", "TiB"))
    if unit == "xid":
        return f"XID {int(v)}"
    suffix = {"MHz": " MHz", "W": " W", "GiB": " GiB", "minutes": " min", "seconds": " s", "per_minute": " /min"}
    return _num(round(v) if unit in ("MHz", "W") else v) + suffix.get(unit, "")


@dataclass(frozen=True, slots=True)
class FlagKind:
    name: str
    source: str
    scope: str
    severity: str
    title: str
    summary: str
    suggestion: str
    suggestion_by_class: tuple[tuple[str, str], ...]
    waste: str
    docs: str
    evidence: tuple[EvidenceField, ...]
    # the advice for the cause the detector measured (evidence key "cause"), e.g. throttled's
    # thermal vs power cap: it beats the per-class advice, which beats the default
    suggestion_by_cause: tuple[tuple[str, str], ...] = ()

    def suggestion_with(self, evidence: dict[str, Any], workload_class: str | None = None) -> str:
        """The suggestion with its ``{evidence_key}`` placeholders filled from the evidence
        (ratios as percentages, seconds rounded; a missing value reads "n/a")."""
        units = {e.key: e.unit for e in self.evidence}

        def text(key: str) -> str | None:
            v = evidence.get(key)
            if v is None or isinstance(v, dict | list):
                return None
            if isinstance(v, bool) or not isinstance(v, int | float):
                return str(v)
            if units.get(key) == "ratio":
                return f"{v:.1%}"
            if units.get(key) == "seconds" or abs(v) >= 100:
                return f"{v:,.0f}"
            return f"{v:.3g}"

        def value(m: re.Match[str]) -> str:
            t = text(m.group(1))
            if t is None:
                return "n/a"
            if m.group(2) is not None:  # "{n:word|words}": the number and the word that agrees with it
                return f"{t} {m.group(2) if evidence.get(m.group(1)) == 1 else m.group(3)}"
            return t

        def optional(m: re.Match[str]) -> str:
            filled = all(text(k.group(1)) is not None for k in _PLACEHOLDER.finditer(m.group(1)))
            return m.group(1) if filled else (m.group(2) or "")

        cause = evidence.get("cause")
        template = self.suggestion_for(workload_class, cause if isinstance(cause, str) else None)
        return _PLACEHOLDER.sub(value, _OPTIONAL.sub(optional, template))

    def suggestion_for(self, workload_class: str | None, cause: str | None = None) -> str:
        """The advice that fits the measured cause (thermal throttling is not told to raise the
        power cap), else the workload (a serving replica is not told to fix its DataLoader)."""
        by_cause = dict(self.suggestion_by_cause)
        if cause and cause in by_cause:
            return by_cause[cause]
        return dict(self.suggestion_by_class).get(workload_class or "", self.suggestion)

    @property
    def suggestions(self) -> tuple[str, ...]:
        """Every suggestion text the kind may give."""
        return (self.suggestion, *(s for _, s in self.suggestion_by_class), *(s for _, s in self.suggestion_by_cause))

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "scope": self.scope, "severity": self.severity,
                "title": self.title,
                "summary": self.summary, "suggestion": self.suggestion,
                "suggestion_by_class": dict(self.suggestion_by_class),
                "suggestion_by_cause": dict(self.suggestion_by_cause), "waste": self.waste, "docs": self.docs,
                "evidence": {e.key: e.as_json() for e in self.evidence}}


@dataclass(frozen=True, slots=True)
class FlagKinds:
    kinds: tuple[FlagKind, ...]
    common_evidence: tuple[EvidenceField, ...]
    # keys inside evidence lists of objects and maps (hw_fault's per-GPU items, a port's
    # counters): the same label/unit/meaning, so no page shows a raw key
    item_evidence: tuple[EvidenceField, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.kinds)

    def get(self, name: str) -> FlagKind:
        for k in self.kinds:
            if k.name == name:
                return k
        raise KeyError(f"unknown flag kind {name!r}; known: {', '.join(self.names)}")

    def title(self, name: str) -> str:
        """The kind's title; an unknown kind (a row written by a newer version) shows its name."""
        try:
            return self.get(name).title
        except KeyError:
            return name

    def evidence_field(self, kind: str, key: str) -> EvidenceField | None:
        for e in (*self.get(kind).evidence, *self.common_evidence):
            if e.key == key:
                return e
        return None

    def item_field(self, key: str) -> EvidenceField | None:
        return next((e for e in self.item_evidence if e.key == key), None)

    def evidence_text(self, kind: str, key: str, value: Any) -> tuple[str, str]:
        """(label, value) of one evidence entry for a message; a key or kind the registry lacks
        reads as words ("idle fraction"), its value unformatted."""
        try:
            spec = self.evidence_field(kind, key)
        except KeyError:
            spec = None
        if spec is None:
            return key.replace("_", " "), value_text("", value)
        if key == "cause" and isinstance(value, str):
            return spec.label, value.replace("_", " ")
        if key == "judged_from" and isinstance(value, list):  # signal names read as words, not nic_counters
            return spec.label, ", ".join(str(x).replace("_", " ") for x in value)
        return spec.label, spec.text(value)

    def as_json(self) -> dict[str, Any]:
        return {"kinds": [k.as_json() for k in self.kinds],
                "common_evidence": {e.key: e.as_json() for e in self.common_evidence},
                "item_evidence": {e.key: e.as_json() for e in self.item_evidence},
                "severities": list(SEVERITIES), "workload_classes": list(WORKLOAD_CLASSES)}


def _evidence(d: Any, where: str) -> tuple[EvidenceField, ...]:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a table of evidence keys")
    out = []
    for key, spec in d.items():
        if not isinstance(spec, dict) or not {"label", "unit", "meaning"} <= set(spec) <= {"label", "unit", "meaning",
                                                                                           "of"}:
            raise ValueError(f"{where}.{key}: expected {{ label, unit, meaning }} (and, for a list or map, of)")
        for u in (spec["unit"], spec.get("of", "ratio")):
            if u not in UNITS:
                raise ValueError(f"{where}.{key}: unit {u!r} is not one of {list(UNITS)}")
        if "of" in spec and spec["unit"] not in ("list", "map"):
            raise ValueError(f"{where}.{key}: 'of' (the values' unit) applies to a list or map only")
        out.append(EvidenceField(key, str(spec["label"]), str(spec["unit"]), str(spec["meaning"]),
                                 str(spec.get("of", ""))))
    return tuple(out)


def _kind(d: Any, i: int) -> FlagKind:
    where = f"flag kind #{i + 1}"
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a table")
    where = f"flag kind {d.get('name', '#' + str(i + 1))!r}"
    unknown = set(d) - _KIND_KEYS
    missing = (_KIND_KEYS - _OPTIONAL_KIND_KEYS) - set(d)
    if unknown or missing:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    if not _NAME.match(str(d["name"])):
        raise ValueError(f"{where}: name must be lower_snake_case, at most 32 characters")
    if d["source"] not in SOURCES:
        raise ValueError(f"{where}: source {d['source']!r} is not one of {list(SOURCES)}")
    if d["scope"] not in SCOPES:
        raise ValueError(f"{where}: scope {d['scope']!r} is not one of {list(SCOPES)}")
    if d["severity"] not in SEVERITIES:
        raise ValueError(f"{where}: severity {d['severity']!r} is not one of {list(SEVERITIES)}")
    by_class = d.get("suggestion_by_class") or {}
    bad = sorted(set(by_class) - set(WORKLOAD_CLASSES))
    if bad:
        raise ValueError(f"{where}: suggestion_by_class has unknown workload classes {bad}")
    by_cause = d.get("suggestion_by_cause") or {}
    bad = sorted(c for c in by_cause if not _NAME.match(str(c)))
    if bad:
        raise ValueError(f"{where}: suggestion_by_cause keys must be lower_snake_case: {bad}")
    declared = set(d["evidence"]) if isinstance(d["evidence"], dict) else set()
    for text in (d["suggestion"], *by_class.values(), *by_cause.values()):
        undeclared = sorted({m.group(1) for m in _PLACEHOLDER.finditer(str(text))} - declared)
        if undeclared:
            raise ValueError(f"{where}: suggestion placeholders {undeclared} are not evidence keys of the kind")
    return FlagKind(str(d["name"]), str(d["source"]), str(d["scope"]), str(d["severity"]), str(d["title"]),
                    str(d["summary"]),
                    str(d["suggestion"]), tuple((str(k), str(v)) for k, v in by_class.items()), str(d["waste"]),
                    str(d["docs"]), _evidence(d["evidence"], f"{where}.evidence"),
                    tuple((str(k), str(v)) for k, v in by_cause.items()))


def parse_flag_kinds(text: str) -> FlagKinds:
    raw = tomllib.loads(text)
    kinds = tuple(_kind(d, i) for i, d in enumerate(raw.get("kind") or []))
    names = [k.name for k in kinds]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"flag kinds defined twice: {dup}")
    if not kinds:
        raise ValueError("the flag-kind registry defines no [[kind]]")
    return FlagKinds(kinds, _evidence(raw.get("common_evidence") or {}, "common_evidence"),
                     _evidence(raw.get("item_evidence") or {}, "item_evidence"))


@cache
def flag_kinds() -> FlagKinds:
    """The registry shipped with this version (read once per process)."""
    return parse_flag_kinds(REGISTRY_PATH.read_text())


FLAG_KINDS: tuple[str, ...] = flag_kinds().names

"""Thresholds for the goodput heuristics, read from ``thresholds.toml`` (data, not code).

``GPUFLEET_THRESHOLDS`` names another file; its keys override the defaults one by one, so a
site can change one threshold without copying the whole file.

Every section is read one way, typed: ``th.general`` (``General``) and ``th.get(Config)`` where
``Config`` is a detector's frozen dataclass (``analysis/detectors/*.py``). A key the dataclass
does not know, a missing key or a value of the wrong type is an error naming the section and
key, raised when the file is loaded, not when a detector first runs."""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from gpufleet.flagkinds import FLAG_KINDS, SEVERITIES

DEFAULT_PATH = Path(__file__).with_name("thresholds.toml")

__all__ = ["FLAG_KINDS", "General", "KindConfig", "ModelLimits", "ProgressGeneral", "Thresholds", "load_thresholds",
           "parse_thresholds"]


@dataclass(frozen=True, slots=True)
class ModelLimits:
    max_sm_clock_mhz: float
    nvlink_bytes_s: float
    ib_bytes_s: float


@dataclass(frozen=True, kw_only=True)
class Section:
    """A typed thresholds section; ``SECTION`` is its table name in thresholds.toml."""

    SECTION: ClassVar[str] = ""


@dataclass(frozen=True, kw_only=True)
class General(Section):
    SECTION: ClassVar[str] = "general"
    window_s: float
    busy_sm_active: float
    idle_sm_active: float
    idle_busy_frac: float
    idle_gpu_util: float
    target_sm_active: float
    min_window_coverage: float
    critical_wasted_gpu_hours: float
    reread_margin_s: float
    reread_max_s: float


@dataclass(frozen=True, kw_only=True)
class ProgressGeneral(Section):
    """What the progress findings share (docs/progress.md): freshness and the hang rule."""

    SECTION: ClassVar[str] = "progress"
    fresh_s: float  # the newest window must be this recent to call anything ongoing
    hang_min_s: float  # no step for at least this long (and ...)
    hang_step_factor: float  # ... this many typical step times) with no span open = hung
    span_hang_s: float  # a span open this long is hung too (a 10-minute checkpoint is not)


@dataclass(frozen=True, kw_only=True)
class KindConfig(Section):
    """What every flag kind's section holds besides its own thresholds."""

    min_duration_s: float
    min_fraction: float = 0.0
    severity: str | None = None  # None: the registry's default severity


C = TypeVar("C", bound=Section)


def _coerce(tp: Any, v: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if v is None and type(None) in args:
            return None
        return _coerce(next(a for a in args if a is not type(None)), v, where)
    if origin is tuple:
        if not isinstance(v, list):
            raise ValueError(f"{where}: expected a list, got {v!r}")
        inner = typing.get_args(tp)[0]
        return tuple(_coerce(inner, x, where) for x in v)
    if isinstance(v, bool) and tp is not bool:
        raise ValueError(f"{where}: expected a {tp.__name__}, got {v!r}")
    if tp is float and isinstance(v, int | float):
        return float(v)
    if tp is int and isinstance(v, int):
        return v
    if tp is str and isinstance(v, str):
        return v
    if tp is bool and isinstance(v, bool):
        return v
    raise ValueError(f"{where}: expected a {getattr(tp, '__name__', tp)}, got {v!r}")


def build_section(cls: type[C], d: Any) -> C:
    name = cls.SECTION
    if not isinstance(d, dict):
        raise ValueError(f"thresholds [{name}]: expected a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ValueError(f"thresholds [{name}]: unknown key(s) {unknown}; known: {sorted(fields)}")
    kw: dict[str, Any] = {}
    for fname, f in fields.items():
        if fname not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"thresholds [{name}]: missing key {fname!r}")
            continue
        kw[fname] = _coerce(hints[fname], d[fname], f"thresholds [{name}].{fname}")
    sev = kw.get("severity")
    if sev is not None and sev not in SEVERITIES:
        raise ValueError(f"thresholds [{name}]: severity must be info, warning or critical, got {sev!r}")
    return cls(**kw)


@dataclass(frozen=True)
class Thresholds:
    raw: dict[str, Any]
    _typed: dict[type, Section] = field(default_factory=dict, compare=False, repr=False)
    _models: dict[str | None, ModelLimits] = field(default_factory=dict, compare=False, repr=False)

    @property
    def general(self) -> General:
        return self.get(General)

    @property
    def progress(self) -> ProgressGeneral:
        return self.get(ProgressGeneral)

    def get(self, cls: type[C]) -> C:
        """The typed section ``cls`` (built once per Thresholds)."""
        got = self._typed.get(cls)
        if got is None:
            got = build_section(cls, self.raw.get(cls.SECTION, {}))
            self._typed[cls] = got
        return got  # type: ignore[return-value]  # the dict is keyed by the class it holds

    def model(self, device_name: str | None) -> ModelLimits:
        """The limits of the first ``[models]`` entry named in ``device_name`` (else default),
        looked up once per device name (every job asks; a fleet has a few models)."""
        got = self._models.get(device_name)
        if got is None:
            got = self._models[device_name] = self._model(device_name)
        return got

    def _model(self, device_name: str | None) -> ModelLimits:
        models: dict[str, dict[str, float]] = self.raw["models"]
        chosen = models["default"]
        for match, spec in models.items():
            if match != "default" and device_name and match.lower() in device_name.lower():
                chosen = spec
                break
        return ModelLimits(float(chosen["max_sm_clock_mhz"]), float(chosen["nvlink_bytes_s"]),
                           float(chosen["ib_bytes_s"]))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def parse_thresholds(text: str, base: dict[str, Any] | None = None) -> Thresholds:
    """Parse (and with ``base``, overlay) a thresholds file; every section is checked now."""
    from .detectors import DETECTORS  # the detectors' config classes say what each section holds
    from .progress.detectors import PROGRESS_DETECTORS

    raw = tomllib.loads(text)
    if base is not None:
        raw = _merge(base, raw)
    sections: dict[str, type[Section]] = {"general": General, "progress": ProgressGeneral,
                                          **{d.kind: d.config for d in DETECTORS},
                                          **{d.kind: d.config for d in PROGRESS_DETECTORS}}
    missing = [k for k in ("models", *sections) if k not in raw]
    if missing:
        raise ValueError(f"thresholds lack sections {missing}")
    unknown = sorted(set(raw) - set(sections) - {"models"})
    if unknown:
        raise ValueError(f"thresholds: unknown section(s) {unknown}; known: {sorted(sections)} and models")
    th = Thresholds(raw)
    for cls in sections.values():
        th.get(cls)
    return th


@cache
def load_thresholds(path: str | None = None) -> Thresholds:
    """The defaults, overridden by ``path`` or $GPUFLEET_THRESHOLDS when given."""
    default = parse_thresholds(DEFAULT_PATH.read_text())
    path = path or os.environ.get("GPUFLEET_THRESHOLDS")
    if not path:
        return default
    return parse_thresholds(Path(path).read_text(), base=default.raw)

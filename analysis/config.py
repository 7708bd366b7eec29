"""Thresholds for the goodput heuristics, read from ``thresholds.toml`` (data, not code).

``GPUFLEET_THRESHOLDS`` names another file; its keys override the defaults one by one, so a
site can change one threshold without copying the whole file."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path(__file__).with_name("thresholds.toml")

FLAG_KINDS: tuple[str, ...] = (
    "idle_gpu", "low_sm_activity", "no_tensor_cores", "input_stall", "comm_bound", "straggler",
    "memory_underuse", "throttled", "oversized_allocation", "hw_fault",
)


@dataclass(frozen=True, slots=True)
class ModelLimits:
    max_sm_clock_mhz: float
    nvlink_bytes_s: float
    ib_bytes_s: float


@dataclass(frozen=True)
class Thresholds:
    raw: dict[str, Any]

    def general(self, key: str) -> Any:
        return self.raw["general"][key]

    def kind(self, kind: str) -> dict[str, Any]:
        return self.raw[kind]

    def model(self, device_name: str | None) -> ModelLimits:
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
    raw = tomllib.loads(text)
    if base is not None:
        raw = _merge(base, raw)
    missing = [k for k in ("general", "models", *FLAG_KINDS) if k not in raw]
    if missing:
        raise ValueError(f"thresholds lack sections {missing}")
    for kind in FLAG_KINDS:
        if raw[kind].get("severity", "warning") not in ("info", "warning", "critical"):
            raise ValueError(f"thresholds [{kind}]: severity must be info, warning or critical")
    return Thresholds(raw)


@cache
def load_thresholds(path: str | None = None) -> Thresholds:
    """The defaults, overridden by ``path`` or $GPUFLEET_THRESHOLDS when given."""
    default = parse_thresholds(DEFAULT_PATH.read_text())
    path = path or os.environ.get("GPUFLEET_THRESHOLDS")
    if not path:
        return default
    return parse_thresholds(Path(path).read_text(), base=default.raw)

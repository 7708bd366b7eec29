"""Thresholds of the serving detectors, from ``thresholds.toml`` beside this module (data, not code)."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, TypeVar

DEFAULT_PATH = Path(__file__).with_name("thresholds.toml")


@dataclass(frozen=True, kw_only=True)
class ServingKindConfig:
    SECTION: ClassVar[str] = ""
    min_minutes: int
    severity: str | None = None  # None: the registry's default


C = TypeVar("C", bound=ServingKindConfig)


def build(cls: type[C], raw: dict[str, Any]) -> C:
    """The section of ``raw`` for ``cls``; ValueError names the section and the key that is wrong."""
    d = raw.get(cls.SECTION)
    if not isinstance(d, dict):
        raise ValueError(f"serving thresholds: no [{cls.SECTION}] section")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ValueError(f"serving thresholds [{cls.SECTION}]: unknown keys {unknown}; known {sorted(fields)}")
    kwargs: dict[str, Any] = {}
    for name, value in d.items():
        if name == "severity":
            kwargs[name] = None if value is None else str(value)
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"serving thresholds [{cls.SECTION}].{name}: expected a number, got {value!r}")
        else:
            kwargs[name] = int(value) if name == "min_minutes" else float(value)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"serving thresholds [{cls.SECTION}]: {e}") from None


@cache
def load_raw(path: str | None = None) -> dict[str, Any]:
    path = path or os.environ.get("GPUFLEET_SERVING_THRESHOLDS")
    return tomllib.loads(Path(path).read_text() if path else DEFAULT_PATH.read_text())

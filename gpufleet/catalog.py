"""The metric catalog, loaded from ``catalog.toml`` (data, not code).

Every part reads field definitions from here: the agent to know what to sample, the
collector to validate ranges, storage to build columns, analysis and the API to name
series, dashboards and docs to describe them.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import cache
from pathlib import Path

CATALOG_PATH = Path(__file__).with_name("catalog.toml")

_DTYPES = {"f4", "f8", "i8"}
_ROLLUPS = {"mean", "max", "last", "sum_rate"}


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    unit: str
    min: float
    max: float
    dtype: str
    rollup: str
    description: str
    dcgm: tuple[str, ...] = ()
    dcgm_id: int | None = None
    dcgm_scale: float = 1.0
    nvml: str = ""

    def check(self, value: object) -> str | None:
        """Return why ``value`` is invalid for this field, or None when it is valid."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{self.name}: expected a number, got {type(value).__name__}"
        if math.isnan(value) or math.isinf(value):
            return f"{self.name}: {value!r} is not a finite number"
        if value < self.min or value > self.max:
            return f"{self.name}: {value!r} outside valid range [{self.min:g}, {self.max:g}] {self.unit}"
        return None


@dataclass(frozen=True, slots=True)
class GpuModel:
    match: str
    peak_tensor_tflops: float
    memory_gib: float


@dataclass(frozen=True, slots=True)
class Catalog:
    fields: tuple[Field, ...]
    gpu_models: tuple[GpuModel, ...]
    # name -> field, built once: a cache keyed by the catalog itself hashed every field on
    # each lookup (45 us a CATALOG[name]; the job time series made ~80 per request)
    _by_name: dict[str, Field] = dataclass_field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {f.name: f for f in self.fields})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def __getitem__(self, name: str) -> Field:
        return self.by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    @property
    def by_name(self) -> dict[str, Field]:
        return self._by_name

    def by_dcgm_name(self) -> dict[str, Field]:
        """Map every DCGM field name (old and DCGM 4.6 spellings) to its catalog field."""
        return {alias: f for f in self.fields for alias in f.dcgm}

    def gpu_model(self, device_name: str) -> GpuModel | None:
        """The peak-throughput entry for an NVML/DCGM device name, first substring match."""
        for m in self.gpu_models:
            if m.match.lower() in device_name.lower():
                return m
        return None


def parse_catalog(text: str) -> Catalog:
    """Parse and validate catalog TOML; raises ValueError naming the bad entry."""
    raw = tomllib.loads(text)
    fields: list[Field] = []
    for name, spec in raw.get("fields", {}).items():
        try:
            f = Field(
                name=name,
                unit=str(spec["unit"]),
                min=float(spec["min"]),
                max=float(spec["max"]),
                dtype=str(spec["dtype"]),
                rollup=str(spec["rollup"]),
                description=str(spec["description"]),
                dcgm=tuple(spec.get("dcgm", ())),
                dcgm_id=spec.get("dcgm_id"),
                dcgm_scale=float(spec.get("dcgm_scale", 1.0)),
                nvml=str(spec.get("nvml", "")),
            )
        except KeyError as e:
            raise ValueError(f"catalog field {name!r} lacks key {e.args[0]!r}") from None
        if f.dtype not in _DTYPES:
            raise ValueError(f"catalog field {name!r}: dtype {f.dtype!r} not one of {sorted(_DTYPES)}")
        if f.rollup not in _ROLLUPS:
            raise ValueError(f"catalog field {name!r}: rollup {f.rollup!r} not one of {sorted(_ROLLUPS)}")
        if f.min > f.max:
            raise ValueError(f"catalog field {name!r}: min > max")
        if not name.isidentifier() or name != name.lower():
            raise ValueError(f"catalog field {name!r}: names are snake_case identifiers")
        fields.append(f)
    models = tuple(
        GpuModel(match=k, peak_tensor_tflops=float(v["peak_tensor_tflops"]), memory_gib=float(v["memory_gib"]))
        for k, v in raw.get("gpu_models", {}).items()
    )
    return Catalog(fields=tuple(fields), gpu_models=models)


@cache
def load_catalog(path: Path | None = None) -> Catalog:
    """The catalog from ``path``, else ``$GPUFLEET_CATALOG`` (a deployment's override, e.g. the
    Helm chart's ConfigMap), else the packaged ``catalog.toml``."""
    if path is None:
        env = os.environ.get("GPUFLEET_CATALOG")
        path = Path(env) if env else CATALOG_PATH
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read the metric catalog {path}: {e.strerror}") from None
    return parse_catalog(text)


CATALOG = load_catalog()

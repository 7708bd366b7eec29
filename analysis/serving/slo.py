"""Serving SLOs: per-deployment targets for TTFT and TPOT at a percentile, with MLPerf presets.

The presets are MLPerf Inference's server-scenario latency constraints (TTFT / TPOT at p99):
Llama-3.1-8B 2000 / 100 ms (interactive 500 / 30 ms), Llama-2-70B 2000 / 200 ms (interactive
450 / 40 ms). A deployment names a preset or its own numbers (pod labels / annotations
``gpufleet.io/slo-preset``, ``gpufleet.io/slo-ttft-ms``, ``gpufleet.io/slo-tpot-ms``,
``gpufleet.io/slo-percentile``; see docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float
    tpot_s: float
    percentile: float = 0.99
    source: str = "custom"

    def as_dict(self) -> dict[str, object]:
        return {"ttft_ms": self.ttft_s * 1000, "tpot_ms": self.tpot_s * 1000, "percentile": self.percentile,
                "source": self.source}


PRESETS: dict[str, Slo] = {
    "mlperf-llama3.1-8b": Slo(2.0, 0.100, 0.99, "mlperf-llama3.1-8b"),
    "mlperf-llama3.1-8b-interactive": Slo(0.5, 0.030, 0.99, "mlperf-llama3.1-8b-interactive"),
    "mlperf-llama2-70b": Slo(2.0, 0.200, 0.99, "mlperf-llama2-70b"),
    "mlperf-llama2-70b-interactive": Slo(0.45, 0.040, 0.99, "mlperf-llama2-70b-interactive"),
}
DEFAULT = PRESETS["mlperf-llama3.1-8b"]

LABEL_PRESET = "gpufleet.io/slo-preset"
LABEL_TTFT = "gpufleet.io/slo-ttft-ms"
LABEL_TPOT = "gpufleet.io/slo-tpot-ms"
LABEL_PERCENTILE = "gpufleet.io/slo-percentile"


class SloError(ValueError):
    """A deployment's SLO labels cannot be read; the message names the label."""


def slo_from_labels(labels: Mapping[str, str], default: Slo = DEFAULT) -> Slo:
    """The deployment's SLO from its labels: a preset, then explicit numbers over it."""
    base = default
    preset = labels.get(LABEL_PRESET)
    if preset is not None:
        if preset not in PRESETS:
            raise SloError(f"{LABEL_PRESET}={preset!r}: not one of {sorted(PRESETS)}")
        base = PRESETS[preset]
    ttft, tpot, pct = base.ttft_s, base.tpot_s, base.percentile
    source = base.source
    try:
        if LABEL_TTFT in labels:
            ttft, source = float(labels[LABEL_TTFT]) / 1000, "labels"
        if LABEL_TPOT in labels:
            tpot, source = float(labels[LABEL_TPOT]) / 1000, "labels"
        if LABEL_PERCENTILE in labels:
            pct = float(labels[LABEL_PERCENTILE])
    except ValueError as e:
        raise SloError(f"SLO label is not a number: {e}") from None
    if ttft <= 0 or tpot <= 0 or not 0 < pct < 1:
        raise SloError(f"SLO out of range: ttft {ttft} s, tpot {tpot} s, percentile {pct} (0..1)")
    return Slo(ttft, tpot, pct, source)

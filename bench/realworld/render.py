"""Sampling per-second truth at an interval into catalog fields, the way the real samplers do.

- DCGM profiling fields (SM, occupancy, tensor, DRAM, pipes, PCIe/NVLink bytes) are averages
  over the sampling interval (DCGM watches them at the collection period; dcgm-exporter's
  default is 30 s); IB byte rates come from counter deltas, so they are averages too.
- NVML's utilization.gpu is a duty cycle over the last 1/6-1 s, so at a 60 s interval it is a
  point reading of the last second, not a minute's mean (why 60 s duty-cycle histories look
  so noisy). Power, clocks, reasons, temperature and memory are instantaneous; counters count.
- Quantisation as the sources report it: utilisation in whole percent, memory in MiB, clocks
  in MHz, temperature in whole degrees.
- Timestamps carry the agent's scheduling jitter; a small share of samples is dropped.

Field sets name what a fleet has: ``dcgm`` (profiling and NVML), ``nvml`` (no profiling:
older drivers, consumer and cloud images), ``util_fb`` (exported history with only
gpu_util and fb_used_bytes), ``mig`` (profiling per instance; power, clocks, temperature and
ECC are not supported on an instance handle)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .hardware import MIB
from .signals import GpuTruth, physics

PROFILING = ("gr_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active",
             "fp32_active", "fp16_active", "pcie_tx_bytes_s", "pcie_rx_bytes_s", "nvlink_tx_bytes_s",
             "nvlink_rx_bytes_s")
NVML = ("gpu_util", "mem_copy_util", "fb_used_bytes", "fb_total_bytes", "power_w", "energy_j", "temp_c",
        "sm_clock_mhz", "mem_clock_mhz", "clock_event_reasons", "xid_last", "ecc_dbe_volatile",
        "ecc_sbe_volatile", "row_remap_failure", "nvlink_error_count", "pcie_replay_count")
IB = ("ib_tx_bytes_s", "ib_rx_bytes_s")
NOT_ON_MIG = ("power_w", "energy_j", "temp_c", "sm_clock_mhz", "mem_clock_mhz", "clock_event_reasons",
              "ecc_dbe_volatile", "ecc_sbe_volatile", "row_remap_failure", "nvlink_error_count",
              "pcie_replay_count", "nvlink_tx_bytes_s", "nvlink_rx_bytes_s", "mem_copy_util")

FIELD_SETS: dict[str, tuple[str, ...]] = {
    "dcgm": PROFILING + NVML + IB,
    "dcgm_no_ib": PROFILING + NVML,
    # Without DCGM profiling NVML still gives PCIe throughput (nvmlDeviceGetPcieThroughput).
    "nvml": (*tuple(f for f in NVML), "pcie_tx_bytes_s", "pcie_rx_bytes_s"),
    "util_fb": ("gpu_util", "fb_used_bytes"),
    "mig": tuple(f for f in PROFILING + NVML if f not in NOT_ON_MIG),
}


@dataclass
class Rendered:
    """One GPU's samples: ``ts`` (absolute epoch seconds) and one array per field (NaN = not
    available in that row)."""

    ts: np.ndarray
    cols: dict[str, np.ndarray]


def _window_mean(x: np.ndarray, idx: np.ndarray, width: int) -> np.ndarray:
    c = np.concatenate([[0.0], np.cumsum(x)])
    hi = idx + 1
    lo = np.maximum(0, hi - width)
    return (c[hi] - c[lo]) / np.maximum(1, hi - lo)


def render(g: GpuTruth, *, t0: float, interval_s: float, field_set: str, rng: np.random.Generator,
           gaps: Sequence[tuple[float, float]] = (), profiling_paused: Sequence[tuple[float, float]] = (),
           drop_rate: float = 0.002) -> Rendered:
    """Sample ``g`` (seconds 0..n from absolute time ``t0``) every ``interval_s``. ``gaps`` are
    spans (job-relative seconds) with no samples at all (agent down); ``profiling_paused`` are spans
    where DCGM profiling reads blank (a user running Nsight: DCGM error -37)."""
    ph = physics(g)
    width = max(1, round(interval_s))
    phase = float(rng.uniform(0, interval_s))
    rel = np.arange(phase, g.n - 1e-9, interval_s)
    idx = np.minimum(g.n - 1, rel.astype(int))
    keep = g.present[idx] & (rng.random(idx.size) >= drop_rate)
    for g0, g1 in gaps:
        keep &= ~((rel >= g0) & (rel < g1))
    rel, idx = rel[keep], idx[keep]
    ts = t0 + rel + rng.normal(0, 0.02, rel.size)
    a = g.act
    d = g.device
    mean = {k: _window_mean(v, idx, width) for k, v in a.items()}
    gr = _window_mean(np.maximum(a["duty"] * 0.97, a["sm"]), idx, width)
    cols: dict[str, np.ndarray] = {
        "gr_engine_active": gr,
        "sm_active": mean["sm"],
        "sm_occupancy": mean["occ"],
        "tensor_active": mean["tensor"],
        "dram_active": mean["dram"],
        "fp64_active": mean["fp64"],
        "fp32_active": mean["fp32"],
        "fp16_active": mean["fp16"],
        "pcie_tx_bytes_s": mean["pcie_tx"],
        "pcie_rx_bytes_s": mean["pcie_rx"],
        # Collectives move about as much as they receive: tx ~ rx with a little asymmetry.
        "nvlink_tx_bytes_s": mean["nvlink"] * d.nvlink_bytes_s,
        "nvlink_rx_bytes_s": mean["nvlink"] * d.nvlink_bytes_s * 0.985,
        "ib_tx_bytes_s": mean["ib"] * d.ib_bytes_s if d.ib_bytes_s else mean["ib"] * 0,
        "ib_rx_bytes_s": mean["ib"] * d.ib_bytes_s * 0.99 if d.ib_bytes_s else mean["ib"] * 0,
        "gpu_util": np.round(np.clip(a["duty"][idx], 0, 1) * 100) / 100,
        "mem_copy_util": np.round(np.clip(a["dram"][idx] * 0.92, 0, 1) * 100) / 100,
        "fb_used_bytes": np.floor(g.fb_used[idx] / MIB) * MIB,
        "fb_total_bytes": np.full(idx.size, d.memory_total_bytes),
        "power_w": np.round(ph.power_w[idx], 3),
        "energy_j": np.round(ph.energy_j[idx], 3),
        "temp_c": np.round(ph.temp_c[idx]),
        "sm_clock_mhz": np.round(ph.sm_clock_mhz[idx]),
        "mem_clock_mhz": ph.mem_clock_mhz[idx],
        "clock_event_reasons": ph.reasons[idx].astype(float),
        "xid_last": g.xid[idx],
        "ecc_dbe_volatile": ph.counters["ecc_dbe"][idx],
        "ecc_sbe_volatile": ph.counters["ecc_sbe"][idx],
        "row_remap_failure": g.row_remap_failure[idx],
        "nvlink_error_count": ph.counters["nvlink_err"][idx],
        "pcie_replay_count": ph.counters["pcie_replay"][idx],
    }
    names = FIELD_SETS[field_set]
    if not d.ib_bytes_s:
        names = tuple(f for f in names if f not in IB)
    if not d.nvlink_bytes_s:
        names = tuple(f for f in names if f not in ("nvlink_tx_bytes_s", "nvlink_rx_bytes_s"))
    out = {f: np.clip(cols[f], 0.0, None) for f in names}
    for f in ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active", "fp32_active",
              "fp16_active", "gr_engine_active"):
        if f in out:
            out[f] = np.clip(out[f], 0.0, 1.0)
    if profiling_paused:
        blank = np.zeros(rel.size, bool)
        for a0, b0 in profiling_paused:
            blank |= (rel >= a0) & (rel < b0)
        for f in PROFILING:
            if f in out:
                out[f] = np.where(blank, np.nan, out[f])
    return Rendered(ts, out)

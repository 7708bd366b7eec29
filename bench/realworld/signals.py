"""Per-second ground truth of one GPU: what its engines did each second (activity), what
memory it held, which counters moved, and the physics that follows from the activity
(power, clocks and their event reasons, die temperature, energy).

Scenarios write activity with ``fill`` (steady phases with correlated noise) and
``alternate`` (busy/idle cycles resolved at 0.1 s, so a second can be partly busy); ``physics``
then derives what NVML would read. ``render`` samples all of it at an interval.

Why per second: every sampler we model (NVML at 1 s, DCGM profiling averaged over its watch
interval, dcgm-exporter at 30 s, imported history at 60 s) can be expressed from 1 s truth, and
a 3-hour 8-GPU job is still only ~86k values per field."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .hardware import Device

# Activity fields (per-second means). "duty" is the share of the second a kernel ran: what
# NVML's utilization.gpu reports (a kernel running, however small: DCGM user guide).
ACTIVITY = ("duty", "sm", "occ", "tensor", "dram", "fp64", "fp32", "fp16", "pcie_rx", "pcie_tx", "nvlink", "ib")
RATIOS = frozenset(ACTIVITY) - {"pcie_rx", "pcie_tx", "nvlink", "ib"}
COUNTERS = ("ecc_sbe", "ecc_dbe", "nvlink_err", "pcie_replay")

# Clock event reason bits (NVML / DCGM field 112).
IDLE, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, POWER_BRAKE = 0x1, 0x4, 0x8, 0x20, 0x40, 0x80

Level = dict[str, float]
IDLE_LEVEL: Level = {}


def smooth_noise(rng: np.random.Generator, n: int, tau_s: float) -> np.ndarray:
    """Zero-mean, unit-variance noise correlated over ~``tau_s`` seconds (white noise through a
    causal exponential kernel): real counters wander, they do not jump independently each second."""
    if n <= 0:
        return np.zeros(0)
    w = rng.standard_normal(n + int(5 * tau_s) + 1)
    if tau_s <= 0.5:
        return w[:n]
    k = np.exp(-np.arange(int(5 * tau_s) + 1) / tau_s)
    k /= np.sqrt((k * k).sum())
    return np.convolve(w, k, mode="valid")[:n]


@dataclass
class GpuTruth:
    """One GPU over ``n`` seconds starting at the job's allocation start."""

    n: int
    device: Device
    rng: np.random.Generator
    act: dict[str, np.ndarray] = field(default_factory=dict)
    fb_used: np.ndarray = field(default_factory=lambda: np.zeros(0))
    present: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # False: the GPU does not answer
    clock_factor: np.ndarray = field(default_factory=lambda: np.zeros(0))  # forced slowdowns (faults)
    forced_reasons: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    counter_bumps: dict[str, np.ndarray] = field(default_factory=dict)
    counter_base: dict[str, float] = field(default_factory=dict)
    xid: np.ndarray = field(default_factory=lambda: np.zeros(0))
    row_remap_failure: np.ndarray = field(default_factory=lambda: np.zeros(0))
    events: list[tuple[float, str, int | None, str]] = field(default_factory=list)
    power_limit_w: float = 0.0
    cooling: float = 1.0  # multiplier on the temperature rise: > 1 is a blocked fan / hot aisle
    ambient_c: float = 28.0

    def __post_init__(self) -> None:
        n = self.n
        self.act = {k: np.zeros(n) for k in ACTIVITY}
        self.fb_used = np.full(n, 0.0)
        self.present = np.ones(n, bool)
        self.clock_factor = np.ones(n)
        self.forced_reasons = np.zeros(n, np.int64)
        self.counter_bumps = {k: np.zeros(n) for k in COUNTERS}
        # Counters count since the driver loaded: a node up for weeks shows old corrected errors.
        self.counter_base = {"ecc_sbe": float(self.rng.integers(0, 40)), "ecc_dbe": 0.0,
                             "nvlink_err": float(self.rng.integers(0, 30)),
                             "pcie_replay": float(self.rng.integers(0, 12))}
        # XID_ERRORS holds the LAST xid since driver load: an earlier job's application fault
        # (13, 31, 43) stays visible on a healthy GPU.
        stale = float(self.rng.choice([0, 0, 0, 13, 31, 43]))
        self.xid = np.full(n, stale)
        self.row_remap_failure = np.zeros(n)
        self.power_limit_w = self.device.tdp_w
        self.ambient_c = float(self.rng.uniform(24.0, 32.0))

    # --- activity -------------------------------------------------------------------------

    def _span(self, t0: float, t1: float) -> slice:
        a = max(0, min(self.n, round(t0)))
        b = max(a, min(self.n, round(t1)))
        return slice(a, b)

    def fill(self, t0: float, t1: float, level: Level, *, rel_noise: float = 0.04, tau_s: float = 20.0) -> None:
        """Seconds [t0, t1) run at ``level`` (fields not named are 0), each field wandering by
        ``rel_noise`` (relative) with correlation time ``tau_s``."""
        s = self._span(t0, t1)
        m = s.stop - s.start
        if m == 0:
            return
        for k in ACTIVITY:
            v = level.get(k, 0.0)
            if v == 0.0:
                self.act[k][s] = 0.0
                continue
            x = v * (1.0 + rel_noise * smooth_noise(self.rng, m, tau_s))
            self.act[k][s] = np.clip(x, 0.0, 1.0) if k in RATIOS else np.maximum(x, 0.0)

    def alternate(self, t0: float, t1: float, busy: Level, idle: Level, *, period_s: float, busy_share: float,
                  jitter: float = 0.3, rel_noise: float = 0.04) -> None:
        """Busy/idle cycles of ~``period_s`` (lognormal jitter) with ``busy_share`` busy, resolved at
        0.1 s: each second holds the busy fraction of its ten ticks, so a 1 s sample of a 3 s
        cycle is already partly averaged, as NVML's and DCGM's windows are."""
        s = self._span(t0, t1)
        m = s.stop - s.start
        if m == 0:
            return
        ticks = np.zeros(m * 10, bool)
        pos = int(self.rng.integers(0, max(1, int(period_s * 10))))
        while pos < ticks.size:
            p = period_s * float(np.exp(self.rng.normal(0, jitter)))
            b = max(1, round(p * busy_share * 10 * float(np.exp(self.rng.normal(0, jitter / 2)))))
            ticks[pos:pos + b] = True
            pos += max(b + 1, round(p * 10))
        frac = ticks.reshape(m, 10).mean(axis=1)
        self.mix(t0, t1, frac, busy, idle, rel_noise=rel_noise)

    def mix(self, t0: float, t1: float, frac: np.ndarray, busy: Level, idle: Level, *, rel_noise: float = 0.04) -> None:
        """Each second is ``frac`` busy: its values are the time-weighted mix of the two levels."""
        s = self._span(t0, t1)
        m = s.stop - s.start
        frac = np.asarray(frac, float)[:m]
        for k in ACTIVITY:
            b, i = busy.get(k, 0.0), idle.get(k, 0.0)
            if b == 0.0 and i == 0.0:
                self.act[k][s] = 0.0
                continue
            bn = b * (1.0 + rel_noise * smooth_noise(self.rng, m, 15.0))
            x = frac * bn + (1.0 - frac) * i
            self.act[k][s] = np.clip(x, 0.0, 1.0) if k in RATIOS else np.maximum(x, 0.0)

    def memory(self, t0: float, t1: float, used_bytes: float, *, wobble_bytes: float = 0.0) -> None:
        """Framebuffer in use over [t0, t1): allocators grow in steps and keep what they took, so
        the wobble is small and positive."""
        s = self._span(t0, t1)
        m = s.stop - s.start
        w = np.abs(smooth_noise(self.rng, m, 120.0)) * wobble_bytes if wobble_bytes else 0.0
        self.fb_used[s] = np.clip(used_bytes + w, 0, self.device.memory_total_bytes)

    def gone(self, t0: float, t1: float | None = None) -> None:
        """The GPU stops answering (fell off the bus, driver wedged): no samples at all."""
        self.present[self._span(t0, self.n if t1 is None else t1)] = False

    def slow(self, t0: float, t1: float, factor: float, reasons: int) -> None:
        s = self._span(t0, t1)
        self.clock_factor[s] = np.minimum(self.clock_factor[s], factor)
        self.forced_reasons[s] |= reasons

    def bump(self, counter: str, t: float, count: float) -> None:
        i = min(self.n - 1, max(0, int(t)))
        self.counter_bumps[counter][i] += count

    def xid_event(self, t: float, code: int, message: str) -> None:
        i = min(self.n - 1, max(0, int(t)))
        self.xid[i:] = code
        self.events.append((float(t), "xid", code, message))


@dataclass
class Physics:
    """What NVML reads per second, derived from the activity."""

    power_w: np.ndarray
    sm_clock_mhz: np.ndarray
    mem_clock_mhz: np.ndarray
    reasons: np.ndarray
    temp_c: np.ndarray
    energy_j: np.ndarray
    counters: dict[str, np.ndarray]


def physics(g: GpuTruth) -> Physics:
    """Board power follows the engines (a busy tensor pipe and HBM draw the most, a kernel that
    merely spins draws little); a demand above the power limit lowers the clock until it fits
    (reason 0x4, the normal state of LLM training on H100s); an idle GPU drops to its idle clock
    (reason 0x1); the die temperature is a first-order lag (~45 s) on power plus a slow random
    walk, and above the slowdown temperature software thermal slowdown (0x20) cuts the clock."""
    d, a, n, rng = g.device, g.act, g.n, g.rng
    load = (0.22 * a["duty"] + 0.30 * a["sm"] + 0.32 * a["tensor"] + 0.20 * a["dram"] + 0.25 * a["fp64"]
            + 0.08 * a["fp32"])
    demand = d.idle_w + (d.tdp_w - d.idle_w) * np.clip(load, 0.0, 1.2) * (1.0 + 0.015 * smooth_noise(rng, n, 3.0))
    limit = g.power_limit_w
    over = demand > limit
    clock = np.full(n, d.max_sm_clock_mhz)
    clock = np.where(over, d.max_sm_clock_mhz * (limit / np.maximum(demand, 1.0)) ** 0.75, clock)
    power = np.where(over, limit * (1.0 - 0.006 * np.abs(smooth_noise(rng, n, 2.0))), demand)
    reasons = np.where(over, SW_POWER_CAP, 0).astype(np.int64)
    # Temperature: first-order lag on power, healthy cooling unless the scenario says otherwise.
    steady = g.ambient_c + d.c_per_w * g.cooling * power
    k = np.exp(-np.arange(300) / 45.0)
    k /= k.sum()
    padded = np.concatenate([np.full(299, steady[0] if n else 0.0), steady])
    temp = np.convolve(padded, k[::-1], mode="valid")[:n] if n else steady
    temp = temp + 0.8 * smooth_noise(rng, n, 300.0)
    hot = temp > d.slowdown_temp_c
    thermal_factor = np.where(hot, np.clip(1.0 - 0.035 * (temp - d.slowdown_temp_c), 0.55, 1.0), 1.0)
    reasons = np.where(hot, reasons | SW_THERMAL, reasons)
    reasons = np.where(temp > d.slowdown_temp_c + 6.0, reasons | HW_THERMAL, reasons)
    clock = clock * thermal_factor * g.clock_factor
    reasons = reasons | g.forced_reasons
    # A slower clock at the same work draws less power.
    power = np.minimum(power, d.idle_w + (power - d.idle_w) * np.minimum(1.0, g.clock_factor * thermal_factor) ** 1.5)
    idle = a["duty"] < 0.02
    clock = np.where(idle, d.idle_sm_clock_mhz, clock)
    reasons = np.where(idle, (reasons & ~SW_POWER_CAP) | IDLE, reasons)
    clock = clock + rng.normal(0.0, 4.0, n) * ~idle  # boost steps of a few MHz
    energy = float(rng.uniform(5e7, 4e10)) + np.cumsum(power)
    counters = {c: g.counter_base[c] + np.cumsum(g.counter_bumps[c]) for c in COUNTERS}
    return Physics(np.clip(power, 0, None), np.clip(clock, 0, None), np.full(n, d.mem_clock_mhz),
                   reasons, temp, energy, counters)

"""Per-minute features -> per-window (G x K) views, and episode finding (pure numpy).

Every condition is judged per aligned window (``window_s``, default 5 min) so one noisy
minute never decides, and a flag needs an episode of consecutive windows at least
``min_duration_s`` long, so short blips never flag."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .features import MinuteFeatures, median1d

__all__ = ["median1d"]  # (kept here too: the detectors take their helpers from windows)


@dataclass(frozen=True)
class WindowFeatures:
    """Per-GPU, per-window (G x K) features the detectors judge; NaN = not measured there.
    Means weighted by samples; ``busy_sm``/``clock_busy``/``throttle_frac`` over busy samples."""

    sm: np.ndarray  # sm_active
    occ: np.ndarray  # sm_occupancy
    tensor: np.ndarray  # tensor_active
    dram: np.ndarray  # dram_active
    gpu_util: np.ndarray  # NVML utilisation: share of time a kernel ran
    fp32: np.ndarray
    fp64: np.ndarray
    power: np.ndarray  # W
    clock: np.ndarray  # SM clock, MHz
    nvl_tx: np.ndarray  # bytes/s
    nvl_rx: np.ndarray
    ib_tx: np.ndarray
    ib_rx: np.ndarray
    pcie_rx: np.ndarray  # host -> GPU bytes/s
    busy_frac: np.ndarray  # share of raw samples with sm_active >= busy_sm_active
    busy_sm: np.ndarray  # sm_active while busy
    clock_busy: np.ndarray  # SM clock while busy
    throttle_frac: np.ndarray  # share of busy samples with a throttle reason
    throttle_reasons: np.ndarray  # throttle reason bits (clock_event_reasons) seen while busy, OR-ed; 0 = none
    trans_rate: np.ndarray  # busy<->idle switches per minute
    fb_used_max: np.ndarray  # bytes
    fb_total: np.ndarray  # bytes


@dataclass
class Windows:
    """Window views of one job's features. Shapes: (G, K) unless noted."""

    w_min: int  # minutes per window
    b0: int  # first minute
    k: int  # number of windows
    obs_s: np.ndarray  # observed GPU-seconds per GPU-window
    valid: np.ndarray  # enough coverage to judge
    f: WindowFeatures
    # (G,) per sample-weighted feature (BY_SAMPLES): measured in at least one valid window
    # (what Coverage asks, taken in one call on the stacked means).
    seen: dict[str, np.ndarray] = field(default_factory=dict)

    def t0(self, k: int) -> float:
        return float((self.b0 + k * self.w_min) * 60)

    def t1(self, k: int) -> float:
        return float((self.b0 + (k + 1) * self.w_min) * 60)


_FMAX = float(np.finfo(np.float64).max)


def nz_lt(x: np.ndarray, c: float, nan: float = 0.0) -> np.ndarray:
    """``nz(x, nan) < c`` without making ``nz(x)``: for a finite threshold, an infinity compares
    as the largest finite float it would become."""
    if not -_FMAX < c < _FMAX:
        return nz(x, nan) < c
    out = x < c
    return out | np.isnan(x) if nan < c else out


def nz_ge(x: np.ndarray, c: float, nan: float = 0.0) -> np.ndarray:
    """``nz(x, nan) >= c`` without making ``nz(x)`` (as ``nz_lt``)."""
    if not -_FMAX < c < _FMAX:
        return nz(x, nan) >= c
    out = x >= c
    return out | np.isnan(x) if nan >= c else out


def _reshape(x: np.ndarray, w: int, fill: float) -> np.ndarray:
    """(..., M) -> (..., K, w): minutes into windows of ``w``, the last padded with ``fill``."""
    m = x.shape[-1]
    k = -(-m // w) if m else 0
    pad = k * w - m
    if pad:
        x = np.concatenate([x, np.full((*x.shape[:-1], pad), fill)], axis=-1)
    return x.reshape(*x.shape[:-1], k, w)


def window_sum(x: np.ndarray, w: int) -> np.ndarray:
    """``_reshape(x, w, 0.0).sum(axis=-1)``, exactly, at a fraction of its cost: a float sum
    over fewer than 8 values is numpy's plain loop from 0.0 (its pairwise blocks start at 8),
    so the window's minutes added in order, then 0.0 (which only turns -0.0 into 0.0), are
    the same float; summing a 5-long axis costs numpy ~6x these few whole-array adds."""
    r = _reshape(x, w, 0.0)
    if not 1 < w < 8 or r.dtype != np.float64:
        return r.sum(axis=-1)
    s = r[..., 0] + r[..., 1]
    for j in range(2, w):
        s += r[..., j]
    s += 0.0
    return s


def window_fmax(x: np.ndarray, w: int) -> np.ndarray:
    """``np.fmax.reduce`` over each window's minutes (padding NaN), taken as whole-array fmax of
    the minutes in order (numpy's loop order for a short axis; fmax of numbers is exact)."""
    r = _reshape(x, w, np.nan)
    if not 1 < w < 8:
        return np.fmax.reduce(r, axis=-1)
    s = np.fmax(r[..., 0], r[..., 1])
    for j in range(2, w):
        np.fmax(s, r[..., j], out=s)
    return s


def wmean(x: np.ndarray, weight: np.ndarray, w: int) -> np.ndarray:
    """Weighted mean per window of (..., G, M) ``x`` (several features stacked on the leading
    axis share one call: a job's windows cost a few large numpy calls, not one per feature)."""
    ok = ~np.isnan(x) & (weight > 0)
    xs = window_sum(np.where(ok, x * weight, 0.0), w)
    ws = window_sum(np.where(ok, weight, 0.0), w)
    # (no np.errstate: the divisor is positive or 1.0, so nothing here can warn; NaN never does)
    return np.where(ws > 0, xs / np.where(ws > 0, ws, 1.0), np.nan)


def wmax(x: np.ndarray, w: int) -> np.ndarray:
    return window_fmax(x, w)


def wsum(x: np.ndarray, w: int) -> np.ndarray:
    return window_sum(nz(x), w)


def nz(x: np.ndarray | float, nan: float = 0.0) -> np.ndarray:
    """``np.nan_to_num(x, nan=nan)`` (infinities to the largest finite floats too), exactly, in
    a third of its time: np.nan_to_num is several Python-level numpy calls, and a job's
    analysis makes dozens of these on small arrays."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        return x.copy()
    y = np.where(np.isnan(x), nan, x)
    return np.nan_to_num(y) if np.logical_or.reduce(np.isinf(y), axis=None) else y  # (.any()'s, unwrapped)


# Window means weighted by samples, and by busy samples (the "while busy" features).
BY_SAMPLES = ("sm", "occ", "tensor", "dram", "gpu_util", "fp32", "fp64", "power", "clock",
              "nvl_tx", "nvl_rx", "ib_tx", "ib_rx", "pcie_rx", "busy_frac")
BY_BUSY = ("busy_sm", "clock_busy", "throttle_frac")


def build_windows(feats: MinuteFeatures, window_s: float, min_coverage: float) -> Windows:
    w = max(1, round(window_s / 60))
    n = feats.n
    f = feats.f
    nb = nz(f["nb"])
    out: dict[str, np.ndarray] = {}
    # Both kinds of means in one call, each feature beside its own weights (the same arithmetic
    # per element as a call per weight: two calls were ~20 numpy calls more per job). Features
    # are stacked with np.array (np.stack's result, at a third of its cost for a job's arrays).
    ns = len(BY_SAMPLES)
    weights = np.array([n] * ns + [nb] * len(BY_BUSY))  # (np.broadcast_to's Python layers cost more than the copy)
    means = wmean(np.array([f[name] for name in (*BY_SAMPLES, *BY_BUSY)]), weights, w)
    by_samples = means[:ns]
    out.update(zip((*BY_SAMPLES, *BY_BUSY), means, strict=True))
    # Transitions per minute, over the minutes that had raw samples to count them in (the
    # window sums side by side in one call, as the maxima below).
    trans_minutes, trans, n_sum = wsum(np.array([(~np.isnan(f["trans"])).astype(np.float64), f["trans"], n]), w)
    # (no np.errstate: the divisor is at least 1, so nothing here can warn)
    out["trans_rate"] = np.where(trans_minutes > 0, trans / np.maximum(trans_minutes, 1), np.nan)
    bits = _reshape(nz(f["reasons_or"]).astype(np.int64), w, 0)
    ors = np.bitwise_or.reduce(bits, axis=-1) if w == 1 else bits[..., 0] | bits[..., 1]
    for j in range(2, w):  # (the window's minutes OR-ed side by side, as window_sum adds them)
        ors |= bits[..., j]
    out["throttle_reasons"] = ors.astype(np.float64)
    out["fb_used_max"], out["fb_total"] = wmax(np.array([f["fb_used_max"], f["fb_total"]]), w)
    obs = np.minimum(n_sum * feats.interval_s, w * 60.0)
    valid = obs >= min_coverage * w * 60.0
    seen = dict(zip(BY_SAMPLES, (valid & ~np.isnan(by_samples)).any(axis=-1), strict=True))
    return Windows(w_min=w, b0=feats.b0, k=obs.shape[1], obs_s=obs, valid=valid, f=WindowFeatures(**out), seen=seen)


def masked_median(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Median over GPUs (axis 0) of the masked, non-NaN entries; NaN where none.
    (np.nanmedian goes through masked arrays for small inputs: 50x slower here.)"""
    if x.ndim == 1:
        x, mask = x[:, None], np.broadcast_to(mask, x.shape)[:, None]
    if x.shape[0] == 0:
        return np.full(x.shape[1], np.nan)
    v = np.where(mask, x, np.nan)
    if x.shape[0] == 1:  # one GPU: its own value ((a + a) / 2 == a, as below)
        return v[0]
    s = np.sort(v, axis=0)  # NaN sorts last
    n = s.shape[0] - np.add.reduce(np.isnan(s), axis=0)  # (.sum(axis=0)'s count, unwrapped)
    cols = np.arange(s.shape[1])
    a = s[np.maximum(n - 1, 0) // 2, cols]
    b = s[np.minimum(n // 2, s.shape[0] - 1), cols]
    return np.where(n > 0, (a + b) / 2.0, np.nan)


def share(cond: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Share of the masked GPUs meeting ``cond`` per window (0 where none are masked)."""
    den = mask.sum(axis=0)
    return np.where(den > 0, (cond & mask).sum(axis=0) / np.maximum(den, 1), 0.0)


@dataclass(frozen=True, slots=True)
class Episode:
    k0: int  # first window
    k1: int  # one past the last window
    windows: int  # valid windows inside


def episodes(mask: np.ndarray, valid: np.ndarray) -> list[Episode]:
    """Runs of ``mask`` over the valid windows; invalid (uncovered) windows neither break
    nor extend a run, so a gap in the data does not split an episode."""
    idx = np.flatnonzero(valid).tolist()
    m = mask.tolist()  # Python bools: indexing a numpy array per window costs more than the loop
    out: list[Episode] = []
    start = None
    count = 0
    last = -1
    for k in idx:
        if m[k]:
            if start is None:
                start, count = k, 0
            count += 1
            last = k
        elif start is not None:
            out.append(Episode(start, last + 1, count))
            start = None
    if start is not None:
        out.append(Episode(start, last + 1, count))
    return out


@dataclass(frozen=True, slots=True)
class Detection:
    episodes: list[Episode]
    ongoing: bool  # the last qualifying episode reaches the last valid window
    flagged_s: float
    judged_s: float


def detect(mask: np.ndarray, valid_k: np.ndarray, window_s: float, min_duration_s: float,
           min_fraction: float = 0.0) -> Detection | None:
    """A flag when episodes of at least ``min_duration_s`` cover ``min_fraction`` of the judged
    time, or one such episode is still going on and has lasted twice the minimum."""
    eps = [e for e in episodes(mask, valid_k) if e.windows * window_s >= min_duration_s]
    if not eps:
        return None
    judged = float(valid_k.sum()) * window_s
    flagged = sum(e.windows for e in eps) * window_s
    last_valid = int(np.flatnonzero(valid_k)[-1])
    ongoing = eps[-1].k1 == last_valid + 1
    frac_ok = judged > 0 and flagged / judged >= min_fraction
    long_ongoing = ongoing and eps[-1].windows * window_s >= 2 * min_duration_s
    if not (frac_ok or long_ongoing):
        return None
    return Detection(eps, ongoing, flagged, judged)


def episode_mask(det: Detection, k: int) -> np.ndarray:
    m = np.zeros(k, dtype=bool)
    for e in det.episodes:
        m[e.k0:e.k1] = True
    return m

"""The analysis' fast replacements for numpy calls give numpy's answers bit for bit (reports must
not change when the analysis gets cheaper): nz / nz_lt / nz_ge for nan_to_num, median1d for
np.median, workload._percentile for np.percentile, hist_quantiles for hist_quantile (and its
integer path for numpy's), window_sum / window_fmax for a reshaped axis' reductions, Coverage's
counts taken at once, the JobView's cached medians for masked_median, and from_states' reshape
for its scatter."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.analysis.config import load_thresholds
from gpufleet.analysis.detectors.base import _COVERAGE_OF, CounterMinutes, Coverage, JobContext, JobView, MinuteSignals
from gpufleet.analysis.features import READ_COLUMNS, _hist_quantiles_np, from_states, hist_quantile, hist_quantiles
from gpufleet.analysis.windows import (
    _reshape,
    build_windows,
    masked_median,
    median1d,
    nz,
    nz_ge,
    nz_lt,
    window_fmax,
    window_sum,
)
from gpufleet.analysis.workload import _percentile
from gpufleet.storage.minute_features import fold

RNG = np.random.default_rng(16)


def _messy(shape: tuple[int, ...]) -> np.ndarray:
    x = RNG.random(shape) * 2 - 0.5
    x[RNG.random(shape) < 0.2] = np.nan
    x[RNG.random(shape) < 0.05] = np.inf
    x[RNG.random(shape) < 0.05] = -np.inf
    return x


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def test_nz_is_nan_to_num() -> None:
    for _ in range(300):
        x = _messy((3, 7))
        for nan in (0.0, 1.0):
            assert _same(nz(x, nan), np.nan_to_num(x, nan=nan))
            for c in (0.0, 0.5, 1.0, 1.5, -0.2, np.inf, -np.inf, float(np.finfo(np.float64).max)):
                assert _same(nz_lt(x, c, nan), np.nan_to_num(x, nan=nan) < c)
                assert _same(nz_ge(x, c, nan), np.nan_to_num(x, nan=nan) >= c)
    b = RNG.random(5) > 0.5
    assert _same(nz(b), np.nan_to_num(b))
    assert float(nz(np.float64("nan"))) == 0.0


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 64, 65, 200, 1001])
def test_median1d_is_np_median(n: int) -> None:
    for _ in range(50):
        x = RNG.random(n) * RNG.choice([1.0, 1e-3, 7e9])
        if RNG.random() < 0.3:
            x = np.round(x, 1)  # ties
        assert median1d(x) == float(np.median(x))


def test_percentile_is_np_percentile() -> None:
    for _ in range(3000):
        n = int(RNG.integers(1, 40))
        x = np.round(RNG.random(n), int(RNG.integers(1, 6)))
        s = sorted(x.tolist())
        assert _percentile(s, 90 / 100) == float(np.percentile(x, 90))
        assert _percentile(s, 10 / 100) == float(np.percentile(x, 10))


def test_hist_quantiles_are_hist_quantile() -> None:
    for _ in range(200):
        h = RNG.integers(0, 50, 100) * (RNG.random(100) < 0.3)
        assert hist_quantiles(h, (0.5, 0.95)) == [hist_quantile(h, 0.5), hist_quantile(h, 0.95)]
    assert hist_quantiles(np.zeros(100, dtype=np.int64), (0.5, 0.95)) == [None, None]


def test_active_medians_are_masked_medians() -> None:
    th = load_thresholds()
    for g in (1, 2, 5, 8):
        states = _states(g, 30, drop=0.2)
        feats = from_states(states, list(range(g)))
        w = build_windows(feats, th.general.window_s, th.general.min_window_coverage)
        ctx = JobContext([f"GPU-{i}" for i in range(g)], [f"n{i // 4}" for i in range(g)], None, th.model(None),
                         0.0, 1.0)
        job = JobView(w, CounterMinutes.of(feats), MinuteSignals.of(feats), ctx, th, [])
        f = w.f
        xs = (f.sm, f.tensor, f.dram, f.busy_frac)
        got = job.active_medians(*xs)  # asked together: one call
        for x, m in zip(xs, got, strict=True):
            assert _same(m, masked_median(x, job.active))
        assert job.active_medians(f.sm)[0] is got[0]  # cached
        assert _same(job.active_medians(f.occ)[0], masked_median(f.occ, job.active))


def _states(g: int, minutes: int, drop: float = 0.0) -> np.ndarray:
    steps = minutes * 60
    ts = np.tile(1_790_000_000.0 + np.arange(steps, dtype=np.float64), g)
    gpu = np.repeat(np.arange(g), steps)
    n = len(ts)
    cols = {"sm_active": RNG.random(n), "gpu_util": RNG.random(n), "tensor_active": RNG.random(n) * 0.1,
            "dram_active": RNG.random(n), "sm_clock_mhz": RNG.uniform(300, 2000, n),
            "clock_event_reasons": RNG.choice([0.0, 4.0, 64.0], n), "power_w": RNG.uniform(100, 700, n),
            "fb_used_bytes": np.full(n, 4e10), "fb_total_bytes": np.full(n, 8e10)}
    cols["sm_active"][RNG.random(n) < 0.1] = np.nan
    if drop:
        gone = (gpu == g - 1) & (ts > ts[0] + steps / 2)  # the last GPU stops reporting half way
        keep = ~gone & (RNG.random(n) > drop / 10)
        ts, gpu, cols = ts[keep], gpu[keep], {k: v[keep] for k, v in cols.items()}
    f = fold(ts, gpu, np.zeros(len(ts), np.int64), cols)
    return np.column_stack([{"bucket": f.bucket, "gpu_pk": f.gpu_pk, **f.cols}[c] for c in READ_COLUMNS])


@pytest.mark.parametrize("g", [1, 3, 8])
def test_from_states_reshape_is_its_scatter(g: int) -> None:
    rows = _states(g, 12)
    fast = from_states(rows, list(range(g)))  # every GPU every minute, in (minute, GPU) order
    slow = from_states(rows[RNG.permutation(len(rows))], list(range(g)))  # shuffled: the scatter
    assert fast.b0 == slow.b0 and fast.interval_s == slow.interval_s
    assert _same(fast.n, slow.n)
    assert fast.f.keys() == slow.f.keys()
    for k in fast.f:
        assert _same(fast.f[k], slow.f[k]), k
        assert fast.f[k].flags.c_contiguous


@pytest.mark.parametrize("w", [1, 2, 5, 7, 8, 12])
def test_window_reductions_are_numpys(w: int) -> None:
    """window_sum / window_fmax (adds and fmax of a window's minutes side by side) give the
    reshaped axis' sum / fmax.reduce bit for bit: NaN, infinities, -0.0 and a padded last window."""
    for m in (1, w, 3 * w, 3 * w + 1, 61):
        for _ in range(20):
            x = _messy((4, 3, m))
            x[RNG.random(x.shape) < 0.1] = -0.0
            with np.errstate(invalid="ignore"):  # (inf + -inf: both warn)
                assert _same(window_sum(x, w), _reshape(x, w, 0.0).sum(axis=-1))
            z = np.where(RNG.random(x.shape) < 0.5, -0.0, 0.0)  # all-zero windows keep sum's sign of zero
            assert _same(window_sum(z, w), _reshape(z, w, 0.0).sum(axis=-1))
            assert np.array_equal(np.signbit(window_sum(z, w)), np.signbit(_reshape(z, w, 0.0).sum(axis=-1)))
            y = np.abs(x)  # (fmax of numbers is exact whatever the order; the sign of a zero tie is not asked)
            assert _same(window_fmax(y, w), np.fmax.reduce(_reshape(y, w, np.nan), axis=-1))


def test_int_hist_quantiles_are_numpys() -> None:
    """The integer-bins path (Python ints, bisect) answers what numpy's running sum does."""
    qs = (0.5, 0.95, 0.0, 1.0, 0.01)
    for k in range(3000):
        h = RNG.integers(0, (1, 5, 1000, 10**12)[k % 4], 100)
        if k % 5 == 0:
            h[: int(RNG.integers(0, 100))] = 0
        if k % 7 == 0:
            h[:] = 0
            h[int(RNG.integers(0, 100))] = int(RNG.integers(0, 3))
        assert hist_quantiles(h, qs) == _hist_quantiles_np(h, qs)
        assert hist_quantiles(h.astype(np.float64), qs) == _hist_quantiles_np(h, qs)
    neg = RNG.integers(-5, 50, 100)
    assert hist_quantiles(neg, qs) == _hist_quantiles_np(neg, qs)  # (not counts: numpy's path)
    assert hist_quantiles(np.zeros(0, dtype=np.int64), qs) == [None] * len(qs)


def test_coverage_counts_are_per_signal_sums() -> None:
    th = load_thresholds()
    for g in (1, 3, 8):
        feats = from_states(_states(g, 30, drop=0.3), list(range(g)))
        for name in ("sm", "gpu_util", "power"):
            feats.f[name][RNG.random(feats.f[name].shape) < 0.5] = np.nan
        w = build_windows(feats, th.general.window_s, th.general.min_window_coverage)
        cov = Coverage.of(w)
        js = cov.as_json()
        for signal, attr in _COVERAGE_OF.items():
            assert js[signal] == int(getattr(cov, attr).sum())
            assert cov.has(signal) == bool(getattr(cov, attr).any())


def test_model_limits_looked_up_once_per_name() -> None:
    th = load_thresholds()
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla T4", None):
        got = th.model(name)
        assert got == th._model(name) and th.model(name) is got
    assert th.model("NVIDIA A100-SXM4-80GB") != th.model("NVIDIA H100 80GB HBM3")  # (each name its own entry)

"""The ingest fold (storage.minute_features) equals the pure reference (analysis.features.
minute_features / histograms) on the same rows: folded whole, folded batch by batch in order,
reversed, shuffled and with late batches, through the pure merge and through the database's
upsert (SQLite and PostgreSQL); and the merge's one inexact case is counted, not hidden."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.analysis.config import load_thresholds
from gpufleet.analysis.detectors import hw_fault, throttled
from gpufleet.analysis.features import (
    ALL_FEATURES,
    HIST_BINS,
    HIST_FIELDS,
    READ_COLUMNS,
    from_states,
    histograms,
    minute_features,
)
from gpufleet.storage.minute_features import STATE, Folded, fold, fold_params, merge_folded

T0 = 1_790_000_000.0


def _rows(seed: int, n_gpus: int = 3, seconds: int = 300) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    ts = np.repeat(T0 + 7 + np.arange(seconds, dtype=np.float64), n_gpus)
    gpu = np.tile(np.arange(n_gpus), seconds)
    n = len(ts)
    # busy/idle alternation with runs, so switches land on batch and minute boundaries
    sm = np.where(rng.random(n) < 0.5, rng.uniform(0.3, 0.9, n), rng.uniform(0.0, 0.05, n))
    sm[rng.random(n) < 0.05] = np.nan  # some samples lack sm_active
    cols = {
        "sm_active": sm, "sm_occupancy": rng.uniform(0, 1, n), "tensor_active": rng.uniform(0, 1, n),
        "dram_active": rng.uniform(0, 1, n), "gpu_util": rng.uniform(0, 1, n), "power_w": rng.uniform(100, 700, n),
        "sm_clock_mhz": np.where(rng.random(n) < 0.1, np.nan, rng.uniform(1000, 1980, n)),
        "clock_event_reasons": rng.choice([0.0, 4.0, 8.0, 1.0, np.nan], n),
        "fb_used_bytes": rng.uniform(1e9, 8e10, n), "fb_total_bytes": np.full(n, 8e10),
        "xid_last": rng.choice([0.0, 0.0, 0.0, 13.0, 79.0], n),
        "ecc_dbe_volatile": np.cumsum(rng.random(n) < 0.01).astype(np.float64),
        "nvlink_tx_bytes_s": rng.uniform(0, 1e10, n),
    }
    return ts, gpu, cols


def _params_match_thresholds() -> None:
    th = load_thresholds()
    p = fold_params()
    assert p.busy_sm_active == th.general.busy_sm_active
    assert p.throttle_mask == th.get(throttled.Config).reasons_mask
    assert p.critical_xids == tuple(th.get(hw_fault.Config).critical_xids)


def test_fold_parameters_are_the_detectors_defaults() -> None:
    # storage/fold.toml (what ingest folds with) and analysis/thresholds.toml agree by default.
    _params_match_thresholds()


def _reference(ts: np.ndarray, gpu: np.ndarray, cols: dict[str, np.ndarray], g: int):  # type: ignore[no-untyped-def]
    p = fold_params()
    return minute_features(ts, gpu, cols, g, busy_sm_active=p.busy_sm_active, throttle_mask=p.throttle_mask,
                           critical_xids=p.critical_xids)


def _as_rows(f: Folded) -> np.ndarray:
    cols = {"bucket": f.bucket, "gpu_pk": f.gpu_pk.astype(np.float64), **f.cols}
    return np.column_stack([cols[c] for c in READ_COLUMNS]) if len(f) else np.zeros((0, len(READ_COLUMNS)))


def _hist_of(f: Folded) -> dict[str, np.ndarray]:
    tot = f.hist.sum(axis=0)
    return {name: tot[i * HIST_BINS:(i + 1) * HIST_BINS] for i, name in enumerate(HIST_FIELDS)}


def _assert_same(ref, got, *, exact: bool) -> None:  # type: ignore[no-untyped-def]
    assert got.b0 == ref.b0 and got.shape == ref.shape
    np.testing.assert_array_equal(got.n, ref.n)
    for k in ALL_FEATURES:
        if exact:
            np.testing.assert_array_equal(got.f[k], ref.f[k], err_msg=k)
        else:  # sums of partial sums: the same to float rounding
            np.testing.assert_allclose(got.f[k], ref.f[k], rtol=1e-12, atol=0, equal_nan=True, err_msg=k)
    assert got.interval_s == ref.interval_s


def _fold_batches(ts, gpu, cols, windows: list[int], width: float = 10.0) -> Folded:  # type: ignore[no-untyped-def]
    job = np.zeros(len(ts), np.int64)
    out: Folded | None = None
    for w in windows:
        m = (ts >= T0 + w * width) & (ts < T0 + (w + 1) * width)
        f = fold(ts[m], gpu[m], job[m], {k: v[m] for k, v in cols.items()})
        out = f if out is None else merge_folded(out, f)
    assert out is not None
    return out


def test_one_fold_equals_the_reference_bit_for_bit() -> None:
    ts, gpu, cols = _rows(1)
    order = np.random.default_rng(5).permutation(len(ts))  # rows in any order
    ts, gpu, cols = ts[order], gpu[order], {k: v[order] for k, v in cols.items()}
    f = fold(ts, gpu, np.zeros(len(ts), np.int64), cols)
    _assert_same(_reference(ts, gpu, cols, 3), from_states(_as_rows(f), [0, 1, 2]), exact=True)
    ref_h = histograms(cols)
    for k, v in _hist_of(f).items():
        np.testing.assert_array_equal(v, ref_h[k])
    assert not f.cols["interior"].any()


@pytest.mark.parametrize("arrival", ["in_order", "reversed", "late_minutes", "shuffled_edges"])
def test_batches_in_any_outside_order_merge_exactly(arrival: str) -> None:
    ts, gpu, cols = _rows(2)
    n_win = 31  # 10 s windows over 307 s
    windows = list(range(n_win))
    if arrival == "reversed":
        windows = windows[::-1]
    elif arrival == "late_minutes":  # two whole minutes (T0 is 20 s into a minute) after everything else
        windows = [w for w in windows if not 4 <= w < 16] + list(range(4, 16))
    elif arrival == "shuffled_edges":  # each batch before or after all stored ones, never inside
        windows = [15, 16, 14, 17, 13, 18, 12, 19, 11, 20, 10, 21, 9, 22, 8, 23, 7, 24, 6, 25, 5, 26, 4, 27, 3,
                   28, 2, 29, 1, 30, 0]
    f = _fold_batches(ts, gpu, cols, windows)
    assert not f.cols["interior"].any()
    _assert_same(_reference(ts, gpu, cols, 3), from_states(_as_rows(f), [0, 1, 2]), exact=False)
    ref_h = histograms(cols)
    for k, v in _hist_of(f).items():
        np.testing.assert_array_equal(v, ref_h[k])


def test_a_batch_landing_inside_a_minute_is_counted_as_interior() -> None:
    ts, gpu, cols = _rows(3)
    # window 1 (10-20 s) arrives after windows 0 and 2 of the same minute
    f = _fold_batches(ts, gpu, cols, [0, 2, 1, 3, 4, 5])
    b = np.unique(f.bucket)
    first_minute = f.bucket == b.min()
    assert (f.cols["interior"][first_minute] == 1).all()
    assert not f.cols["interior"][~first_minute].any()
    # everything but the switch count is still exact
    m = (ts < T0 + 60)
    ref = _reference(ts[m], gpu[m], {k: v[m] for k, v in cols.items()}, 3)
    got = from_states(_as_rows(f), [0, 1, 2])
    for k in ALL_FEATURES:
        if k != "trans":
            np.testing.assert_allclose(got.f[k][:, :ref.shape[1]], ref.f[k], rtol=1e-12, equal_nan=True, err_msg=k)


def test_missing_signals_stay_unknown() -> None:
    ts = T0 + np.arange(120, dtype=np.float64)
    f = fold(ts, np.zeros(120, np.int64), np.zeros(120, np.int64), {"sm_active": np.full(120, 0.5)})
    got = from_states(_as_rows(f), [0])
    assert np.isnan(got.f["power"]).all() and np.isnan(got.f["fb_used_max"]).all()  # never reported: NaN, not 0
    assert np.isnan(got.f["clock_busy"]).all() and np.isnan(got.f["throttle_frac"]).all()
    assert (got.f["busy_frac"] == 1.0).all() and got.n.sum() == 120


def test_rows_without_a_job_are_not_folded() -> None:
    ts = T0 + np.arange(10, dtype=np.float64)
    f = fold(ts, np.zeros(10, np.int64), np.full(10, -1, np.int64), {"sm_active": np.full(10, 0.5)})
    assert len(f) == 0 and f.hist.shape == (0, len(HIST_FIELDS) * HIST_BINS)
    assert set(f.cols) == set(STATE)

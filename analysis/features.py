"""Per-GPU, per-minute features (pure numpy): from the states folded at ingest (``from_states``,
what the runner reads) and the reference fold of raw samples (``minute_features``).

Everything the heuristics judge is computed from these (G GPUs x M minutes) matrices. The
runner builds them from ``storage.minute_features`` states; ``minute_features`` computes the
same from raw samples (benches, tests, and the proof that the ingest fold equals it).
Minute buckets are ``floor(ts / 60)``, the same as the storage rollups
(``gpu_samples_1m.bucket``), so "aligned windows" are aligned across GPUs and nodes.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

# The feature catalog is storage's (storage.minute_features folds the same features at ingest).
from gpufleet.storage.minute_features import HIST_BINS as HIST_BINS
from gpufleet.storage.minute_features import HIST_FIELDS as HIST_FIELDS
from gpufleet.storage.minute_features import MAX_OF as MAX_OF
from gpufleet.storage.minute_features import MEAN_OF as MEAN_OF
from gpufleet.storage.minute_features import MIN_OF as MIN_OF
from gpufleet.storage.minute_features import RAW_FIELDS as RAW_FIELDS  # the raw columns the fold reads
from gpufleet.storage.minute_features import READ_COLUMNS as READ_COLUMNS

# Features only raw samples give (the 1-minute rollups cannot): NaN for rollup-filled minutes.
BUSY_FEATURES = ("busy_frac", "trans", "busy_sm", "clock_busy", "throttle_frac", "reasons_or")

ALL_FEATURES: tuple[str, ...] = (*MEAN_OF, *MAX_OF, *MIN_OF, *BUSY_FEATURES, "xid_crit", "nb")


@dataclass
class MinuteFeatures:
    """Features of G GPUs over minutes ``b0 .. b0 + M - 1`` (minute = floor(ts / 60)).
    ``n[g, m]`` is the number of samples folded in (0 = no data; features are NaN there)."""

    b0: int
    n: np.ndarray  # (G, M) float64
    f: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (G, M) float64
    interval_s: float = 1.0  # median sample spacing seen (for coverage)

    @property
    def shape(self) -> tuple[int, int]:
        return self.n.shape  # type: ignore[return-value]  # n is 2-D: (GPUs, minutes)

    @classmethod
    def empty(cls, n_gpus: int, b0: int = 0) -> MinuteFeatures:
        return cls(b0=b0, n=np.zeros((n_gpus, 0)), f={k: np.full((n_gpus, 0), np.nan) for k in ALL_FEATURES})

    def before(self, bucket: int) -> MinuteFeatures:
        """The minutes strictly before ``bucket``."""
        m = max(0, min(self.shape[1], bucket - self.b0))
        return MinuteFeatures(self.b0, self.n[:, :m], {k: v[:, :m] for k, v in self.f.items()}, self.interval_s)

    def extend(self, other: MinuteFeatures) -> MinuteFeatures:
        """Append ``other`` (whose minutes start at or after ours end), padding any gap."""
        g = self.shape[0]
        if self.shape[1] == 0:
            return other
        if other.shape[1] == 0:
            return self
        gap = other.b0 - (self.b0 + self.shape[1])
        if gap < 0:
            raise ValueError("extend: minutes overlap; cut with before() first")
        pad_n = np.zeros((g, gap))
        pad = np.full((g, gap), np.nan)
        n = np.concatenate([self.n, pad_n, other.n], axis=1)
        f = {k: np.concatenate([self.f[k], pad, other.f[k]], axis=1) for k in self.f}
        interval = other.interval_s if other.n.sum() >= self.n.sum() else self.interval_s
        return MinuteFeatures(self.b0, n, f, interval)


def median1d(v: np.ndarray) -> float:
    """``float(np.median(v))`` of a 1-D array without NaN (not empty), exactly: the middle
    value, or the mean of the middle two as np.median takes it ((a + b) / 2); np.median's
    partition and checks cost ~10x this on the few values a job's evidence has."""
    n = len(v)
    s = sorted(v.tolist()) if n <= 64 else np.sort(v)[n // 2 - 1:n // 2 + 1].tolist()  # (the middle two)
    h = len(s) // 2
    return float(s[h]) if n % 2 else (s[h - 1] + s[h]) / 2.0


def _segment_sum(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.add.reduceat(x, starts) if len(x) else np.zeros(0)


def minute_features(
    ts: np.ndarray,
    gpu: np.ndarray,
    cols: dict[str, np.ndarray],
    n_gpus: int,
    *,
    busy_sm_active: float = 0.10,
    throttle_mask: int = 0xEC,
    critical_xids: tuple[int, ...] = (),
    b0: int | None = None,
) -> MinuteFeatures:
    """Fold raw samples (``ts``, row-aligned ``gpu`` index 0..G-1 and catalog columns; NaN =
    missing) into per-minute features. Rows may come in any order."""
    ts = np.asarray(ts, dtype=np.float64)
    gpu = np.asarray(gpu, dtype=np.int64)
    if len(ts) == 0:
        return MinuteFeatures.empty(n_gpus, b0 or 0)
    bucket = np.floor(ts / 60.0).astype(np.int64)
    lo = int(bucket.min()) if b0 is None else b0
    m_total = int(bucket.max()) - lo + 1
    key = gpu * m_total + (bucket - lo)
    order = None
    if len(key) > 1 and (np.any(np.diff(key) < 0) or np.any((np.diff(ts) < 0) & (np.diff(key) == 0))):
        order = np.lexsort((ts, key))
        key, ts = key[order], ts[order]

    def col(name: str) -> np.ndarray:
        c = cols.get(name)
        if c is None:
            return np.full(len(key), np.nan)
        c = np.asarray(c, dtype=np.float64)
        return c[order] if order is not None else c

    new = np.empty(len(key), dtype=bool)
    new[0] = True
    np.not_equal(key[1:], key[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    cells = key[starts]
    gi, mi = cells // m_total, cells % m_total

    def place(values: np.ndarray) -> np.ndarray:
        out = np.full((n_gpus, m_total), np.nan)
        out[gi, mi] = values
        return out

    counts = np.diff(np.append(starts, len(key))).astype(np.float64)
    n_mask = np.zeros((n_gpus, m_total), dtype=bool)
    n_mask[gi, mi] = True
    out: dict[str, np.ndarray] = {}
    for feat, name in MEAN_OF.items():
        x = col(name)
        nan = np.isnan(x)
        if not nan.any():  # the common case: one pass, no masking
            out[feat] = place(_segment_sum(x, starts) / counts)
            continue
        s = _segment_sum(np.where(nan, 0.0, x), starts)
        c = _segment_sum((~nan).astype(np.float64), starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[feat] = place(np.where(c > 0, s / np.maximum(c, 1), np.nan))
    for table, ufunc in ((MAX_OF, np.fmax), (MIN_OF, np.fmin)):
        for feat, name in table.items():
            x = col(name)
            # Error counters are almost always all zero: skip the reduction then.
            out[feat] = np.where(n_mask, 0.0, np.nan) if not x.any() else place(ufunc.reduceat(x, starts))

    sm = col("sm_active")
    sm_ok = ~np.isnan(sm)
    busy = sm_ok & (sm >= busy_sm_active)
    nb = _segment_sum(busy.astype(np.float64), starts)
    nsm = _segment_sum(sm_ok.astype(np.float64), starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["busy_frac"] = place(np.where(nsm > 0, nb / np.maximum(nsm, 1), np.nan))
        # busy<->idle switches inside the minute (the alternation input stalls leave)
        sw = np.zeros(len(key))
        sw[1:] = ((busy[1:] != busy[:-1]) & ~new[1:]).astype(np.float64)
        out["trans"] = place(np.where(nsm > 1, _segment_sum(sw, starts), np.nan))
        out["busy_sm"] = place(np.where(nb > 0, _segment_sum(np.where(busy, sm, 0.0), starts) / np.maximum(nb, 1),
                                        np.nan))
        clk = col("sm_clock_mhz")
        cb = busy & ~np.isnan(clk)
        ncb = _segment_sum(cb.astype(np.float64), starts)
        out["clock_busy"] = place(np.where(ncb > 0, _segment_sum(np.where(cb, clk, 0.0), starts) / np.maximum(ncb, 1),
                                           np.nan))
        reasons = col("clock_event_reasons")
        rok = busy & ~np.isnan(reasons)
        bits = np.where(rok, reasons, 0).astype(np.int64) & throttle_mask
        thr = rok & (bits != 0)
        nrb = _segment_sum(rok.astype(np.float64), starts)
        nthr = _segment_sum(thr.astype(np.float64), starts)
        out["throttle_frac"] = place(np.where(nrb > 0, nthr / np.maximum(nrb, 1), np.nan))
        # which throttle reasons (bits) were set while busy, so a flag names the measured cause
        out["reasons_or"] = place(np.where(nrb > 0, np.bitwise_or.reduceat(bits, starts), np.nan))
    xid = col("xid_last")
    if not xid.any():
        out["xid_crit"] = np.where(n_mask, 0.0, np.nan)
    else:
        codes = np.nan_to_num(xid).astype(np.int64)
        crit = np.where(np.isin(codes, np.asarray(critical_xids, dtype=np.int64)), xid, 0.0)
        out["xid_crit"] = place(np.fmax.reduceat(crit, starts))
    out["nb"] = place(nb)

    n = np.zeros((n_gpus, m_total))
    n[gi, mi] = counts
    # Median spacing of consecutive samples of the same GPU: the agent's interval.
    # Across minute boundaries too: at 60 s sampling every minute holds one sample.
    same_gpu = (key[1:] // m_total) == (key[:-1] // m_total)
    dts = np.diff(ts)[same_gpu] if len(ts) > 1 else np.zeros(0)
    dts = dts[dts > 0]
    # Rounded to 0.1 s: the agent's configured interval, stable under timestamp jitter, so a
    # job read in pieces (incremental) and read whole give the same report.
    interval = max(0.1, round(float(np.median(dts)), 1)) if len(dts) else 1.0
    return MinuteFeatures(b0=lo, n=n, f=out, interval_s=interval)


def histograms(cols: dict[str, np.ndarray], mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Counts of each ratio field in 0.01 bins (mergeable: running jobs add new rows)."""
    out: dict[str, np.ndarray] = {}
    for name in HIST_FIELDS:
        x = cols.get(name)
        if x is None:
            out[name] = np.zeros(HIST_BINS, dtype=np.int64)
            continue
        x = np.asarray(x, dtype=np.float64)
        if mask is not None:
            x = x[mask]
        x = x[~np.isnan(x)]
        idx = np.clip((x * HIST_BINS).astype(np.int64), 0, HIST_BINS - 1)
        out[name] = np.bincount(idx, minlength=HIST_BINS).astype(np.int64)
    return out


def empty_histograms() -> dict[str, np.ndarray]:
    return {name: np.zeros(HIST_BINS, dtype=np.int64) for name in HIST_FIELDS}


def add_histograms(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: a[k] + b[k] for k in a}


def hist_quantile(h: np.ndarray, q: float) -> float | None:
    """Quantile from 0.01-wide bins, interpolated inside the bin."""
    return hist_quantiles(h, (q,))[0]


def hist_quantiles(h: np.ndarray, qs: tuple[float, ...]) -> list[float | None]:
    """``hist_quantile`` of each of ``qs``, the bins' running sum made once. Counts (integer
    bins, none negative: what storage keeps) take Python's ints, exactly the numpy path's
    answer (sums of ints are exact, bisect_left is searchsorted's "left" on a running sum
    that never decreases, ints below 2**53 compare with a float as their float does) at a
    third of its cost: a report asks for four, and numpy's calls were most of that."""
    if h.dtype.kind in "iu":
        hl = h.tolist()
        if not hl or min(hl) >= 0:
            cl = list(accumulate(hl))
            total = float(cl[-1]) if cl else 0.0
            if total <= 0:
                return [None] * len(qs)
            out: list[float | None] = []
            for q in qs:
                target = q * total
                i = min(bisect_left(cl, target), len(hl) - 1)
                before = float(cl[i - 1]) if i > 0 else 0.0
                inside = float(hl[i]) or 1.0
                out.append(round((i + (target - before) / inside) / HIST_BINS, 4))
            return out
    return _hist_quantiles_np(h, qs)


def _hist_quantiles_np(h: np.ndarray, qs: tuple[float, ...]) -> list[float | None]:
    """``hist_quantiles`` with numpy's running sum and searchsorted (any bins)."""
    total = float(h.sum())
    if total <= 0:
        return [None] * len(qs)
    cum = np.cumsum(h)
    hl = h.tolist()
    cl = cum.tolist()
    out: list[float | None] = []
    for q, i in zip(qs, np.searchsorted(cum, [q * total for q in qs], side="left").tolist(), strict=True):
        target = q * total
        i = min(i, len(h) - 1)
        before = float(cl[i - 1]) if i > 0 else 0.0
        inside = float(hl[i]) or 1.0
        out.append(round((i + (target - before) / inside) / HIST_BINS, 4))
    return out


def _at(idx: list[int]) -> slice | list[int]:
    """A run of consecutive indexes as a slice (a view, not a gather), else the list."""
    return slice(idx[0], idx[-1] + 1) if idx == list(range(idx[0], idx[0] + len(idx))) else idx


_COL = {name: i for i, name in enumerate(READ_COLUMNS)}
_AT = {name: i for i, name in enumerate(ALL_FEATURES)}
# from_states' ratios: feature <- (numerator, denominator) state columns: the means (sums and
# counts are runs of columns) ...
_MEANS_AT = _at([_AT[k] for k in MEAN_OF])
_MEANS_NUM = _at([_COL[f"{k}_sum"] for k in MEAN_OF])
_MEANS_DEN = _at([_COL[f"{k}_n"] for k in MEAN_OF])
# ... the busy share, the while-busy means and the throttle share ...
_BUSY = {"busy_frac": ("nb", "nsm"), "busy_sm": ("busy_sm_sum", "nb"), "clock_busy": ("clock_busy_sum", "ncb"),
         "throttle_frac": ("nthr", "nrb")}
_BUSY_AT = [_AT[k] for k in _BUSY]
_BUSY_NUM = [_COL[a] for a, _ in _BUSY.values()]
_BUSY_DEN = [_COL[b] for _, b in _BUSY.values()]
# ... and the features stored as they are (maxima, minima, critical XIDs, busy samples).
_COPIED = (*MAX_OF, *MIN_OF, "xid_crit", "nb")
_COPY_AT = _at([_AT[k] for k in _COPIED])
_COPY_FROM = [_COL[k] for k in _COPIED]


# Every feature is set by exactly one of those, or by trans / reasons_or (from_states' vals is np.empty).
assert sorted(np.r_[_MEANS_AT, _BUSY_AT, _COPY_AT, _AT["trans"], _AT["reasons_or"]].tolist()) == list(
    range(len(ALL_FEATURES)))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.where(den > 0, num / np.maximum(den, 1), np.nan)


def from_states(data: np.ndarray, gpu_pks: list[int]) -> MinuteFeatures:
    """MinuteFeatures from stored ingest-fold states (rows of ``READ_COLUMNS``, as
    ``storage.minute_features.read_states`` returns them), GPUs in ``gpu_pks`` order. The same
    arithmetic as ``minute_features`` on the sums and counts, so a minute folded in one batch
    gives the reference's value bit for bit (merged batches: to float rounding)."""
    g = len(gpu_pks)
    if not len(data):
        return MinuteFeatures.empty(g)
    col = _COL
    minute = np.floor(data[:, col["bucket"]] / 60.0 + 0.5).astype(np.int64)
    b0 = int(minute.min())
    m_total = int(minute.max()) - b0 + 1
    order = np.asarray(gpu_pks, dtype=np.int64)
    srt = np.argsort(order, kind="stable")
    gi = srt[np.searchsorted(order[srt], data[:, col["gpu_pk"]].astype(np.int64))]
    mi = minute - b0

    # Every feature's row values in one (features, rows) array, then one scatter into one
    # (features, G, M) block: the ratios (means, busy share, while-busy means, throttle share)
    # in one call over all of them, the same division per element as one call each.
    cols = data.T
    vals = np.empty((len(ALL_FEATURES), len(data)))
    with np.errstate(invalid="ignore", divide="ignore"):
        vals[_MEANS_AT] = _ratio(cols[_MEANS_NUM], cols[_MEANS_DEN])
        vals[_BUSY_AT] = _ratio(cols[_BUSY_NUM], cols[_BUSY_DEN])
    vals[_COPY_AT] = cols[_COPY_FROM]
    vals[_AT["trans"]] = np.where(cols[col["nsm"]] > 1, cols[col["trans"]], np.nan)
    vals[_AT["reasons_or"]] = np.where(cols[col["nrb"]] > 0, cols[col["reasons_or"]], np.nan)
    if len(data) == g * m_total and bool((gi.reshape(m_total, g) == np.arange(g)).all()) \
            and bool((mi.reshape(m_total, g) == np.arange(m_total)[:, None]).all()):
        # Every GPU in every minute, rows in (minute, GPU) order (as read_states reads a job
        # that reported throughout): the scatter below is this reshape, at a fraction of its cost.
        block = np.ascontiguousarray(vals.reshape(len(ALL_FEATURES), m_total, g).transpose(0, 2, 1))
        n = np.ascontiguousarray(cols[col["n"]].reshape(m_total, g).T)
    else:
        block = np.full((len(ALL_FEATURES), g, m_total), np.nan)
        block[:, gi, mi] = vals
        n = np.zeros((g, m_total))
        n[gi, mi] = cols[col["n"]]
    f = {k: block[i] for i, k in enumerate(ALL_FEATURES)}
    c = {"n": cols[col["n"]], "first_ts": cols[col["first_ts"]], "last_ts": cols[col["last_ts"]]}
    return MinuteFeatures(b0=b0, n=n, f=f, interval_s=state_interval(c, gi))


def state_interval(c: dict[str, np.ndarray], gi: np.ndarray) -> float:
    """The agent's sample interval from stored minutes: the median over GPU-minutes of their
    mean spacing ((last - first) / (n - 1)); where no minute holds two samples (sampling at
    60 s or slower), the median gap between a GPU's consecutive minutes. Rounded to 0.1 s,
    like ``minute_features``."""
    n = c["n"]
    multi = n > 1
    if multi.any():
        sp = (c["last_ts"][multi] - c["first_ts"][multi]) / (n[multi] - 1)
    else:
        order = np.lexsort((c["first_ts"], gi))
        same = gi[order][1:] == gi[order][:-1]
        sp = (c["first_ts"][order][1:] - c["last_ts"][order][:-1])[same]
    sp = sp[sp > 0]
    return max(0.1, round(median1d(sp), 1)) if len(sp) else 1.0

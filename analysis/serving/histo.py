"""Percentiles and SLO attainment from a histogram's bucket counts (pure).

Both read one CDF: linear inside the bucket that holds the answer, as Prometheus's
``histogram_quantile`` does (the first bucket starts at 0), so ``attainment(h, quantile(h, q)) == q``
and a p99 drawn against an SLO line agrees with the attainment at that SLO. An SLO that sits on a
bucket bound is read exactly; one between bounds is off by at most that bucket's share of the
requests (the truth is always inside ``attainment_range``).

Linear stays on measurement, not by default: bench/serving/attainment_error.py scores monotone cubic
(PCHIP) interpolation of the cumulative counts in latency and in log-latency, log-linear, in-bucket
shapes with their mean taken from ``_sum``, and linear clamped into what ``_sum`` proves, against the
serving simulator's per-request truth across loads, seeds and four engines' bucket bounds. PCHIP in
log-latency has the lowest mean error, but a higher worst case and is worse than linear by more than
a point on about 5% of the readings; the clamped reading is never worse but gains almost nothing.
None is better everywhere (docs/serving.md, "How close the histogram numbers are to the truth").
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gpufleet.serving_expo import Hist, add_hists


def total(hists: Iterable[Hist | None]) -> Hist | None:
    """The sum of several minutes' (or replicas') histograms; None when there is none."""
    out: Hist | None = None
    for h in hists:
        if h is None:
            continue
        out = h if out is None else add_hists(out, h)
    return out


def attainment(h: Hist, limit_s: float) -> float | None:
    """Share of observations at or under ``limit_s``; None for an empty histogram (unknown)."""
    n = h.count
    if n <= 0:
        return None
    lower, below = 0.0, 0.0
    for bound, cum in zip(h.bounds, h.cum, strict=True):
        if limit_s <= bound:
            if bound == math.inf:
                return below / n  # past the last finite bound: those above it are not known to meet it
            if limit_s == bound:
                return cum / n
            frac = (limit_s - lower) / (bound - lower) if bound > lower else 1.0
            return (below + (cum - below) * frac) / n
        lower, below = bound, cum
    return 1.0


def quantile(h: Hist, q: float) -> float | None:
    """The q-quantile (0 < q < 1); None when empty. In the +Inf bucket: the last finite bound
    (Prometheus's answer; the true value is at least that)."""
    n = h.count
    if n <= 0:
        return None
    rank = q * n
    lower, below = 0.0, 0.0
    for bound, cum in zip(h.bounds, h.cum, strict=True):
        if cum >= rank:
            if bound == math.inf:
                return lower
            if cum == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (cum - below)
        lower, below = bound, cum
    return lower


def mean(h: Hist) -> float | None:
    return h.sum / h.count if h.count > 0 else None


def attainment_range(h: Hist, limit_s: float) -> tuple[float, float] | None:
    """What the buckets prove about the share at or under ``limit_s``: at least the count at the
    bound below it, at most the count at the bound above (one value when it sits on a bound)."""
    n = h.count
    if n <= 0:
        return None
    below = 0.0
    for bound, cum in zip(h.bounds, h.cum, strict=True):
        if limit_s == bound:
            return cum / n, cum / n
        if limit_s < bound:
            return below / n, (cum / n if bound != math.inf else 1.0)
        below = cum
    return 1.0, 1.0

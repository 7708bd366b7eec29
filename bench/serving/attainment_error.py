"""SLO attainment from engine histograms against the simulator's per-request truth.

    .venv/bin/python bench/serving/attainment_error.py            # the tables in docs/serving.md
    .venv/bin/python bench/serving/attainment_error.py --seeds 3  # quicker

A replica of the serving simulator (agent/sim_serving.py) runs at four loads (light, moderate,
near capacity with bursts and preemptions, overloaded) for 4 minutes per seed. Each request's true
TTFT and TPOT are bucketed into each engine's default bounds (vLLM, SGLang, TGI, Triton), both for
the whole run (what a deployment summary reads) and minute by minute (what the deployment page's
series and the ledger read). For vLLM the run's histograms are also read back from its scraped
pages through the pipeline (parse -> delta -> minute fold) and checked equal, so the histograms
measured here are the ones gpufleet sees.

Every candidate estimator of the share at or under the SLO is scored on the same histograms: its
error against the truth, in points (percent of requests). Tables:

1. per SLO (vLLM bounds and every MLPerf preset), per engine layout: max and p95 error of the
   estimator gpufleet uses (analysis/serving/histo.attainment), whole run and per minute;
2. every candidate against a sweep of SLOs between bounds: max, p95 and mean error, and how often
   it is worse than linear interpolation by more than 0.1 point;
3. the error against the share of requests inside the bucket that holds the SLO: what "within 1
   point" needs from the buckets.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpufleet.agent.sim_serving import EngineModel, Workload, simulate
from gpufleet.analysis.serving import histo
from gpufleet.analysis.serving.measures import ServingMinute, summarize
from gpufleet.analysis.serving.slo import PRESETS, Slo
from gpufleet.serving_expo import Hist, minutes_of, parse_exposition, snapshot
from gpufleet.serving_metrics import serving_registry

MODEL = EngineModel(step_base_s=0.012, prefill_s_per_token=0.0001, decode_s_per_seq=0.0003, max_num_seqs=64,
                    kv_capacity_tokens=40_000)
LOADS = {"light": Workload(rate_rps=1.5, duration_s=240),
         "moderate": Workload(rate_rps=3.0, duration_s=240, burst_factor=2.5),
         "near capacity": Workload(rate_rps=5.0, duration_s=240, burst_factor=2.5),
         "overloaded": Workload(rate_rps=8.0, duration_s=240, burst_factor=2.5)}
# Triton's nv_inference_first_response_histogram_ms default bounds (triton-inference-server/core
# src/metric_model_reporter.h, histogram_options_); Triton has no per-request TPOT histogram.
TRITON_TTFT_S = (0.1, 0.5, 2.0, 5.0)


def layouts() -> dict[str, tuple[tuple[float, ...] | None, tuple[float, ...] | None]]:
    """Engine -> (TTFT bounds, TPOT bounds) in seconds, from gpufleet/serving_metrics.toml. SGLang
    exports no per-request TPOT: its inter-token-latency bounds stand in (the estimator is scored on
    that layout against the per-request TPOT truth)."""
    reg = serving_registry()

    def bounds(engine: str, *measures: str) -> tuple[float, ...] | None:
        for m in measures:
            for em in reg.engine(engine).for_measure(m):
                if em.buckets:
                    return tuple(b * em.scale for b in em.buckets)
        return None

    return {"vllm": (bounds("vllm", "ttft"), bounds("vllm", "tpot")),
            "sglang": (bounds("sglang", "ttft"), bounds("sglang", "itl")),
            "tgi": (bounds("tgi", "ttft"), bounds("tgi", "tpot")),
            "triton": (TRITON_TTFT_S, None)}


def bucket(values: Sequence[float], bounds: Sequence[float]) -> Hist:
    """A histogram of ``values`` as an engine observes them (le: a value on a bound counts in it)."""
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1
    cum, c = [], 0
    for n in counts:
        c += n
        cum.append(float(c))
    return Hist((*bounds, math.inf), tuple(cum), float(sum(values)))


@dataclass
class Run:
    load: str
    seed: int
    ttft: list[tuple[float, int]]  # (value, minute it was observed in)
    tpot: list[tuple[float, int]]


def run(load: str, seed: int, check_pipeline: bool) -> Run:
    res = simulate(MODEL, replace(LOADS[load], seed=seed))
    done = res.finished()
    r = Run(load, seed, [], [])
    for q in res.requests:
        assert q.first_token is not None
        r.ttft.append((q.ttft, int(q.first_token // 60)))
    for q in done:
        assert q.finished is not None
        r.tpot.append((q.tpot, int(q.finished // 60)))
    if check_pipeline:  # the run's vLLM pages, through the pipeline, give the same buckets
        scrapes = [(t, snapshot(parse_exposition(p), "vllm")) for t, p in res.pages]
        ms = [ServingMinute("d", "r", m, 1, "vllm", s) for m, s in minutes_of(scrapes).items()]
        ttft_b, tpot_b = layouts()["vllm"]
        assert ttft_b is not None and tpot_b is not None
        for name, vals, bounds in (("ttft", r.ttft, ttft_b), ("tpot", r.tpot, tpot_b)):
            seen = histo.total(m.hist(name) for m in ms)
            mine = bucket([v for v, _ in vals], bounds)
            assert seen is not None and seen.cum == mine.cum, (name, load, seed)
            assert math.isclose(seen.sum, mine.sum, rel_tol=1e-9)
            for m in ms:  # minute by minute too
                mh = m.hist(name)
                if mh is not None:
                    assert mh.cum == bucket([v for v, mi in vals if mi * 60 == m.minute], bounds).cum
        s = summarize("d", ms, Slo(0.25, 0.05))
        assert s.ttft_attainment == histo.attainment(bucket([v for v, _ in r.ttft], ttft_b), 0.25)
    return r


# --- candidate estimators: the share at or under x, from the buckets (and _sum) alone ----------------

Estimator = Callable[[Hist, float], float]


def _locate(h: Hist, x: float) -> tuple[int, float, float, float, float] | float:
    """(bucket index, lower bound, upper bound, cum below, cum at upper) of the bucket holding x
    strictly inside; or the share itself when x is on a bound, past the last finite one, or the
    bucket is empty."""
    n = h.count
    lower, below = 0.0, 0.0
    for i, (bound, cum) in enumerate(zip(h.bounds, h.cum, strict=True)):
        if x <= bound:
            if bound == math.inf:
                return below / n
            if x == bound or cum == below:
                return cum / n if x == bound else below / n
            return i, lower, bound, below, cum
        lower, below = bound, cum
    return 1.0


def linear(h: Hist, x: float) -> float:
    at = _locate(h, x)
    if isinstance(at, float):
        return at
    _, a, b, lo, hi = at
    return (lo + (hi - lo) * (x - a) / (b - a)) / h.count


def loglinear(h: Hist, x: float) -> float:
    """Uniform in log-latency inside the bucket (linear in the first, which starts at 0)."""
    at = _locate(h, x)
    if isinstance(at, float):
        return at
    _, a, b, lo, hi = at
    frac = (x - a) / (b - a) if a <= 0 else math.log(x / a) / math.log(b / a)
    return (lo + (hi - lo) * frac) / h.count


def pchip_lin(h: Hist, x: float) -> float:
    at = _locate(h, x)
    if isinstance(at, float):
        return at
    finite = [(b, c) for b, c in zip(h.bounds, h.cum, strict=True) if b != math.inf]
    xs = [0.0] + [b for b, _ in finite]
    ys = [0.0] + [c for _, c in finite]
    return pchip_eval(xs, ys, x) / h.count


def _pchip_log(h: Hist, x: float) -> float:
    at = _locate(h, x)
    if isinstance(at, float):
        return at
    if at[0] == 0:
        return linear(h, x)
    finite = [(b, c) for b, c in zip(h.bounds, h.cum, strict=True) if b != math.inf]
    # the first bucket [0, b0] read as uniform has log-density cum0 at b0: a knot one unit of
    # log-latency below b0 at 0 gives that secant (it is never evaluated, only sets the slope at b0)
    xs = [math.log(finite[0][0]) - 1.0] + [math.log(b) for b, _ in finite]
    ys = [0.0] + [c for _, c in finite]
    return pchip_eval(xs, ys, math.log(x)) / h.count


def midpoint(h: Hist, x: float) -> float:
    """The middle of what the buckets prove (minimax: error at most half the bucket's share)."""
    lo, hi = histo.attainment_range(h, x) or (0.0, 0.0)
    return (lo + hi) / 2


def pchip_slopes(xs: list[float], ys: list[float]) -> list[float]:
    """Derivatives at the knots of the monotone piecewise-cubic Hermite interpolant (Fritsch and
    Carlson, in the form of Fritsch and Butland / SciPy's PchipInterpolator): a weighted harmonic
    mean of the neighbouring secants, 0 where they differ in sign or one is 0, so a monotone series
    stays monotone between its knots."""
    n = len(xs)
    h = [xs[i + 1] - xs[i] for i in range(n - 1)]
    d = [(ys[i + 1] - ys[i]) / h[i] for i in range(n - 1)]
    if n == 2:
        return [d[0], d[0]]
    m = [0.0] * n
    for i in range(1, n - 1):
        if d[i - 1] * d[i] > 0:
            w1, w2 = 2 * h[i] + h[i - 1], h[i] + 2 * h[i - 1]
            m[i] = (w1 + w2) / (w1 / d[i - 1] + w2 / d[i])
    for end, (h0, h1, d0, d1) in ((0, (h[0], h[1], d[0], d[1])), (n - 1, (h[-1], h[-2], d[-1], d[-2]))):
        s = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1)
        if s * d0 <= 0:
            s = 0.0
        elif d0 * d1 <= 0 and abs(s) > 3 * abs(d0):
            s = 3 * d0
        m[end] = s
    return m


def pchip_eval(xs: list[float], ys: list[float], x: float) -> float:
    """The monotone cubic through the knots (xs ascending), at x inside [xs[0], xs[-1]]."""
    m = pchip_slopes(xs, ys)
    i = max(0, min(bisect.bisect_right(xs, x) - 1, len(xs) - 2))
    h = xs[i + 1] - xs[i]
    t = (x - xs[i]) / h
    t2, t3 = t * t, t * t * t
    return ((2 * t3 - 3 * t2 + 1) * ys[i] + (t3 - 2 * t2 + t) * h * m[i]
            + (-2 * t3 + 3 * t2) * ys[i + 1] + (t3 - t2) * h * m[i + 1])


def _maxent_cdf(u: float, m: float) -> float:
    """CDF at u in [0, 1] of the maximum-entropy density on [0, 1] with mean m (f ~ exp(lambda u))."""
    if abs(m - 0.5) < 1e-9:
        return u
    lo, hi = -200.0, 200.0
    for _ in range(80):
        lam = (lo + hi) / 2
        mean = 0.5 if abs(lam) < 1e-9 else 1 / (-math.expm1(-lam)) - 1 / lam
        if mean < m:
            lo = lam
        else:
            hi = lam
    lam = (lo + hi) / 2
    return u if abs(lam) < 1e-9 else math.expm1(lam * u) / math.expm1(lam)


def sum_maxent(h: Hist, x: float, fallback: Estimator = _pchip_log) -> float:
    """The in-bucket mean from _sum, other buckets at their midpoints; the maximum-entropy density
    with that mean inside the bucket. Needs an empty +Inf bucket (its mean is unknown)."""
    at = _locate(h, x)
    if isinstance(at, float):
        return at
    k, a, b, lo, hi = at
    if h.cum[-1] > h.cum[-2]:
        return fallback(h, x)
    rest, lower, below = 0.0, 0.0, 0.0
    for i, (bound, cum) in enumerate(zip(h.bounds[:-1], h.cum[:-1], strict=True)):
        if i != k:
            rest += (cum - below) * (lower + bound) / 2
        lower, below = bound, cum
    mu = (h.sum - rest) / (hi - lo)
    m = min(max((mu - a) / (b - a), 0.02), 0.98)
    return (lo + (hi - lo) * _maxent_cdf((x - a) / (b - a), m)) / h.count


def sum_gated(h: Hist, x: float, gate: float = 0.1) -> float:
    """``sum_maxent`` only where _sum pins the bucket's mean: the other buckets' counts can move it by
    at most ``gate`` of the bucket's width (their means anywhere in their bounds); linear elsewhere."""
    at = _locate(h, x)
    if isinstance(at, float):
        return at
    k, a, b, lo, hi = at
    if h.cum[-1] > h.cum[-2]:
        return linear(h, x)
    spread, lower, below = 0.0, 0.0, 0.0
    for i, (bound, cum) in enumerate(zip(h.bounds[:-1], h.cum[:-1], strict=True)):
        if i != k:
            spread += (cum - below) * (bound - lower)
        lower, below = bound, cum
    if spread / (hi - lo) > gate * (b - a):
        return linear(h, x)
    return sum_maxent(h, x, linear)


def mean_bounds(h: Hist, k: int) -> tuple[float, float]:
    """What _sum proves about the mean of bucket k: the other buckets' observations lie inside their
    bounds (the +Inf bucket's at least the last finite bound)."""
    n_k = h.cum[k] - (h.cum[k - 1] if k else 0.0)
    other_lo = other_hi = 0.0
    lower, below = 0.0, 0.0
    for i, (bound, cum) in enumerate(zip(h.bounds, h.cum, strict=True)):
        n = cum - below
        if i != k and n > 0:
            other_lo += n * lower
            other_hi += n * bound  # inf for a non-empty +Inf bucket
        lower, below = bound, cum
    return (h.sum - other_hi) / n_k, (h.sum - other_lo) / n_k


def sum_clamped(h: Hist, x: float) -> float:
    """Linear, clamped into what the bucket's mean (from _sum) proves by Markov's inequality on each
    side: P(X > x) <= (mu - a) / (x - a) and P(X <= x) <= (b - mu) / (b - x)."""
    at = _locate(h, x)
    if isinstance(at, float):
        return at
    k, a, b, lo, hi = at
    mu_lo, mu_hi = mean_bounds(h, k)
    u = (x - a) / (b - a)
    low = 1 - (mu_hi - a) / (x - a) if mu_hi < math.inf else 0.0
    high = (b - mu_lo) / (b - x) if mu_lo > -math.inf else 1.0
    frac = min(max(u, low, 0.0), high, 1.0)
    return (lo + (hi - lo) * frac) / h.count


CANDIDATES: dict[str, Estimator] = {"linear": linear, "log-linear": loglinear, "pchip": pchip_lin,
                                    "pchip-log": _pchip_log, "sum-maxent": sum_maxent, "sum-gated": sum_gated,
                                    "sum-clamped": sum_clamped, "range midpoint": midpoint}


# --- scoring ---------------------------------------------------------------------------------------

TABLE_SLOS = {"on vLLM bounds, tight": Slo(0.25, 0.05), "on vLLM bounds, loose": Slo(1.0, 0.1), **PRESETS}


def gpufleet(h: Hist, x: float) -> float:
    """What gpufleet reports: analysis/serving/histo.attainment."""
    a = histo.attainment(h, x)
    assert a is not None
    return a


@dataclass
class Case:
    """One histogram read at one SLO: which run, layout, measure, scope; the truth; the proven range."""

    load: str
    engine: str
    measure: str
    scope: str  # "run" or "minute"
    x: float
    truth: float
    lo: float
    hi: float
    est: dict[str, float]

    def err(self, name: str) -> float:
        return abs(self.est[name] - self.truth) * 100


def score(runs: Sequence[Run], xs: dict[str, Sequence[float]], estimators: dict[str, Estimator]) -> list[Case]:
    out: list[Case] = []
    for r in runs:
        for engine, (ttft_b, tpot_b) in layouts().items():
            for measure, vals, bounds in (("ttft", r.ttft, ttft_b), ("tpot", r.tpot, tpot_b)):
                if bounds is None:
                    continue
                scopes = [("run", [v for v, _ in vals])]
                for minute in sorted({mi for _, mi in vals}):
                    scopes.append(("minute", [v for v, mi in vals if mi == minute]))
                for scope, values in scopes:
                    h, srt = bucket(values, bounds), sorted(values)
                    for x in xs[measure]:
                        rng = histo.attainment_range(h, x)
                        assert rng is not None
                        truth = bisect.bisect_right(srt, x) / len(srt)
                        est = {name: f(h, x) for name, f in estimators.items()}
                        for name, e in est.items():  # every candidate stays inside what the buckets prove
                            assert rng[0] - 1e-12 <= e <= rng[1] + 1e-12, (name, x, rng, e)
                        assert rng[0] <= truth <= rng[1]
                        out.append(Case(r.load, engine, measure, scope, x, truth, rng[0], rng[1], est))
    return out


def pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))] if s else float("nan")


def table_per_slo(cases: Sequence[Case], seeds: int) -> None:
    print("| SLO (TTFT / TPOT) | engine bounds | TTFT run: max / p95 | TTFT minute: max / p95 | "
          "TPOT run: max / p95 | TPOT minute: max / p95 |")
    print("|---|---|---|---|---|---|")
    for name, slo in TABLE_SLOS.items():
        for engine in layouts():
            cells = []
            for measure, x in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s)):
                for scope in ("run", "minute"):
                    cs = [c for c in cases if c.engine == engine and c.measure == measure and c.scope == scope
                          and c.x == x]
                    if not cs:
                        cells.append("no series")
                        continue
                    e = [c.err("gpufleet") for c in cs]
                    cells.append(f"{max(e):.2f} / {pct(e, 0.95):.2f}")
            print(f"| {name} ({slo.ttft_s * 1000:g} ms / {slo.tpot_s * 1000:g} ms) | {engine} | "
                  + " | ".join(cells) + " |")
    print(f"\n{seeds} seeds x {len(LOADS)} loads ({', '.join(LOADS)}); error of histo.attainment in points "
          "(percent of requests), max / p95; run: the whole 4-minute run's histogram; minute: each minute's. "
          "The truth was inside attainment_range in every reading.")


def table_candidates(cases: Sequence[Case], names: Sequence[str]) -> None:
    between = [c for c in cases if c.hi > c.lo]
    print(f"\nSweep: SLOs on a geometric grid (60 TTFT targets from 30 ms to 20 s, 60 TPOT targets from 8 to "
          f"300 ms) on every run, engine layout and minute: {len(between)} readings with the SLO strictly between "
          f"bounds and requests in that bucket.\n")
    print("| estimator | scope | max error | p95 | mean | worse than linear by > 0.1 point | "
          "by > 1 point |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        for scope in ("run", "minute"):
            cs = [c for c in between if c.scope == scope]
            e = [c.err(name) for c in cs]
            worse = sum(c.err(name) > c.err("linear") + 0.1 for c in cs)
            worse1 = sum(c.err(name) > c.err("linear") + 1.0 for c in cs)
            print(f"| {name} | {scope} | {max(e):.2f} | {pct(e, 0.95):.2f} | {sum(e) / len(e):.3f} | "
                  f"{worse} of {len(cs)} | {worse1} |")


def table_share(cases: Sequence[Case], names: Sequence[str]) -> None:
    edges = (0.0, 0.01, 0.02, 0.05, 0.10, 0.20, 0.50, 1.0)
    print("\n| requests in the SLO's bucket | readings | "
          + " | ".join(f"{n}: max error" for n in names) + f" | {names[-1]} within 1 point |")
    print("|---|---|" + "---|" * len(names) + "---|")
    for lo, hi in itertools.pairwise(edges):
        cs = [c for c in cases if lo < c.hi - c.lo <= hi]
        if not cs:
            continue
        within = sum(c.err(names[-1]) <= 1.0 for c in cs) / len(cs)
        print(f"| {lo * 100:g}-{hi * 100:g}% | {len(cs)} | "
              + " | ".join(f"{max(c.err(n) for c in cs):.2f}" for n in names) + f" | {within:.1%} |")


def sweep() -> dict[str, list[float]]:
    def geo(a: float, b: float, k: int) -> list[float]:
        return [a * (b / a) ** (i / (k - 1)) for i in range(k)]

    return {"ttft": geo(0.03, 20.0, 60), "tpot": geo(0.008, 0.3, 60)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=8)
    args = ap.parse_args()
    runs = [run(load, seed, check_pipeline=seed == 0) for load in LOADS for seed in range(args.seeds)]
    estimators = {**CANDIDATES, "gpufleet": gpufleet}
    xs_table = {"ttft": sorted({s.ttft_s for s in TABLE_SLOS.values()}),
                "tpot": sorted({s.tpot_s for s in TABLE_SLOS.values()})}
    table_per_slo(score(runs, xs_table, {"gpufleet": gpufleet}), args.seeds)
    swept = score(runs, sweep(), estimators)
    table_candidates(swept, list(estimators))
    table_share([c for c in swept if c.hi > c.lo], ["pchip-log", "gpufleet"])


if __name__ == "__main__":
    main()

"""Serving measures of a replica or a deployment over a window of minutes (pure).

Input: one ``ServingMinute`` per replica-minute (the engine's measures for that minute, as the
agent's scrape or the remote-write receiver folded them, and the GPUs the attribution gave the
replica). Output: rates per GPU-second, latency percentiles from the summed histograms, SLO
attainment and goodput.

Goodput follows DistServe and ``vllm bench serve --goodput``: the rate of requests that meet both
their TTFT and their TPOT SLO. An engine exports the two as separate histograms, so a request's
pair is not known; the share meeting both lies between max(0, a_ttft + a_tpot - 1) and
min(a_ttft, a_tpot) (Fréchet bounds). gpufleet reports the lower bound as goodput (a guarantee,
never an overstatement) and the upper one beside it; when both attainments are 99% or more, the
two are within one point of each other.

An SLO between two bucket bounds is interpolated (``*_attainment``); ``*_attainment_range`` says
what the buckets prove (the counts at the bounds either side), ``*_attainment_exact`` whether that
range is one value (the SLO on a bound, or no request in its bucket), and ``goodput_range`` carries
both uncertainties: the share meeting both SLOs is certainly inside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet.serving_expo import Hist

from .histo import attainment, attainment_range, mean, quantile, total
from .slo import Slo

LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue_time")
PERCENTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True, slots=True)
class ServingMinute:
    deployment: str
    replica: str
    minute: int  # epoch seconds of the minute's start
    gpus: int  # GPUs the replica holds (from the GPU -> job attribution)
    engine: str
    measures: Mapping[str, Hist | float]
    sm_active: float | None = None  # mean SM activity of the replica's GPUs that minute (hardware side)
    gpu_util: float | None = None  # mean NVML utilisation (share of time a kernel ran) of those GPUs

    def hist(self, name: str) -> Hist | None:
        v = self.measures.get(name)
        return v if isinstance(v, Hist) else None

    def scalar(self, name: str) -> float | None:
        v = self.measures.get(name)
        return float(v) if isinstance(v, float | int) else None


@dataclass(frozen=True, slots=True)
class ServingSummary:
    name: str
    replicas: int
    minutes: int
    gpus: float  # mean GPUs held
    gpu_seconds: float
    requests: float | None
    requests_per_s: float | None
    prompt_tokens_per_gpu_s: float | None
    generation_tokens_per_gpu_s: float | None
    latency: dict[str, dict[str, float | None]]  # measure -> {"p50", "p90", "p99", "mean"} in seconds
    tpot_from: str | None  # "tpot" (per request) or "itl" (per token, when the engine has no per-request one)
    queue_mean_s: float | None
    kv_usage_mean: float | None
    kv_usage_max: float | None
    waiting_mean: float | None
    batch_size_mean: float | None
    preemptions: float | None
    sm_active_mean: float | None
    gpu_util_mean: float | None
    slo: Slo
    ttft_attainment: float | None
    tpot_attainment: float | None
    ttft_attainment_range: tuple[float, float] | None
    tpot_attainment_range: tuple[float, float] | None
    ttft_attainment_exact: bool | None  # False: the SLO sits between bounds with requests in that bucket
    tpot_attainment_exact: bool | None
    goodput_share: float | None  # share of requests meeting both SLOs (Fréchet lower bound, interpolated)
    goodput_range: tuple[float, float] | None  # what the buckets prove about that share
    goodput_rps: float | None
    goodput_rps_per_gpu: float | None
    slo_met: bool | None  # the SLO's percentile of TTFT and TPOT both within their targets
    cost_per_million_good_tokens: float | None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "slo"}
        out["slo"] = self.slo.as_dict()
        return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _sum_known(minutes: Sequence[ServingMinute], name: str) -> float | None:
    values = [v for m in minutes if (v := m.scalar(name)) is not None]
    return sum(values) if values else None


def tpot_hist(minutes: Sequence[ServingMinute]) -> tuple[Hist | None, str | None]:
    """The per-request TPOT histogram, or the per-token ITL one when the engine has none."""
    h = total(m.hist("tpot") for m in minutes)
    if h is not None and h.count > 0:
        return h, "tpot"
    h = total(m.hist("itl") for m in minutes)
    return (h, "itl") if h is not None and h.count > 0 else (None, None)


def goodput_bounds(a_ttft: float | None, a_tpot: float | None) -> tuple[float | None, float | None]:
    """Share of requests meeting both SLOs, from the two marginal attainments (Fréchet bounds).
    An engine without a TTFT (TGI) or TPOT series leaves the other one as the only (upper) bound."""
    if a_ttft is None and a_tpot is None:
        return None, None
    if a_ttft is None or a_tpot is None:
        known = a_ttft if a_ttft is not None else a_tpot
        return None, known
    return max(0.0, a_ttft + a_tpot - 1.0), min(a_ttft, a_tpot)


def goodput_range(r_ttft: tuple[float, float] | None,
                  r_tpot: tuple[float, float] | None) -> tuple[float, float] | None:
    if r_ttft is None or r_tpot is None:
        return None
    return max(0.0, r_ttft[0] + r_tpot[0] - 1.0), min(r_ttft[1], r_tpot[1])


def summarize(name: str, minutes: Sequence[ServingMinute], slo: Slo,
              gpu_hour_price: float | None = None) -> ServingSummary:
    """One replica's or one deployment's measures over the given replica-minutes."""
    notes: list[str] = []
    replicas = len({m.replica for m in minutes})
    distinct_minutes = len({m.minute for m in minutes})
    gpu_seconds = sum(60.0 * m.gpus for m in minutes)
    wall_s = 60.0 * distinct_minutes
    requests = _sum_known(minutes, "requests")
    if requests is None:
        e2e = total(m.hist("e2e") for m in minutes)
        requests = e2e.count if e2e is not None else None
    prompt, gen = _sum_known(minutes, "prompt_tokens"), _sum_known(minutes, "generation_tokens")
    latency: dict[str, dict[str, float | None]] = {}
    hists = {lat: total(m.hist(lat) for m in minutes) for lat in LATENCIES}
    for lat, h in hists.items():
        if h is not None and h.count > 0:
            latency[lat] = {f"p{round(q * 100)}": quantile(h, q) for q in PERCENTILES}
            latency[lat]["mean"] = mean(h)
    tpot, tpot_from = tpot_hist(minutes)
    if tpot_from == "itl":
        notes.append("TPOT judged from the per-token inter-token latency (the engine exports no per-request TPOT)")
    ttft = hists["ttft"]
    a_ttft = attainment(ttft, slo.ttft_s) if ttft is not None else None
    a_tpot = attainment(tpot, slo.tpot_s) if tpot is not None else None
    if ttft is None or ttft.count == 0:
        notes.append("no TTFT series: TTFT attainment unknown")
    low, _ = goodput_bounds(a_ttft, a_tpot)
    r_ttft = attainment_range(ttft, slo.ttft_s) if ttft is not None else None
    r_tpot = attainment_range(tpot, slo.tpot_s) if tpot is not None else None
    queue_mean = mean(hists["queue_time"]) if hists["queue_time"] is not None else None
    if queue_mean is None and requests:
        qt = _sum_known(minutes, "queue_time_total")
        queue_mean = qt / requests if qt is not None else None
    kv = [v for m in minutes if (v := m.scalar("kv_usage")) is not None]
    waiting = [v for m in minutes if (v := m.scalar("waiting")) is not None]
    batch = _batch_size(minutes)
    sm = [m.sm_active for m in minutes if m.sm_active is not None]
    util = [m.gpu_util for m in minutes if m.gpu_util is not None]
    goodput_rps = low * requests / wall_s if low is not None and requests is not None and wall_s else None
    mean_gpus = gpu_seconds / wall_s if wall_s else 0.0
    slo_met = None
    if a_ttft is not None and a_tpot is not None:
        slo_met = a_ttft >= slo.percentile and a_tpot >= slo.percentile
    cost = None
    if gpu_hour_price is not None and gen and low is not None and low > 0:
        cost = gpu_hour_price * gpu_seconds / 3600 / (gen * low) * 1e6
    return ServingSummary(
        name=name, replicas=replicas, minutes=distinct_minutes, gpus=mean_gpus, gpu_seconds=gpu_seconds,
        requests=requests, requests_per_s=requests / wall_s if requests is not None and wall_s else None,
        prompt_tokens_per_gpu_s=prompt / gpu_seconds if prompt is not None and gpu_seconds else None,
        generation_tokens_per_gpu_s=gen / gpu_seconds if gen is not None and gpu_seconds else None,
        latency=latency, tpot_from=tpot_from, queue_mean_s=queue_mean,
        kv_usage_mean=_mean(kv), kv_usage_max=max(kv) if kv else None, waiting_mean=_mean(waiting),
        batch_size_mean=batch, preemptions=_sum_known(minutes, "preemptions"), sm_active_mean=_mean(sm),
        gpu_util_mean=_mean(util),
        slo=slo, ttft_attainment=a_ttft, tpot_attainment=a_tpot,
        ttft_attainment_range=r_ttft, tpot_attainment_range=r_tpot,
        ttft_attainment_exact=_exact(r_ttft), tpot_attainment_exact=_exact(r_tpot), goodput_share=low,
        goodput_range=goodput_range(r_ttft, r_tpot),
        goodput_rps=goodput_rps,
        goodput_rps_per_gpu=goodput_rps / mean_gpus if goodput_rps is not None and mean_gpus else None,
        slo_met=slo_met, cost_per_million_good_tokens=cost, notes=notes)


def _exact(r: tuple[float, float] | None) -> bool | None:
    return None if r is None else r[0] == r[1]


def _batch_size(minutes: Sequence[ServingMinute]) -> float | None:
    """Mean requests per engine iteration: the running gauge, or Triton's inferences per execution.
    A replica's minutes are averaged per replica (a deployment's batch is its replicas' mean)."""
    running = [v for m in minutes if (v := m.scalar("running")) is not None]
    if running:
        return sum(running) / len(running)
    inf, ex = _sum_known(minutes, "inferences"), _sum_known(minutes, "executions")
    if inf is not None and ex:
        return inf / ex
    return None


def tpot_judged(s: ServingSummary) -> float | None:
    """The TPOT to hold against the SLO: the per-request series' SLO percentile, or, when the engine
    exports only per-token inter-token latency, its mean (the per-token tail is not a per-request
    percentile: one slow prefill stalls every running request's next token, which averages out
    within a request)."""
    if s.tpot_from == "tpot":
        return s.latency.get("tpot", {}).get(f"p{round(s.slo.percentile * 100)}") or s.latency["tpot"].get("p99")
    if s.tpot_from == "itl":
        return s.latency.get("itl", {}).get("mean")
    return None


def by_replica(minutes: Sequence[ServingMinute]) -> dict[str, list[ServingMinute]]:
    out: dict[str, list[ServingMinute]] = {}
    for m in minutes:
        out.setdefault(m.replica, []).append(m)
    return out


def per_minute_attainment(minutes: Sequence[ServingMinute], slo: Slo) -> list[dict[str, float | None]]:
    """The deployment's SLO attainment and p99s minute by minute (the deployment page's series)."""
    by_minute: dict[int, list[ServingMinute]] = {}
    for m in minutes:
        by_minute.setdefault(m.minute, []).append(m)
    out: list[dict[str, float | None]] = []
    for minute in sorted(by_minute):
        ms = by_minute[minute]
        ttft = total(m.hist("ttft") for m in ms)
        tpot, _ = tpot_hist(ms)
        a_t = attainment(ttft, slo.ttft_s) if ttft is not None else None
        a_p = attainment(tpot, slo.tpot_s) if tpot is not None else None
        low, _ = goodput_bounds(a_t, a_p)
        out.append({"minute": float(minute), "ttft_attainment": a_t, "tpot_attainment": a_p, "goodput_share": low,
                    "ttft_p99": quantile(ttft, 0.99) if ttft is not None else None,
                    "tpot_p99": quantile(tpot, 0.99) if tpot is not None else None,
                    "kv_usage": _mean([v for m in ms if (v := m.scalar("kv_usage")) is not None]),
                    "gen_tokens_per_gpu_s": _rate(ms, "generation_tokens")})
    return out


def _rate(ms: Sequence[ServingMinute], name: str) -> float | None:
    v = _sum_known(ms, name)
    gpu_s = sum(60.0 * m.gpus for m in ms)
    return v / gpu_s if v is not None and gpu_s else None

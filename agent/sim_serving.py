"""A serving replica with queueing physics, for tests, the evaluation library and demos.

An iteration-level (continuous batching) engine in the manner of vLLM's scheduler: requests arrive
(Poisson, or bursty: a two-state modulated Poisson process with the same mean), wait in a FIFO
queue, are admitted while the batch has room (``max_num_seqs``), the KV cache has room for their
prompt and the step's prefill budget allows; each iteration costs a fixed overhead, plus prefill
time growing with the prompt tokens it processes, plus decode time growing with the batch size and
the KV it reads. A running request's KV grows one token per output token; when the cache is full
the most recently admitted request is preempted (recompute: its KV is dropped and it goes back to
the head of the queue, to be prefilled again with what it had generated).

Every request keeps its ground truth (queue time, TTFT, TPOT, e2e); the engine's own metrics are
observed as the engine would (one TTFT per request, one ITL per token, ...) into histograms with
each engine's default buckets, and ``render`` writes a page in that engine's exposition format,
driven by gpufleet/serving_metrics.toml (vLLM, SGLang and TGI have buckets there).

Pure Python (no numpy): the agent installs without the server's packages.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from dataclasses import dataclass, field

from gpufleet.serving_metrics import Engine, ServingRegistry, serving_registry

# SM activity model: a decode step of one request keeps SM_FLOOR of the SMs busy, each more request
# adds 1/SM_FULL_BATCH, PREFILL_TOKENS_PER_SEQ prompt tokens count as one decoding request.
SM_FLOOR = 0.3
SM_FULL_BATCH = 64.0
PREFILL_TOKENS_PER_SEQ = 8.0


@dataclass(frozen=True, slots=True)
class EngineModel:
    """How fast the replica's GPU(s) run one iteration, and what it holds."""

    max_num_seqs: int = 256
    kv_capacity_tokens: int = 400_000
    max_prefill_tokens: int = 8192  # per iteration (chunked-prefill budget)
    step_base_s: float = 0.006  # fixed per-iteration GPU time (weights read once per step)
    prefill_s_per_token: float = 0.00006
    decode_s_per_seq: float = 0.00012
    decode_s_per_kv_token: float = 2e-8  # attention reads every running request's KV
    host_s_per_step: float = 0.0  # CPU time per iteration the GPU waits for (scheduling, detokenizing)
    gpus: int = 1


@dataclass(frozen=True, slots=True)
class Workload:
    rate_rps: float
    duration_s: float
    prompt_tokens: tuple[int, int] = (200, 1200)  # uniform range
    output_tokens: tuple[int, int] = (50, 250)
    burst_factor: float = 1.0  # >1: arrivals come in bursts at this multiple of the mean rate
    burst_share: float = 0.2  # share of the time spent bursting (the quiet rate keeps the mean)
    burst_period_s: float = 30.0
    seed: int = 0


@dataclass(slots=True)
class Request:
    rid: int
    arrival: float
    prompt: int
    output: int
    admitted: float | None = None
    first_token: float | None = None
    last_token: float = 0.0
    finished: float | None = None
    generated: int = 0
    preemptions: int = 0
    kv: int = 0

    @property
    def ttft(self) -> float:
        assert self.first_token is not None
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        assert self.finished is not None
        return self.finished - self.arrival

    @property
    def tpot(self) -> float:
        """(e2e - ttft) / (output - 1), as ``vllm bench serve`` computes it; 0 for one-token outputs."""
        assert self.finished is not None and self.first_token is not None
        return (self.finished - self.first_token) / (self.output - 1) if self.output > 1 else 0.0

    @property
    def queue(self) -> float:
        assert self.admitted is not None
        return self.admitted - self.arrival


def arrivals(w: Workload) -> list[Request]:
    """Request arrivals over ``w.duration_s`` (Poisson, or bursty with the same mean rate)."""
    rng = random.Random(w.seed)
    out: list[Request] = []
    t = 0.0
    burst = w.burst_factor > 1.0
    hi = w.rate_rps * w.burst_factor
    lo = max(w.rate_rps * (1 - w.burst_share * w.burst_factor) / (1 - w.burst_share), 0.0) if burst else w.rate_rps
    while True:
        if burst:
            in_burst = (t % w.burst_period_s) < w.burst_share * w.burst_period_s
            rate = hi if in_burst else lo
            # thinning: draw at the peak rate and keep with probability rate / peak
            t += rng.expovariate(hi)
            if t >= w.duration_s:
                break
            if rng.random() * hi > rate:
                continue
        else:
            t += rng.expovariate(w.rate_rps)
            if t >= w.duration_s:
                break
        out.append(Request(len(out), t, rng.randint(*w.prompt_tokens), rng.randint(*w.output_tokens)))
    return out


@dataclass
class _Hist:
    bounds: list[float]  # in the measure's unit; +inf implied last
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.total += v


class EngineMetrics:
    """The engine's own counters, gauges and histograms, as it would keep them."""

    def __init__(self, engine: Engine, registry: ServingRegistry) -> None:
        self.engine = engine
        self.registry = registry
        self.hists: dict[str, _Hist] = {}
        for mname, measure in registry.measures.items():
            if measure.kind != "histogram":
                continue
            em = next((m for m in engine.for_measure(mname) if m.buckets), None)
            if em is not None:
                self.hists[mname] = _Hist([b * em.scale for b in em.buckets])
        self.counters: dict[str, float] = {"requests": 0.0, "prompt_tokens": 0.0, "generation_tokens": 0.0,
                                           "preemptions": 0.0}
        self.gauges: dict[str, float] = {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}

    def observe(self, measure: str, value: float) -> None:
        h = self.hists.get(measure)
        if h is not None:
            h.observe(value)

    def render(self, labels: str = "") -> str:
        """This engine's page: the first series listed for each measure, in its exposition format."""
        lines: list[str] = []
        lab = labels
        for mname, measure in self.registry.measures.items():
            ems = self.engine.for_measure(mname)
            if not ems:
                continue
            if measure.kind == "histogram":
                em = next((m for m in ems if m.buckets), None)
                h = self.hists.get(mname)
                if em is None or h is None:
                    continue
                lines += _hist_lines(em.name, em.buckets, h.counts, h.total / em.scale, lab)
            elif measure.kind == "counter" and mname in self.counters:
                em = ems[0]
                if em.source == "sum":
                    # a per-request length histogram (TGI, Dynamo): only its _sum is read, so one bucket
                    lines += _hist_lines(em.name, (), [int(self.counters["requests"])], self.counters[mname], lab)
                else:
                    lines.append(f"# TYPE {em.name} counter")
                    lines.append(f"{em.name}{_braces(lab)} {self.counters[mname] / em.scale!r}")
            elif measure.kind == "gauge" and mname in self.gauges:
                em = ems[0]
                lines.append(f"# TYPE {em.name} gauge")
                lines.append(f"{em.name}{_braces(lab)} {self.gauges[mname] / em.scale!r}")
        return "\n".join(lines) + "\n"


def _braces(labels: str, extra: str = "") -> str:
    inner = ",".join(p for p in (labels, extra) if p)
    return f"{{{inner}}}" if inner else ""


def _hist_lines(name: str, bounds: tuple[float, ...], counts: list[int], total: float, labels: str) -> list[str]:
    out = [f"# TYPE {name} histogram"]
    cum = 0
    for b, c in zip([*bounds, math.inf], counts, strict=True):
        cum += c
        le = "+Inf" if b == math.inf else repr(float(b))
        le_label = 'le="' + le + '"'
        out.append(f"{name}_bucket{_braces(labels, le_label)} {float(cum)!r}")
    out.append(f"{name}_sum{_braces(labels)} {total!r}")
    out.append(f"{name}_count{_braces(labels)} {float(cum)!r}")
    return out


@dataclass
class SimResult:
    requests: list[Request]
    pages: list[tuple[float, str]]  # (scrape time, page)
    gpu_busy_s: list[float]  # per minute: GPU time spent in iterations (host waits excluded)
    engine: str
    sm_active: list[float] = field(default_factory=list)  # per minute: modelled SM activity of the GPUs

    def sm_active_at(self, minute: int) -> float | None:
        return self.sm_active[minute] if 0 <= minute < len(self.sm_active) else None

    def gpu_util_at(self, minute: int) -> float | None:
        """NVML utilisation: the share of the minute a kernel ran (iterations; host waits excluded)."""
        return min(1.0, self.gpu_busy_s[minute] / 60.0) if 0 <= minute < len(self.gpu_busy_s) else None

    def finished(self) -> list[Request]:
        return [r for r in self.requests if r.finished is not None]


def simulate(model: EngineModel, workload: Workload, engine: str = "vllm", scrape_s: float = 15.0,
             labels: str = 'model_name="sim/llama-3.1-8b"', registry: ServingRegistry | None = None,
             drain: bool = True) -> SimResult:
    """Run the replica through the workload; pages are scraped every ``scrape_s`` from t=0.

    With ``drain`` the run continues after the last arrival until every request has finished (and
    one more scrape is taken), so each request's ground truth is complete."""
    reg = registry or serving_registry()
    if workload.prompt_tokens[1] + workload.output_tokens[1] > model.kv_capacity_tokens:
        raise ValueError("the longest request does not fit in the KV cache: raise kv_capacity_tokens")
    metrics = EngineMetrics(reg.engine(engine), reg)
    pending = deque(arrivals(workload))
    requests = list(pending)
    waiting: deque[Request] = deque()
    running: list[Request] = []
    pages: list[tuple[float, str]] = []
    busy: dict[int, float] = {}
    sm: dict[int, float] = {}
    kv_used = 0
    t = 0.0
    next_scrape = 0.0

    def scrape_until(now: float) -> None:
        nonlocal next_scrape
        while next_scrape <= now:
            metrics.gauges.update(running=float(len(running)), waiting=float(len(waiting)),
                                  kv_usage=kv_used / model.kv_capacity_tokens)
            pages.append((next_scrape, metrics.render(labels)))
            next_scrape += scrape_s

    while pending or waiting or running:
        while pending and pending[0].arrival <= t:
            waiting.append(pending.popleft())
        if not waiting and not running:
            if not drain and pending[0].arrival > workload.duration_s:
                break
            scrape_until(pending[0].arrival)
            t = pending[0].arrival
            continue
        # admission: FIFO, while the batch, the KV cache and the step's prefill budget allow
        budget = model.max_prefill_tokens
        prefill: list[Request] = []
        while waiting and len(running) + len(prefill) < model.max_num_seqs:
            r = waiting[0]
            need = r.prompt + r.generated  # a preempted request recomputes what it had generated
            if kv_used + need > model.kv_capacity_tokens or (prefill and need > budget):
                break
            waiting.popleft()
            prefill.append(r)
            budget -= need
            kv_used += need
            r.kv = need
            if r.admitted is None:
                r.admitted = t
                metrics.observe("queue_time", r.queue)
        decoding = list(running)
        prefill_tokens = sum(r.kv for r in prefill)
        kv_read = sum(r.kv for r in decoding)
        gpu_s = (model.step_base_s + prefill_tokens * model.prefill_s_per_token
                 + len(decoding) * model.decode_s_per_seq + kv_read * model.decode_s_per_kv_token)
        t_next = t + gpu_s + model.host_s_per_step
        scrape_until(t_next)
        minute = int(t // 60)
        busy[minute] = busy.get(minute, 0.0) + gpu_s
        # SM activity of the iteration: prefill fills the SMs, a decode step's share grows with the batch
        # (a small batch is memory-bound and leaves most SMs waiting on weight reads)
        fill = min(1.0, SM_FLOOR + (len(decoding) + prefill_tokens / PREFILL_TOKENS_PER_SEQ) / SM_FULL_BATCH)
        sm[minute] = sm.get(minute, 0.0) + gpu_s * fill
        t = t_next
        metrics.counters["prompt_tokens"] += prefill_tokens
        # every request in the step emits one token: prefill gives the first, decode the next
        fresh = {r.rid for r in prefill}
        for r in prefill + decoding:
            if r.first_token is None:
                r.first_token = t
                metrics.observe("ttft", r.ttft)
            else:
                metrics.observe("itl", t - r.last_token)
            r.last_token = t
            r.generated += 1
            metrics.counters["generation_tokens"] += 1
            if r.rid not in fresh:
                r.kv += 1
                kv_used += 1
        running = decoding + prefill
        # finished requests leave and free their KV
        still: list[Request] = []
        for r in running:
            if r.generated >= r.output:
                r.finished = t
                kv_used -= r.kv
                metrics.counters["requests"] += 1
                metrics.observe("e2e", r.e2e)
                metrics.observe("tpot", r.tpot)
            else:
                still.append(r)
        running = still
        # KV over capacity: preempt the most recently admitted (recompute) until it fits
        while kv_used > model.kv_capacity_tokens and running:
            victim = running.pop()
            kv_used -= victim.kv
            victim.kv = 0
            victim.preemptions += 1
            metrics.counters["preemptions"] += 1
            waiting.appendleft(victim)
    # an idle replica is scraped too, to the workload's end (its engine answers with nothing new)
    scrape_until(max(t, workload.duration_s) + scrape_s)
    minutes = int(max(t, workload.duration_s) // 60) + 1
    return SimResult(requests, pages, [busy.get(m, 0.0) for m in range(minutes)], engine,
                     [min(1.0, sm.get(m, 0.0) / 60.0) for m in range(minutes)])

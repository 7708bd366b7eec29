"""A held-out library of serving scenarios, written from the engines' tuning guides and serving papers.

    .venv/bin/python bench/serving/evaluate.py --library heldout            # 3 seeds x every scenario
    .venv/bin/python bench/serving/scenarios_heldout.py --truth             # the simulator's own truth

Written blind to the detectors: the scenarios and their labels were written and committed before
the author read analysis/serving/detectors/*, analysis/serving/thresholds.toml, flags.py or the
first library (bench/serving/scenarios.py), and before running the detectors on them. Each label
is the set of serving kinds (gpufleet/flagkinds.toml, source = "serving") that a correct engine
must raise on the situation the source describes (``must``), plus kinds that are defensible but not
required (``may``: neither a hit nor a false alarm). ``cause`` is the slo_missed cause the source
names. Healthy scenarios have an empty ``must``.

Each scenario runs agent/sim_serving.py once per replica (the engine's own exposition pages, every
15 s), and the pages go through the pipeline gpufleet runs on a real scrape: parse_exposition ->
snapshot -> minutes_of -> ServingMinute (with the replica's modelled SM activity and NVML
utilisation) -> DeploymentView -> detect_serving. ``--truth`` prints, per scenario and seed, what
the simulator itself says (per-request SLO attainment, queue share of TTFT, preempted share, KV use,
batch, requests per minute, GPU busy share): the physical check that the parameters reproduce the
source's situation. For deployments of several replicas it also reruns the whole load on fewer
replicas, which says whether the deployment was in fact larger than its load needs.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gpufleet.agent.sim_serving import EngineModel, SimResult, Workload, simulate
from gpufleet.analysis.serving.measures import ServingMinute
from gpufleet.analysis.serving.slo import PRESETS, Slo
from gpufleet.serving_expo import minutes_of, parse_exposition, snapshot

BASE_EPOCH = 1_767_225_600  # 2026-01-01 00:00 UTC: a minute boundary
KINDS = ("idle_replica", "overprovisioned_deployment", "slo_missed", "batch_too_small", "engine_hw_disagree")

# One H100 serving an 8B model (the simulator's defaults), and the same GPU with a smaller KV pool
# (gpu_memory_utilization lowered, or a long max_model_len reserving memory).
H100_8B = EngineModel()
H100_8B_SMALL_KV = EngineModel(kv_capacity_tokens=60_000)
# A 70B model on 4 GPUs (tensor parallel): slower steps, KV per GPU-set smaller.
TP4_70B = EngineModel(step_base_s=0.018, prefill_s_per_token=0.00012, decode_s_per_seq=0.0003,
                      decode_s_per_kv_token=4e-8, kv_capacity_tokens=250_000, gpus=4)
CHAT = Workload(rate_rps=1.0, duration_s=600)  # prompt 200-1200, output 50-250 tokens
LAX = Slo(600.0, 1.0, 0.99, "offline batch job: 10 min TTFT, 1 s TPOT")


@dataclass(frozen=True, slots=True)
class Replica:
    model: EngineModel
    workload: Workload
    # what the replica's GPUs report: "own" (the simulated GPUs), "idle_gpus" (the counters of GPUs
    # that run nothing: the scraped endpoint belongs to another replica), "shared_busy" (another
    # process keeps the GPUs busy beside the engine)
    hw: str = "own"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    source: str  # where the situation is described (title, URL)
    situation: str  # the situation, in the source's terms
    replicas: tuple[Replica, ...]
    must: frozenset[str]
    may: frozenset[str] = frozenset()
    cause: str | None = None  # the slo_missed cause the situation has
    slo: Slo = PRESETS["mlperf-llama3.1-8b"]
    engine: str = "vllm"

    @property
    def healthy(self) -> bool:
        return not self.must


def _reps(model: EngineModel, w: Workload, n: int, hw: str = "own") -> tuple[Replica, ...]:
    return tuple(Replica(model, w, hw) for _ in range(n))


F = frozenset
VLLM_TUNING = "vLLM, Optimization and Tuning (https://docs.vllm.ai/en/stable/configuration/optimization/)"
SGLANG_TUNING = ("SGLang, Hyperparameter Tuning "
                 "(https://docs.sglang.io/docs/advanced_features/hyperparameter_tuning.md)")
TGI_LAUNCHER = ("TGI, text-generation-launcher arguments "
                "(https://huggingface.co/docs/text-generation-inference/basic_tutorials/launcher)")
BURSTGPT = "BurstGPT: A Real-World Workload Dataset to Optimize LLM Serving Systems (https://arxiv.org/abs/2401.17644)"
DISTSERVE = ("DistServe: Disaggregating Prefill and Decoding for Goodput-optimized LLM Serving, OSDI'24 "
             "(https://openreview.net/forum?id=sNifYctwnP)")
SPLITWISE = ("Splitwise: Efficient Generative LLM Inference Using Phase Splitting "
             "(https://www.microsoft.com/en-us/research/publication/splitwise-efficient-generative-llm-inference-using-phase-splitting)")
KNATIVE = ("Knative Serving, scale bounds / scale to zero "
           "(https://docs.openshift.com/serverless/1.30/knative-serving/autoscaling/"
           "serverless-autoscaling-scale-to-zero.html); "
           "KServe KPA autoscaler (https://kserve.github.io/website/docs/model-serving/predictive-inference/autoscaling/kpa-autoscaler)")
TIME_SLICING = ("NVIDIA GPU Operator, Time-Slicing GPUs in Kubernetes "
                "(https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html)")

LIBRARY: list[Scenario] = [
    # ---- healthy: a correct engine raises nothing ---------------------------------------------------
    Scenario(
        "steady_single_replica",
        VLLM_TUNING + "; vLLM metrics (num_requests_running/waiting, kv_cache_usage_perc)",
        "one replica, steady Poisson chat traffic at about a third of what it can carry: no preemption, "
        "an empty queue, latency well within the SLO; the smallest deployment there is (one replica)",
        _reps(H100_8B, replace(CHAT, rate_rps=5.0), 1), F()),
    Scenario(
        "right_sized_three_replicas",
        KNATIVE + " (target concurrency sized to the load)",
        "three replicas behind a load balancer, each near the load it can carry within the SLO: the "
        "autoscaler's target is met; removing one replica would push the other two past the SLO",
        _reps(H100_8B, replace(CHAT, rate_rps=12.0), 3), F()),
    Scenario(
        "diurnal_trough_one_replica",
        "Azure LLM inference traces (diurnal load; https://github.com/Azure/AzurePublicDataset); " + KNATIVE,
        "night trough of a diurnal chat service held at minReplicas=1: light but steady traffic "
        "(tens of requests a minute), every request well inside the SLO",
        _reps(H100_8B, replace(CHAT, rate_rps=0.5, duration_s=1200), 1), F()),
    Scenario(
        "offline_batch_full_queue",
        SGLANG_TUNING,
        "offline batch inference: the client keeps a deep queue (the guide calls #queue-req 100-2000 "
        "healthy) and the KV cache full (token usage > 0.9 is good utilisation); the job's SLO is "
        "throughput, its latency targets relaxed",
        # max_running_requests high enough that the KV pool, not the request cap, bounds the batch
        _reps(EngineModel(max_num_seqs=1024), replace(CHAT, rate_rps=11.0, duration_s=480,
                                                      output_tokens=(200, 600)), 1),
        F(), slo=LAX, engine="sglang"),
    Scenario(
        "bursty_absorbed",
        BURSTGPT,
        "bursty arrivals (bursts at 3x the mean rate) on a replica with headroom: bursts raise the "
        "batch for a few seconds, the queue drains, the SLO holds",
        _reps(H100_8B, replace(CHAT, rate_rps=3.0, burst_factor=3.0, burst_share=0.2, burst_period_s=40.0), 1),
        F()),
    Scenario(
        "tgi_steady",
        TGI_LAUNCHER,
        "TGI replica with its default batch limits and moderate traffic: requests are batched without "
        "waiting, latency within the SLO",
        _reps(H100_8B, replace(CHAT, rate_rps=4.0), 1), F(), engine="tgi"),
    Scenario(
        "long_context_rag_within_slo",
        "vLLM chunked prefill (" + VLLM_TUNING + "#chunked-prefill)",
        "RAG with 3-6k token prompts, chunked prefill on (8192-token budget), a 70B model on 4 GPUs "
        "with the Llama-2-70B SLO: prefill is long but inside the 2 s TTFT target",
        _reps(TP4_70B, replace(CHAT, rate_rps=0.3, prompt_tokens=(3000, 6000), output_tokens=(50, 200)), 1),
        F(), slo=PRESETS["mlperf-llama2-70b"]),
    Scenario(
        "interactive_small_batch_met",
        "MLPerf Inference interactive scenario (TTFT 500 ms / TPOT 30 ms); " + VLLM_TUNING,
        "latency-sensitive assistant with the interactive SLO at light load: small batches, every "
        "token within 30 ms",
        _reps(H100_8B, replace(CHAT, rate_rps=2.0), 1), F(), slo=PRESETS["mlperf-llama3.1-8b-interactive"]),
    # ---- idle replicas ----------------------------------------------------------------------------
    Scenario(
        "forgotten_replica_overnight",
        KNATIVE,
        "a replica kept at min-scale=1 (scale to zero disabled) after its users left: no requests for "
        "40 minutes while it holds its GPU",
        _reps(H100_8B, replace(CHAT, rate_rps=1e-4, duration_s=2400), 1),
        F({"idle_replica"}), may=F({"overprovisioned_deployment"})),
    Scenario(
        "traffic_moved_away",
        KNATIVE + " (traffic split / canary rollback)",
        "a replica serves chat for 10 minutes, then the route sends its traffic elsewhere; it stays up, "
        "idle, for 30 minutes",
        # all arrivals in the first quarter of one 40-minute period: the rest of the period is silent
        _reps(H100_8B, Workload(rate_rps=1.0, duration_s=2400, burst_factor=4.0, burst_share=0.25,
                                burst_period_s=2400.0), 1),
        F({"idle_replica"}), may=F({"overprovisioned_deployment"})),
    Scenario(
        "one_of_two_replicas_idle",
        KNATIVE + "; the Kubernetes Service's session affinity pins every client to one pod",
        "two replicas, but every client is pinned to the first (sticky sessions): the second receives no "
        "request for 30 minutes",
        (Replica(H100_8B, replace(CHAT, rate_rps=2.0, duration_s=1800)),
         Replica(H100_8B, replace(CHAT, rate_rps=1e-4, duration_s=1800))),
        F({"idle_replica"}), may=F({"overprovisioned_deployment"})),
    # ---- over-provisioned -------------------------------------------------------------------------
    Scenario(
        "holiday_four_replicas",
        KNATIVE + " (minReplicas kept at the peak's count)",
        "four replicas sized for a weekday peak, on a holiday: each carries a tenth of its capacity, "
        "the queue is empty, KV use low, latency far under the SLO; one replica carries it all",
        _reps(H100_8B, replace(CHAT, rate_rps=1.5), 4),
        F({"overprovisioned_deployment"})),
    Scenario(
        "tp4_70b_two_replicas_light",
        SPLITWISE + "; " + KNATIVE,
        "two 4-GPU replicas of a 70B model serving a trickle (a request every few seconds): eight "
        "GPUs for a load one replica carries with room to spare",
        _reps(TP4_70B, replace(CHAT, rate_rps=0.3), 2),
        F({"overprovisioned_deployment"}), slo=PRESETS["mlperf-llama2-70b"]),
    Scenario(
        "sglang_six_replicas_low",
        SGLANG_TUNING + " (#queue-req: 0 frequently: the client sends too slowly)",
        "six SGLang replicas whose queue is always 0 and token usage low: the fleet is far larger than "
        "the traffic",
        _reps(H100_8B, replace(CHAT, rate_rps=1.0), 6),
        F({"overprovisioned_deployment"}), engine="sglang"),
    # ---- SLO missed, by cause ---------------------------------------------------------------------
    Scenario(
        "kv_preemption_small_cache",
        VLLM_TUNING + " (Preemption)",
        "KV cache space is insufficient for the batch (low gpu_memory_utilization): vLLM preempts "
        "requests and recomputes them, which hurts end-to-end latency; the guide's remedy is more "
        "gpu_memory_utilization or fewer max_num_seqs",
        _reps(H100_8B_SMALL_KV, replace(CHAT, rate_rps=5.0, output_tokens=(300, 900)), 1),
        F({"slo_missed"}), cause="kv_pressure"),
    Scenario(
        "bursty_kv_pressure",
        BURSTGPT + " (bursts expose KV-cache pressure)",
        "BurstGPT-like bursts at 4x the mean rate on a replica with a small KV pool: during bursts the "
        "cache fills and requests are preempted; the SLO is missed in the bursts",
        _reps(H100_8B_SMALL_KV, replace(CHAT, rate_rps=4.0, output_tokens=(200, 700), burst_factor=4.0,
                                        burst_share=0.2, burst_period_s=60.0), 1),
        F({"slo_missed"}), cause="kv_pressure"),
    Scenario(
        "sglang_kv_pool_full",
        SGLANG_TUNING + " ('KV cache pool is full. Retract requests')",
        "SGLang with token usage pinned near 1.0 and a growing queue: requests are retracted for lack "
        "of KV space (SGLang exports no preemption counter); latency misses the SLO",
        # the vLLM preemption scenario's physics, read through SGLang's page (no preemption series)
        _reps(H100_8B_SMALL_KV, replace(CHAT, rate_rps=5.0, output_tokens=(300, 900)), 1),
        F({"slo_missed"}), cause="kv_pressure", engine="sglang"),
    Scenario(
        "peak_overload_queueing",
        "Azure LLM inference traces (peak hour; https://github.com/Azure/AzurePublicDataset); " + VLLM_TUNING,
        "the peak hour brings more requests than the replica serves: requests wait in the scheduler's "
        "queue, TTFT grows with the queue; the KV cache is large enough that memory is not the limit",
        _reps(H100_8B, replace(CHAT, rate_rps=17.0, duration_s=420), 1),
        F({"slo_missed"}), may=F({"batch_too_small"}), cause="queueing"),
    Scenario(
        "long_prompts_prefill_bound",
        DISTSERVE + "; " + SPLITWISE,
        "long-document prompts (12-20k tokens) under the interactive TTFT target: each prompt's prefill "
        "alone takes longer than the target, with hardly any queue; the papers' remedy is to separate "
        "prefill from decode",
        _reps(H100_8B, replace(CHAT, rate_rps=0.15, prompt_tokens=(12000, 20000), output_tokens=(20, 80)), 1),
        F({"slo_missed"}), cause="prefill_bound", slo=Slo(0.5, 0.1, 0.99, "interactive TTFT, default TPOT")),
    Scenario(
        "large_batch_decode_bound",
        VLLM_TUNING + " (max_num_seqs); " + DISTSERVE + " (TPOT)",
        "a 70B replica (4 GPUs, max_num_seqs 256) tuned for throughput serves an interactive product "
        "(MLPerf Llama-2-70B interactive: TTFT 450 ms, TPOT 40 ms): short prompts, no queue, but the "
        "batch grows to ~60 requests and each decode step is slower than the TPOT target; TTFT is fine",
        _reps(TP4_70B, replace(CHAT, rate_rps=5.0, prompt_tokens=(100, 300), output_tokens=(200, 400)), 1),
        F({"slo_missed"}), cause="decode_bound", slo=PRESETS["mlperf-llama2-70b-interactive"]),
    Scenario(
        "host_bound_eager_mode",
        "vLLM v0.6 performance update: CPU overhead (API server, scheduling, detokenization) left the GPU "
        "idle (https://blog.vllm.ai/2024/09/05/perf-update.html); CUDA graphs vs --enforce-eager",
        "the engine runs with --enforce-eager and a slow host: every step waits ~30 ms on the CPU, the "
        "GPUs run kernels a minority of the time, and TPOT misses its target",
        _reps(EngineModel(host_s_per_step=0.030), replace(CHAT, rate_rps=4.0), 1),
        F({"slo_missed"}), may=F({"engine_hw_disagree"}), cause="host_bound",
        slo=Slo(2.0, 0.040, 0.99, "TTFT 2 s, TPOT 40 ms")),
    # ---- batch held small -------------------------------------------------------------------------
    Scenario(
        "sglang_conservative_cap",
        SGLANG_TUNING + " (token usage < 0.9 and #queue-req > 0: too conservative)",
        "SGLang started with --max-running-requests 8 (copied from a small-GPU config): the batch sits "
        "at 8 while requests queue and the KV pool is mostly empty; TTFT misses the SLO",
        _reps(EngineModel(max_num_seqs=8), replace(CHAT, rate_rps=6.0, duration_s=480), 1),
        F({"batch_too_small", "slo_missed"}), cause="queueing", engine="sglang"),
    Scenario(
        "offline_max_num_seqs_low",
        VLLM_TUNING + " (max_num_seqs); Triton dynamic batcher, max_batch_size "
        "(https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/batcher.html)",
        "an offline vLLM job started with --max-num-seqs 16 and a relaxed SLO: the batch is pinned at 16, "
        "a queue waits, the KV cache stays mostly empty; the job meets its SLO but runs at a fraction of "
        "the throughput the GPU allows (TGI has no KV series, so this one is vLLM)",
        _reps(EngineModel(max_num_seqs=16), replace(CHAT, rate_rps=9.0, duration_s=480), 1),
        F({"batch_too_small"}), slo=LAX),
    # ---- engine and hardware disagree -------------------------------------------------------------
    Scenario(
        "scraped_wrong_endpoint",
        "Prometheus pod annotations (prometheus.io/port) pointing at another pod's port; " + VLLM_TUNING,
        "the annotation sends the scrape to a busy replica's port while this pod's GPUs run nothing: "
        "the engine page shows a full batch, the GPUs show no SM activity",
        _reps(H100_8B, replace(CHAT, rate_rps=8.0), 1, hw="idle_gpus"),
        F({"engine_hw_disagree"})),
    Scenario(
        "gpu_time_sliced_with_training",
        TIME_SLICING,
        "the serving pod's GPU is time-sliced with a training job: the engine has no request for 20 "
        "minutes, yet its GPU is busy with the other process's kernels",
        _reps(H100_8B, replace(CHAT, rate_rps=1e-4, duration_s=1200), 1, hw="shared_busy"),
        F({"engine_hw_disagree"}), may=F({"idle_replica", "overprovisioned_deployment"})),
]


# --- running a scenario through the pipeline -----------------------------------------------------


@dataclass
class Run:
    scenario: Scenario
    seed: int
    minutes: list[ServingMinute]
    sims: list[SimResult] = field(default_factory=list)

    @property
    def view(self) -> object:
        from gpufleet.analysis.serving.detectors import DeploymentView

        return DeploymentView(self.scenario.name, self.scenario.slo, self.minutes)


def _hw(kind: str, res: SimResult, i: int, seed: int) -> tuple[float | None, float | None]:
    """(SM activity, NVML utilisation) the replica's GPUs report in minute i."""
    if kind == "own":
        return res.sm_active_at(i), res.gpu_util_at(i)
    if kind == "idle_gpus":
        return 0.0, 0.0
    if kind == "shared_busy":  # another process's kernels: busy most of the time, SMs well used
        wobble = ((i * 7919 + seed * 104729) % 11) / 100
        return 0.62 + wobble, 0.90 + wobble / 2
    raise ValueError(kind)


def run(s: Scenario, seed: int) -> Run:
    minutes: list[ServingMinute] = []
    sims: list[SimResult] = []
    for k, rep in enumerate(s.replicas):
        res = simulate(rep.model, replace(rep.workload, seed=seed * 1000 + k), engine=s.engine)
        sims.append(res)
        scrapes = [(BASE_EPOCH + t, snapshot(parse_exposition(page), s.engine)) for t, page in res.pages]
        for start, measures in sorted(minutes_of(scrapes).items()):
            i = (start - BASE_EPOCH) // 60
            sm, util = _hw(rep.hw, res, i, seed)
            minutes.append(ServingMinute(s.name, f"{s.name}-{k}", start, rep.model.gpus, s.engine, measures,
                                         sm_active=sm, gpu_util=util))
    minutes.sort(key=lambda m: (m.minute, m.replica))
    return Run(s, seed, minutes, sims)


# --- the simulator's own truth (the physical check) ----------------------------------------------


def truth(r: Run) -> dict[str, float | int | bool]:
    s = r.scenario
    done = [q for res in r.sims for q in res.finished()]
    n = len(done)
    a_ttft = sum(q.ttft <= s.slo.ttft_s for q in done) / n if n else 1.0
    a_tpot = sum(q.tpot <= s.slo.tpot_s for q in done) / n if n else 1.0
    queue = statistics.fmean(q.queue for q in done) if n else 0.0
    ttft = statistics.fmean(q.ttft for q in done) if n else 0.0
    kv = [m.scalar("kv_usage") for m in r.minutes]
    run_ = [m.scalar("running") for m in r.minutes]
    wait = [m.scalar("waiting") for m in r.minutes]
    busy = [res.gpu_util_at(i) or 0.0 for res in r.sims for i in range(len(res.gpu_busy_s))]
    per_rep_rpm = [len(res.finished()) / max(1.0, len(res.gpu_busy_s)) for res in r.sims]
    return {
        "requests": n,
        "ttft_att": round(a_ttft, 4), "tpot_att": round(a_tpot, 4),
        "slo_missed": min(a_ttft, a_tpot) < s.slo.percentile,
        "queue_share": round(queue / ttft, 2) if ttft else 0.0,
        "preempted_share": round(sum(q.preemptions > 0 for q in done) / n, 3) if n else 0.0,
        "kv_max": round(max((v for v in kv if v is not None), default=0.0), 2),
        "running_mean": round(statistics.fmean(v for v in run_ if v is not None), 1) if any(
            v is not None for v in run_) else 0.0,
        "waiting_mean": round(statistics.fmean(v for v in wait if v is not None), 1) if any(
            v is not None for v in wait) else 0.0,
        "min_rpm_per_replica": round(min(per_rep_rpm), 1),
        "gpu_busy_mean": round(statistics.fmean(busy), 2) if busy else 0.0,
    }


def on_fewer(s: Scenario, seed: int, n: int) -> dict[str, float | int | bool]:
    """The deployment's whole load on ``n`` replicas of the same kind (the first replica's)."""
    rep = s.replicas[0]
    total = sum(x.workload.rate_rps for x in s.replicas)
    w = replace(rep.workload, rate_rps=total / n)
    return truth(run(replace(s, replicas=_reps(rep.model, w, n, rep.hw)), seed))


# --- scoring ------------------------------------------------------------------------------------


@dataclass
class Row:
    scenario: Scenario
    seed: int
    raised: set[str]
    cause: str


def evaluate(seeds: int, names: Sequence[str] = ()) -> list[Row]:
    from gpufleet.analysis.serving.detectors import detect_serving

    rows: list[Row] = []
    for seed in range(seeds):
        for s in LIBRARY:
            if names and s.name not in names:
                continue
            r = run(s, seed)
            found = detect_serving(r.view)  # type: ignore[arg-type]
            cause = next((str(f.evidence.get("cause")) for f in found if f.kind == "slo_missed"), "")
            rows.append(Row(s, seed, {f.kind for f in found}, cause))
    return rows


def report(rows: Sequence[Row], seeds: int) -> None:
    n_s = len({r.scenario.name for r in rows})
    print(f"held-out library: {n_s} scenarios x {seeds} seeds\n")
    print("| kind | positives | TP | FP | FN | precision | recall |")
    print("|---|---|---|---|---|---|---|")
    for kind in KINDS:
        tp = sum(kind in r.scenario.must and kind in r.raised for r in rows)
        fn = sum(kind in r.scenario.must and kind not in r.raised for r in rows)
        fp = sum(kind in r.raised and kind not in r.scenario.must | r.scenario.may for r in rows)
        prec = f"{tp / (tp + fp):.2f}" if tp + fp else "n/a"
        rec = f"{tp / (tp + fn):.2f}" if tp + fn else "n/a"
        print(f"| {kind} | {tp + fn} | {tp} | {fp} | {fn} | {prec} | {rec} |")
    healthy = [r for r in rows if r.scenario.healthy]
    flagged = [r for r in healthy if r.raised - r.scenario.may]
    print(f"\nhealthy runs flagged: {len(flagged)} of {len(healthy)}")
    causes = [r for r in rows if r.scenario.cause and "slo_missed" in r.raised]
    right = sum(r.cause == r.scenario.cause for r in causes)
    print(f"slo_missed cause named right: {right} of {len(causes)} raised flags with an expected cause\n")
    print("| scenario | seed | must | may | raised | cause expected | cause named | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r.scenario
        missed = s.must - r.raised
        extra = r.raised - s.must - s.may
        verdict = "ok" if not missed and not extra else "; ".join(
            [*(f"missed {k}" for k in sorted(missed)), *(f"false {k}" for k in sorted(extra))])
        print(f"| {s.name} | {r.seed} | {', '.join(sorted(s.must)) or '-'} | {', '.join(sorted(s.may)) or '-'} | "
              f"{', '.join(sorted(r.raised)) or '-'} | {s.cause or '-'} | {r.cause or '-'} | {verdict} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--truth", action="store_true", help="print the simulator's truth instead of running detectors")
    ap.add_argument("--only", nargs="*", default=[], help="scenario names")
    args = ap.parse_args()
    if not args.truth:
        report(evaluate(args.seeds, args.only), args.seeds)
        return
    for s in LIBRARY:
        if args.only and s.name not in args.only:
            continue
        for seed in range(args.seeds):
            t = truth(run(s, seed))
            print(s.name, seed, sorted(s.must), s.cause or "-", t)
            if len(s.replicas) > 1 and seed == 0:
                print("   on", len(s.replicas) - 1, "replicas:", on_fewer(s, seed, len(s.replicas) - 1))
                if len(s.replicas) > 2:
                    print("   on", max(1, len(s.replicas) // 2), "replicas:",
                          on_fewer(s, seed, max(1, len(s.replicas) // 2)))


if __name__ == "__main__":
    main()

"""The serving evaluation library: deployments built from what the engines' tuning guides describe.

Each scenario is a situation an engine's own guide warns about (or a healthy deployment), run on
the serving simulator (agent/sim_serving.py) replica by replica, scraped as gpufleet scrapes a
replica. Its labels say which serving flag kinds a reader of that guide expects, written from the
guide, not from the detectors:

- vLLM, Optimization and Tuning (https://docs.vllm.ai/en/latest/configuration/optimization.html):
  preemption when the KV cache is too small for the batch (raise gpu_memory_utilization, lower
  max_num_seqs / max_num_batched_tokens, more tensor parallelism); chunked prefill and
  max_num_batched_tokens trading TTFT against ITL (long prompts make TTFT prefill-bound, large
  batches make ITL decode-bound).
- SGLang, Hyperparameter Tuning (https://docs.sglang.io/advanced_features/hyperparameter_tuning.html):
  token usage well under 0.9 while #queue-req > 0 means the server admits too few requests (the
  batch cap); #queue-req 0 with low token usage means the server is under-loaded.
- TGI (https://huggingface.co/docs/text-generation-inference/reference/metrics): no TTFT series,
  so TTFT-based judgements must stay unknown rather than pass or fail.
- Kubernetes autoscaling practice (HPA minReplicas): a replica kept up with no traffic is idle.

``slo_missed`` is labelled from the simulator's per-request ground truth (the SLO's percentile of
true TTFT or TPOT over its target), with the cause the scenario was built to have.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from gpufleet.agent.sim_serving import EngineModel, SimResult, Workload, simulate
from gpufleet.analysis.serving.detectors import DeploymentView
from gpufleet.analysis.serving.measures import ServingMinute
from gpufleet.analysis.serving.slo import PRESETS, Slo
from gpufleet.serving_expo import minutes_of, parse_exposition, snapshot

DEFAULT_MODEL = EngineModel()
# A slower engine (a 70B-class model per GPU group) saturates at a few requests a second, which
# keeps the simulation cheap.
SLOW = EngineModel(step_base_s=0.03, prefill_s_per_token=0.0002, decode_s_per_seq=0.0008,
                   decode_s_per_kv_token=5e-8, kv_capacity_tokens=24_000, max_num_seqs=128, gpus=4)

# The same engine with KV to spare: scenarios whose guide names another cause than KV pressure.
ROOMY = dataclasses.replace(SLOW, kv_capacity_tokens=200_000)


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str  # which guide it comes from
    model: EngineModel
    workload: Workload  # per replica
    replicas: int = 1
    engine: str = "vllm"
    slo: Slo = PRESETS["mlperf-llama2-70b"]
    labels: frozenset[str] = frozenset()  # expected kinds besides slo_missed (which comes from the truth)
    cause: str | None = None  # the cause slo_missed should name, when the truth says it is missed
    idle_replicas: int = 0  # replicas that get no traffic
    sm_override: float | None = None  # the GPUs' SM activity as the hardware reports it, when it disagrees
    notes: str = ""
    replica_rates: tuple[float, ...] = field(default=())


def _w(rate: float, minutes: float = 8, **kw: object) -> Workload:
    return Workload(rate_rps=rate, duration_s=minutes * 60, **kw)  # type: ignore[arg-type]


LIBRARY: tuple[Scenario, ...] = (
    Scenario("healthy_two_replicas", "a deployment sized for its load (negative case)", SLOW, _w(1.6), 2,
             notes="KV around half full, p99 within the SLO"),
    Scenario("healthy_sglang", "SGLang: token usage high, a short queue, SLO met (negative case)", SLOW,
             _w(1.6), 2, engine="sglang"),
    Scenario("healthy_tgi_no_ttft", "TGI: no TTFT series; judged on TPOT only (negative case)", SLOW, _w(1.2), 2,
             engine="tgi"),
    Scenario("kv_too_small", "vLLM optimization: preemption when KV cache space is insufficient",
             dataclasses.replace(SLOW, kv_capacity_tokens=9_000), _w(1.8), 2, cause="kv_pressure"),
    Scenario("kv_too_small_sglang", "vLLM/SGLang: retraction (preemption) under a full token pool",
             dataclasses.replace(SLOW, kv_capacity_tokens=9_000), _w(1.8), 2, engine="sglang",
             cause="kv_pressure"),
    Scenario("long_prompts_tight_ttft", "vLLM optimization: chunked prefill; long prompts make TTFT prefill-bound",
             dataclasses.replace(ROOMY, max_prefill_tokens=16384), _w(0.25, prompt_tokens=(7000, 9000)), 2,
             slo=PRESETS["mlperf-llama2-70b-interactive"], cause="prefill_bound"),
    Scenario("big_batch_tight_tpot", "vLLM optimization: larger batches raise ITL (decode-bound)", ROOMY,
             _w(2.0), 2, slo=Slo(2.0, 0.060, 0.99, "custom"), cause="decode_bound"),
    Scenario("bursts_over_capacity", "autoscaling: bursts beyond what the replicas serve queue up",
             ROOMY, _w(3.0, burst_factor=3.0, burst_share=0.25), 2,
             cause="queueing"),
    Scenario("batch_cap_too_low", "SGLang tuning: token usage low while #queue-req > 0 (batch cap)",
             dataclasses.replace(SLOW, max_num_seqs=6), _w(1.2), 2, labels=frozenset({"batch_too_small"}),
             cause="queueing"),
    Scenario("host_bound_scheduler", "vLLM: eager mode / slow CPU: the GPU waits on the host every step",
             dataclasses.replace(ROOMY, host_s_per_step=0.12), _w(1.0), 2, cause="host_bound"),
    Scenario("night_idle_replica", "HPA minReplicas: a replica kept up with no traffic",
             SLOW, _w(0.5, minutes=20), 3, idle_replicas=1,
             labels=frozenset({"idle_replica", "overprovisioned_deployment"}),
             notes="the idle replica also leaves the deployment with a replica it does not need"),
    Scenario("four_replicas_light_load", "SGLang tuning: #queue-req 0 and low token usage on every replica",
             SLOW, _w(0.35), 4, labels=frozenset({"overprovisioned_deployment"})),
    Scenario("four_replicas_light_load_sglang", "the same on SGLang (ITL stands in for TPOT)",
             SLOW, _w(0.35), 4, engine="sglang", labels=frozenset({"overprovisioned_deployment"})),
    Scenario("wrong_gpus_attributed", "the scraped endpoint belongs to other GPUs: engine busy, SMs idle",
             SLOW, _w(1.4), 2, sm_override=0.02, labels=frozenset({"engine_hw_disagree"})),
)


def replica_minutes(res: SimResult, deployment: str, replica: str, gpus: int,
                    sm_override: float | None = None) -> list[ServingMinute]:
    """A simulated replica as gpufleet sees it: its scraped pages folded into minutes, SM activity
    from its GPUs (or ``sm_override`` when the scenario says the hardware reports otherwise)."""
    scrapes = [(t, snapshot(parse_exposition(page), res.engine)) for t, page in res.pages]
    out = []
    for minute, snap in minutes_of(scrapes).items():
        sm = sm_override if sm_override is not None else res.sm_active_at(minute // 60)
        util = res.gpu_util_at(minute // 60) if sm_override is None else sm_override
        out.append(ServingMinute(deployment, replica, minute, gpus, res.engine, snap, sm, util))
    return out


@dataclass
class Run:
    scenario: Scenario
    view: DeploymentView
    results: list[SimResult]

    def truth_slo_missed(self) -> bool:
        done = [r for res in self.results for r in res.finished()]
        if not done:
            return False
        slo = self.scenario.slo
        a_t = sum(r.ttft <= slo.ttft_s for r in done) / len(done)
        a_p = sum(r.tpot <= slo.tpot_s for r in done) / len(done)
        return a_t < slo.percentile or a_p < slo.percentile

    def expected(self) -> set[str]:
        out = set(self.scenario.labels)
        if self.truth_slo_missed():
            out.add("slo_missed")
        return out


def run(s: Scenario, seed: int = 0) -> Run:
    minutes: list[ServingMinute] = []
    results = []
    for i in range(s.replicas):
        idle = i < s.idle_replicas
        w = dataclasses.replace(s.workload, seed=seed * 100 + i, rate_rps=s.workload.rate_rps * (0.001 if idle else 1))
        res = simulate(s.model, w, engine=s.engine, drain=False)
        results.append(res)
        minutes += replica_minutes(res, s.name, f"{s.name}-{i}", s.model.gpus, s.sm_override)
    # minutes past the workload's end (the drain) are not part of the judged window
    end = s.workload.duration_s
    minutes = [m for m in minutes if m.minute + 60 <= end]
    return Run(s, DeploymentView(s.name, s.slo, minutes), results)

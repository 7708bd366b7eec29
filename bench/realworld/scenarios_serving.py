"""Request-driven work: LLM serving replicas under diurnal and bursty load, an
over-provisioned replica, offline batch inference. A serving replica that waits for requests
alternates busy and idle exactly like an input-stalled trainer; the difference is the
workload class (Kubernetes Deployment, serving names and labels), and the advice must differ."""

from __future__ import annotations

import numpy as np

from .builders import job, k8s, slots, stable_id, truths
from .hardware import GIB, H100, L40S
from .model import REPLICA_KINDS, JobSpec, expect, scenario

# vLLM decode is memory-bandwidth bound: DRAM high, tensor moderate (batched GEMV/GEMM).
DECODE = {"duty": 1.0, "sm": 0.62, "occ": 0.25, "tensor": 0.22, "dram": 0.7, "fp16": 0.05, "pcie_rx": 0.05e9,
          "pcie_tx": 0.05e9}


def busy_from_requests(rng: np.random.Generator, rate: np.ndarray, service_s: float) -> np.ndarray:
    """Per-second busy fraction of a server fed Poisson arrivals at ``rate`` (req/s, per second
    of the job) with lognormal service times: a single FIFO work backlog, so bursts queue."""
    n = rate.size
    arrivals = rng.poisson(np.maximum(rate, 0.0))
    work = np.zeros(n)
    nz = np.nonzero(arrivals)[0]
    for j in nz:
        work[j] = float(rng.lognormal(np.log(service_s), 0.5, arrivals[j]).sum())
    busy = np.zeros(n)
    backlog = 0.0
    for i in range(n):
        backlog += work[i]
        b = min(1.0, backlog)
        busy[i] = b
        backlog -= b
    return busy


def _replica(rng: np.random.Generator, seed: int, tag: str, device, d: int, rate: np.ndarray, service_s: float,
             owner: str, app: str) -> tuple[list, list, str, dict]:
    sl = slots(f"{tag}-{seed}", device, 1)
    tr = truths(rng, sl, d)
    g = tr[0]
    g.fill(0, 120, {"duty": 0.4, "sm": 0.2, "pcie_rx": 12e9})  # weights loading, CUDA graph capture
    busy = busy_from_requests(rng, rate[120:], service_s)
    g.mix(120, d, busy, DECODE, {"duty": 0.0})
    # vLLM pre-allocates gpu_memory_utilization (0.9 by default) for weights and KV cache.
    g.memory(0, 120, 0.6 * GIB)
    g.memory(120, d, 0.9 * g.device.memory_total_bytes)
    suffix = stable_id(tag, seed, digits=5)
    jid, meta = k8s(f"{app}-{suffix}-{'abcdefgh'[seed % 8]}q9zt", namespace="inference", owner_kind="Deployment",
                    owner_name=app, app=app, extra={"app.kubernetes.io/component": "server"})
    return sl, tr, jid, meta


SERVING_OK = REPLICA_KINDS | {"low_sm_activity"}


@scenario("serving_diurnal", allows=sorted(SERVING_OK),
          why="A vLLM replica (Kubernetes Deployment) over 8 h from night trough to daytime peak serves requests "
          "between idle gaps; busy/idle alternation is request arrival, never an input stall or an idle GPU.")
def serving_diurnal(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Production LLM inference load follows the day (Azure LLM inference traces in Splitwise,
    ISCA'24; DistServe; BurstGPT): a trough at night a few times lower than the peak. At low
    load the replica is over-provisioned (an autoscaling finding), not stalled."""
    d = 8 * 3600
    t = np.arange(d)
    peak = float(rng.uniform(2.0, 4.0))
    rate = peak * (0.12 + 0.88 * (0.5 - 0.5 * np.cos(np.pi * t / d)))  # trough -> peak
    sl, tr, jid, meta = _replica(rng, seed, "vllm-diurnal", H100, d, rate, float(rng.uniform(0.15, 0.25)),
                                 "Deployment", "vllm-llama3-8b")
    return [job(jid, meta, d, sl, tr, expect(allowed=SERVING_OK), "diurnal serving", field_set="dcgm_no_ib")]


@scenario("serving_bursty", allows=sorted(SERVING_OK),
          why="A TGI replica whose traffic arrives in bursts (seconds of saturation, then quiet) alternates busy and "
          "idle every few seconds: the request pattern of serving, for which DataLoader advice is wrong.")
def serving_bursty(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """BurstGPT (2024) characterises LLM serving arrivals as bursty (Gamma-distributed
    inter-arrival times, far from Poisson); a Markov-modulated on/off source reproduces it."""
    d = 3 * 3600
    on = np.zeros(d, bool)
    t = 0
    state = False
    while t < d:
        ln = int(rng.exponential(6.0 if state else 10.0)) + 1
        on[t:t + ln] = state
        t += ln
        state = not state
    rate = np.where(on, float(rng.uniform(8, 14)), 0.05)
    sl, tr, jid, meta = _replica(rng, seed, "tgi-bursty", L40S, d, rate, float(rng.uniform(0.08, 0.12)),
                                 "Deployment", "tgi-mistral-7b")
    return [job(jid, meta, d, sl, tr, expect(allowed=SERVING_OK), "bursty serving", field_set="dcgm_no_ib")]


@scenario("serving_overprovisioned", requires=["low_sm_activity"], allows=sorted(REPLICA_KINDS | {"idle_gpu"}),
          why="A replica that gets a request every ~20 s for 3 h is busy ~2% of the time: an over-provisioned replica "
          "(scale down), which must be reported as waste, never as an input stall.")
def serving_overprovisioned(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Static replica counts sized for peak leave replicas nearly idle off-peak (Alibaba's
    serving studies report low average GPU use of inference services)."""
    d = 3 * 3600
    rate = np.full(d, float(rng.uniform(0.03, 0.06)))
    sl, tr, jid, meta = _replica(rng, seed, "vllm-idle", H100, d, rate, 0.4, "Deployment", "vllm-qwen-7b")
    labels = expect(any_of=[["low_sm_activity", *sorted(REPLICA_KINDS), "idle_gpu"]])
    return [job(jid, meta, d, sl, tr, labels, "over-provisioned replica", field_set="dcgm_no_ib")]


@scenario("batch_inference_job", why="An offline embedding job (Kubernetes Job) streams a dataset through a model at "
          "SM 0.65-0.8 and tensor ~0.35 for 2 h: steady, efficient batch inference.")
def batch_inference_job(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Offline batch inference is throughput-oriented with large batches (e.g. vLLM offline or
    HF pipelines); it looks like steady training without gradient traffic."""
    d = 7200
    sl = slots(f"batchinf-{seed}", H100, 2)
    tr = truths(rng, sl, d)
    sm = float(rng.uniform(0.65, 0.8))
    for g in tr:
        g.fill(0, 150, {"duty": 0.4, "sm": 0.15, "pcie_rx": 10e9})
        g.fill(150, d, {"duty": 0.99, "sm": sm, "occ": 0.35, "tensor": 0.35, "dram": 0.45, "pcie_rx": 1.5e9,
                        "pcie_tx": 0.8e9})
        g.memory(0, d, float(rng.uniform(0.4, 0.7)) * g.device.memory_total_bytes)
    jid, meta = k8s(f"embed-corpus-{seed}-m4x8d", namespace="search", owner_kind="Job",
                    owner_name=f"embed-corpus-{seed}", app="embedder")
    return [job(jid, meta, d, sl, tr, expect(), "batch inference", field_set="dcgm_no_ib")]


@scenario("serving_bursty_plain_labels", allows=sorted(SERVING_OK),
          why="The bursty serving replica again, but attributed the way today's agent attributes pods (labels pod and "
          "container only, no owner kind): the request pattern alone must keep it from being an input stall.")
def serving_bursty_plain_labels(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """agent/attribution/kubernetes.py names a pod "namespace/pod" with labels {pod, container}
    from the kubelet PodResources API, which carries no ownerReferences; issue 13 asks for the
    class "else inferred from the pattern (steady vs request-driven)". Arrivals as in
    serving_bursty (BurstGPT's bursty, Gamma-like inter-arrival times)."""
    d = 3 * 3600
    on = np.zeros(d, bool)
    t = 0
    state = False
    while t < d:
        ln = int(rng.exponential(6.0 if state else 10.0)) + 1
        on[t:t + ln] = state
        t += ln
        state = not state
    rate = np.where(on, float(rng.uniform(8, 14)), 0.05)
    sl, tr, jid, meta = _replica(rng, seed, "tgi-plain", L40S, d, rate, float(rng.uniform(0.08, 0.12)),
                                 "Deployment", "tgi-mistral-7b")
    meta["labels"] = {"pod": meta["labels"]["pod"], "container": meta["labels"]["container"]}
    return [job(jid, meta, d, sl, tr, expect(allowed=SERVING_OK), "bursty serving, agent's labels",
                field_set="dcgm_no_ib")]

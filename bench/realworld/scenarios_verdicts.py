"""Held-out patterns of issue 36: node-level InfiniBand counters beside a neighbour's training,
one GPU of eight idle through the whole job, and crash loops (memory back to zero, back-off,
a few minutes of work, again for hours)."""

from __future__ import annotations

import numpy as np

from .builders import LLM_STEP, job, k8s, slots, slurm, stable_id, training_memory, truths
from .hardware import GIB, H100
from .model import JobSpec, expect, scenario
from .scenarios_training import USERS

SERVING_OK = ["low_sm_activity", "idle_replica", "over_provisioned_replica", "overprovisioned_replica",
              "serving_overprovisioned"]


@scenario("serving_beside_ib_training", allows=SERVING_OK,
          why="A 4-GPU vLLM replica shares an 8-GPU node with 4 ranks of a 2-node training job whose all-reduce "
          "keeps the node's HCAs at 85-95% of NDR; without HCA-GPU affinity every GPU reports the node's IB total, "
          "which is not the replica's traffic: no comm_bound for it.")
def serving_beside_ib_training(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """The agent's InfiniBand sampler gives each GPU the bytes of the HCAs affine to it and, when
    no PCIe-switch or NUMA affinity holds for every GPU, the node's total (gpufleet/catalog.toml:
    "per node when topology is unknown"; NCCL's IB transport carries only inter-node traffic,
    NCCL environment docs, NCCL_IB_HCA). Kubernetes packs pods of different owners on one node
    (device plugin, nvidia.com/gpu requests), so a one-node replica sees the training job's
    traffic. vLLM decode keeps SM at 0.4-0.55 between request bursts (vLLM docs, performance)."""
    d = 7200
    node = f"ibshare-{seed}-n00"
    out = []
    sl = slots(f"ibshare-{seed}", H100, 12, node_names=[node, f"ibshare-{seed}-n01"], per_node=8, first_index=0)
    sl = sl[:4] + sl[8:12]  # ranks on GPUs 0-3 of this node and 0-3 of the other
    ib = float(rng.uniform(0.85, 0.95))
    tr = truths(rng, sl, d)
    for g in tr:
        g.fill(0, 240, {"duty": 0.3, "sm": 0.1})
        g.fill(240, d, {**LLM_STEP, "ib": ib})
        training_memory(g, (0.6, 0.8), rng)
    out.append(job(stable_id("ibshare-train", seed), slurm("llm-2node", user=str(rng.choice(USERS)), num_nodes=2,
                                                          ntasks=8), d, sl, tr, expect(), "IB neighbour: training"))
    sl = slots(f"ibshare-{seed}", H100, 4, node_names=[node], first_index=4)
    tr = truths(rng, sl, d)
    sm = float(rng.uniform(0.40, 0.55))
    for g in tr:
        g.fill(0, d, {"duty": 0.97, "sm": sm, "occ": 0.2, "tensor": sm * 0.4, "dram": 0.45, "nvlink": 0.05,
                      "ib": ib, "pcie_rx": 0.2e9})
        g.memory(0, d, 0.9 * g.device.memory_total_bytes, wobble_bytes=0.1 * GIB)
    jid, meta = k8s(f"vllm-chat-{seed}-7f9c-x2", namespace="serving", owner_kind="ReplicaSet",
                    owner_name=f"vllm-chat-{seed}-7f9c", app="vllm")
    out.append(job(jid, meta, d, sl, tr, expect(allowed=SERVING_OK), "IB neighbour: serving replica"))
    return out


@scenario("one_gpu_idle_of_eight", requires=["idle_gpu"],
          why="An 8-GPU job launched with torchrun --nproc_per_node=7 trains on 7 GPUs; the 8th holds only a CUDA "
          "context at SM 0 for the whole 3 h run: one idle GPU with its own waste, below oversized_allocation's "
          "quarter of the GPUs.")
def one_gpu_idle_of_eight(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Job Defense Shield's "GPUs allocated but unused" rule is per GPU (jobstats reports each
    GPU's utilisation, a 0% GPU in a multi-GPU job is an alert); a CUDA context (~0.5 GiB) is
    opened on every visible device by libraries that touch them all (PyTorch docs, CUDA
    semantics: CUDA_VISIBLE_DEVICES), while one fewer rank than GPUs computes."""
    d = 10800
    sl = slots(f"idle1of8-{seed}", H100, 8)
    tr = truths(rng, sl, d)
    idle = int(rng.integers(0, 8))
    for i, g in enumerate(tr):
        if i == idle:
            g.memory(0, d, 0.52 * GIB)
            continue
        g.fill(0, 300, {"duty": 0.3, "sm": 0.1})
        g.fill(300, d, LLM_STEP)
        training_memory(g, (0.6, 0.8), rng)
    meta = slurm("train-7ranks", user=str(rng.choice(USERS)), ntasks=7)
    return [job(stable_id("idle1of8", seed), meta, d, sl, tr, expect(["idle_gpu"]), "one GPU of eight idle")]


@scenario("crash_loop_backoff", requires=["crash_loop"], allows=["idle_gpu", "low_sm_activity"],
          why="A training pod that dies a few minutes after each start (an OOM at the first eval, a bad shard) "
          "restarts for hours: back-off at 0 with its memory released, start-up, 3-9 min of work, memory back to "
          "0, again: a crash loop, not a serving replica and not healthy.")
def crash_loop_backoff(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Kubernetes restarts a failing container with an exponential back-off (10 s doubling,
    capped at 5 min: CrashLoopBackOff, Kubernetes docs "Pod Lifecycle", container restarts);
    the pod keeps its GPUs throughout. A dead process releases its GPU memory (CUDA frees
    a context's allocations when the process exits). Labels as today's agent sends them (pod,
    container; no owner kind), so nothing but the pattern says what the job is."""
    n = int(rng.choice([1, 2, 4]))
    d = int(rng.uniform(3, 4) * 3600)
    sl = slots(f"crash-{seed}", H100, n)
    tr = truths(rng, sl, d)
    t, k = 0.0, 0
    spans: list[tuple[float, float]] = []
    while t < d:
        backoff = min(300.0, 10.0 * 2**k) * float(rng.uniform(0.9, 1.1))
        start = t + backoff
        up = float(rng.uniform(180, 540))
        spans.append((start, min(d, start + 60 + up)))
        t = start + 60 + up
        k += 1
    mem = float(rng.uniform(0.5, 0.8))
    for g in tr:
        for a, b in spans:
            g.fill(a, min(b, a + 60), {"duty": 0.4, "sm": 0.1, "pcie_rx": 2e9})
            g.fill(min(b, a + 60), b, LLM_STEP)
            g.memory(a, min(b, a + 30), 2.0 * GIB)
            g.memory(min(b, a + 30), b, mem * g.device.memory_total_bytes, wobble_bytes=0.3 * GIB)
    jid, meta = k8s(f"train-{seed}-crash-5d8", namespace="research", owner_kind="Job", owner_name="x", app="trainer")
    meta["labels"] = {"pod": meta["labels"]["pod"], "container": meta["labels"]["container"]}
    return [job(jid, meta, d, sl, tr, expect(["crash_loop"], ["idle_gpu", "low_sm_activity"]), "crash loop")]

"""True positives for the efficiency kinds: idle allocations, notebooks left open, one GPU of
eight used, launch-bound small batches, bursty low duty, FP32 without tensor cores, input
stalls, communication-bound training, tiny workloads on big GPUs."""

from __future__ import annotations

import numpy as np

from .builders import LLM_STEP, VISION_STEP, job, k8s, slots, slurm, stable_id, training_memory, truths
from .hardware import A100, GIB, H100
from .model import JobSpec, expect, scenario
from .scenarios_training import USERS


@scenario("idle_allocation", requires=["idle_gpu"], why="A batch job stuck in CPU preprocessing holds 4 GPUs at 0% "
          "for 2.5 h with only a CUDA context: the canonical idle allocation (Job Defense Shield cancels these).")
def idle_allocation(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Princeton's Job Defense Shield warns at 60 min and cancels at 120 min of zero GPU
    utilisation; Alibaba PAI 2020 found 34.5% of instances at 0 utilisation (Weng et al., NSDI'22)."""
    d = 9000
    sl = slots(f"idle-{seed}", A100, 4)
    tr = truths(rng, sl, d)
    for g in tr:
        g.memory(0, d, float(rng.uniform(0.4, 0.6)) * GIB)
    meta = slurm("preprocess_and_train", user=str(rng.choice(USERS)), ntasks=4)
    return [job(stable_id("idle", seed), meta, d, sl, tr, expect(["idle_gpu"]), "idle allocation")]


@scenario("notebook_left_open", requires=["idle_gpu"], allows=["low_sm_activity"],
          why="A Jupyter session on the interactive partition works for 15-30 min, then sits idle for 2-3 h holding "
          "20-40 GB: idle GPU time to reclaim, whatever the memory held.")
def notebook_left_open(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Interactive sessions are a large share of idle GPU time in university clusters
    (Princeton jobstats notes; JDS rules exempt nothing for memory held); the model stays in
    memory, so fb_used is high while nothing runs."""
    busy = float(rng.uniform(900, 1800))
    d = int(busy + rng.uniform(7200, 10800))
    sl = slots(f"nb-{seed}", H100, 1)
    tr = truths(rng, sl, d)
    g = tr[0]
    g.alternate(60, busy, {"duty": 0.9, "sm": 0.5, "tensor": 0.2, "dram": 0.3}, {}, period_s=90, busy_share=0.3)
    g.memory(0, 60, 0.0)
    g.memory(60, d, float(rng.uniform(20, 40)) * GIB, wobble_bytes=0.3 * GIB)
    meta = slurm("jupyter", user=str(rng.choice(USERS)), partition="interactive", qos="interactive", ntasks=1,
                 extra={"interactive": "true"})
    return [job(stable_id("nb", seed), meta, d, sl, tr, expect(["idle_gpu"], ["low_sm_activity"]), "notebook")]


@scenario("one_of_eight_used", requires=["oversized_allocation"],
          why="A script without DDP asks for 8 GPUs and trains on GPU 0 only; the other 7 hold a CUDA context at 0%: "
          "an oversized allocation (JDS: multi-GPU job using one GPU).")
def one_of_eight_used(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Job Defense Shield's "multi-GPU job uses only one GPU" rule targets exactly this: a
    single-process script started with --gres=gpu:8 opens a CUDA context on every visible GPU
    (~0.5 GiB each) and computes on cuda:0 only."""
    d = 7200
    sl = slots(f"oneof8-{seed}", H100, 8)
    tr = truths(rng, sl, d)
    for i, g in enumerate(tr):
        if i == 0:
            g.fill(0, 300, {"duty": 0.3, "sm": 0.1})
            g.fill(300, d, {**LLM_STEP, "nvlink": 0.0})
            training_memory(g, (0.5, 0.8), rng)
        else:
            g.memory(0, d, 0.52 * GIB)
    meta = slurm("train.py", user=str(rng.choice(USERS)), ntasks=1)
    return [job(stable_id("oneof8", seed), meta, d, sl, tr, expect(["oversized_allocation"]), "one of eight")]


@scenario("launch_bound_small_batch", requires=["low_sm_activity"],
          why="A small model with batch size 8 keeps the duty cycle near 100% but SM activity at 0.2-0.38 "
              "(kernel launch "
          "bound): the GPU is mostly empty, the DCGM guide's < 0.5 'likely ineffective' case.")
def launch_bound_small_batch(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """DCGM user guide: SM activity < 0.5 likely indicates ineffective use, 0.8 is needed;
    Acme (NSDI'24) found SM activity medians of 34-50% while GPU_UTIL read ~99%."""
    d = 7200
    sm = float(rng.uniform(0.2, 0.38))
    sl = slots(f"lowsm-{seed}", A100, 4)
    tr = truths(rng, sl, d)
    for g in tr:
        g.fill(0, 240, {"duty": 0.4, "sm": 0.1})
        g.fill(240, d, {"duty": 0.97, "sm": sm, "occ": 0.12, "tensor": sm * 0.35, "dram": sm * 0.5, "fp32": 0.05,
                        "nvlink": 0.04, "pcie_rx": 0.5e9})
        g.memory(0, d, float(rng.uniform(18, 30)) * GIB, wobble_bytes=GIB)
    meta = slurm("small-bs", user=str(rng.choice(USERS)), ntasks=4)
    return [job(stable_id("lowsm", seed), meta, d, sl, tr, expect(["low_sm_activity"]), "launch bound")]


@scenario("bursty_low_duty", requires=["low_sm_activity"], intervals=(1, 10, 15, 30, 60),
          why="A job that bursts for 2-6 s every 30-60 s and averages ~10% SM wastes 90% of its GPUs at every sampling "
          "interval, including the 15 s that let it escape every rule before.")
def bursty_low_duty(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Issue 13: '~10% SM with bursty load sampled every 15 s gets no flag at all'. Such jobs
    are e.g. RL actors or simulation-driven training where the GPU waits on CPU environments."""
    d = 7200
    sl = slots(f"bursty-{seed}", A100, 2)
    tr = truths(rng, sl, d)
    period = float(rng.uniform(30, 60))
    share = float(rng.uniform(4, 6)) / period
    for g in tr:
        g.alternate(0, d, {"duty": 1.0, "sm": 0.75, "tensor": 0.3, "dram": 0.3, "occ": 0.3},
                    {"duty": 0.0}, period_s=period, busy_share=share)
        g.memory(0, d, float(rng.uniform(12, 24)) * GIB)
    meta = slurm("rl-actor-learner", user=str(rng.choice(USERS)), ntasks=2)
    # Kinds are explanations (docs/goodput.md): an input stall that explains the low activity
    # is as good a diagnosis as low_sm_activity; what may not happen is no flag at all.
    labels = expect(any_of=[["low_sm_activity", "input_stall"]])
    return [job(stable_id("bursty", seed), meta, d, sl, tr, labels, "bursty")]


@scenario("fp32_no_tensor_cores", requires=["no_tensor_cores"],
          why="Transformer training in plain FP32 (TF32 off, PyTorch's matmul default since 1.12) keeps SM at 0.5-0.77 "
          "with tensor pipes at 0.5-1.5%: bf16 autocast would run it at least twice as fast.")
def fp32_no_tensor_cores(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Field example behind the rule (shared/research): 1-1.5% tensor at 49-77% SM; PyTorch
    sets torch.backends.cuda.matmul.allow_tf32 = False by default since 1.12."""
    d = 7200
    sl = slots(f"fp32-{seed}", A100, 4)
    tr = truths(rng, sl, d)
    sm = float(rng.uniform(0.55, 0.77))
    for g in tr:
        g.fill(0, 200, {"duty": 0.4, "sm": 0.15})
        g.fill(200, d, {"duty": 0.99, "sm": sm, "occ": 0.35, "tensor": float(rng.uniform(0.005, 0.015)),
                        "fp32": 0.5, "dram": 0.35, "nvlink": 0.08, "pcie_rx": 0.6e9})
        g.memory(0, d, float(rng.uniform(40, 70)) * GIB, wobble_bytes=GIB)
    meta = slurm("bert-fp32", user=str(rng.choice(USERS)), ntasks=4)
    return [job(stable_id("fp32", seed), meta, d, sl, tr, expect(["no_tensor_cores"]), "fp32")]


@scenario("dataloader_input_stall", requires=["input_stall"], allows=["low_sm_activity"],
          why="Too few DataLoader workers make the GPU alternate: 3-20 s cycles, 40-65% busy at SM ~0.85, idle "
              "while the "
          "host decodes the next batch; at 1 s the alternation is visible, at coarser intervals the waste still is.")
def dataloader_input_stall(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """The input-bound pattern DALI and FFCV were built for; the idle phases show the batch
    arriving over PCIe (host-to-device bursts) and no compute."""
    d = 7200
    sl = slots(f"stall-{seed}", A100, 4)
    tr = truths(rng, sl, d)
    period = float(rng.uniform(3, 20))
    share = float(rng.uniform(0.4, 0.65))
    for g in tr:
        g.fill(0, 180, {"duty": 0.3, "sm": 0.1})
        g.alternate(180, d, {**VISION_STEP, "sm": 0.86, "pcie_rx": 1e9}, {"duty": 0.03, "pcie_rx": 4e9},
                    period_s=period, busy_share=share)
        g.memory(0, d, float(rng.uniform(30, 60)) * GIB, wobble_bytes=GIB)

    def labels(iv: int):
        if iv <= 1:
            return expect(["input_stall"], ["low_sm_activity"])
        return expect(any_of=[["input_stall", "low_sm_activity"]])
    meta = slurm("resnet-imagenet", user=str(rng.choice(USERS)), ntasks=4)
    return [job(stable_id("stall", seed), meta, d, sl, tr, labels, "input stall")]


@scenario("comm_bound_multinode", requires=["comm_bound"], allows=["low_sm_activity"],
          why="Data-parallel training over 2 nodes whose IB runs at 85-95% of NDR while SM sits at 0.3-0.45 waits on "
          "gradient exchange: communication-bound (fix: bigger buckets, overlap, compression or fewer nodes).")
def comm_bound_multinode(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Multi-node jobs on a shared fabric (or with small per-GPU batches) spend most of each
    step in all-reduce; the link saturates while compute waits."""
    d = 7200
    sl = slots(f"comm-{seed}", H100, 16)
    tr = truths(rng, sl, d)
    sm = float(rng.uniform(0.3, 0.45))
    ib = float(rng.uniform(0.85, 0.95))
    for g in tr:
        g.fill(0, 240, {"duty": 0.3, "sm": 0.1})
        g.fill(240, d, {"duty": 0.99, "sm": sm, "occ": 0.2, "tensor": sm * 0.45, "dram": 0.3, "nvlink": 0.3,
                        "ib": ib, "pcie_rx": 1e9})
        training_memory(g, (0.6, 0.8), rng)
    meta = slurm("ddp-2node", user=str(rng.choice(USERS)), num_nodes=2, ntasks=16)
    return [job(stable_id("comm", seed), meta, d, sl, tr, expect(["comm_bound"], ["low_sm_activity"]), "comm bound")]


@scenario("tiny_model_big_gpu", requires=["memory_underuse"], allows=["low_sm_activity"],
          why="A BERT-base inference batch job on a full 80 GB H100 uses 3-6 GB and SM 0.06-0.15: it would fit a MIG "
          "1g.10gb slice (JDS: util < 20% and <= 10 GB -> MIG or smaller GPU).")
def tiny_model_big_gpu(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Job Defense Shield's 'too much GPU' rule (utilisation < 20% and <= 10 GB of GPU memory,
    suggest MIG or a smaller GPU); memory judged against the device's 80 GB, unlike the MIG
    scenario where 8 GiB is nearly all of the device."""
    d = 7200
    sl = slots(f"tiny-{seed}", H100, 1)
    tr = truths(rng, sl, d)
    sm = float(rng.uniform(0.06, 0.15))
    g = tr[0]
    g.fill(0, d, {"duty": 0.9, "sm": sm, "occ": 0.05, "tensor": sm * 0.4, "dram": sm * 0.6, "pcie_rx": 0.2e9})
    g.memory(0, d, float(rng.uniform(3, 6)) * GIB)
    jid, meta = k8s(f"bert-embed-{seed}-x7k2p", namespace="search", owner_kind="Job", owner_name=f"bert-embed-{seed}",
                    app="bert-embed")
    return [job(jid, meta, d, sl, tr, expect(["memory_underuse"], ["low_sm_activity"]), "tiny model")]

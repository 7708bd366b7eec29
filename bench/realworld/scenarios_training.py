"""Healthy training jobs and the ordinary events of their lives: warm-up and compilation,
checkpoints, evaluation passes, late starts, agent restarts, power capping, heavy but
overlapped communication, memory-bound work. None of these may be flagged."""

from __future__ import annotations

import numpy as np

from .builders import (
    CKPT,
    EVAL,
    LLM_STEP,
    VISION_STEP,
    Painter,
    job,
    paint,
    slots,
    slurm,
    stable_id,
    training_memory,
    training_schedule,
    truths,
    warmup_painter,
)
from .hardware import A100, GIB, H100
from .model import JobSpec, expect, scenario
from .signals import GpuTruth, Level

USERS = ("alice", "bob", "chen", "dana", "eve", "farid", "grace", "hiro")


def _rank_scales(rng: np.random.Generator, n: int, sd: float = 0.015) -> np.ndarray:
    return 1.0 + rng.normal(0.0, sd, n)


def _train(rng: np.random.Generator, name: str, seed: int, *, device=H100, n_gpus: int = 8, duration_s: int = 9000,
           step=LLM_STEP, schedule_kw: dict | None = None, meta_kw: dict | None = None, mem=(0.72, 0.9)
           ) -> tuple[list, list[GpuTruth], list, dict]:
    sl = slots(f"{name}-{seed}", device, n_gpus)
    tr = truths(rng, sl, duration_s)
    ph = training_schedule(rng, duration_s, **(schedule_kw or {}))
    painters: dict[str, Level | Painter] = {"warmup": warmup_painter(step), "train": step, "ckpt": CKPT,
                                            "eval": EVAL}
    for g, r in zip(tr, _rank_scales(rng, n_gpus), strict=True):
        paint(g, ph, painters, rank_scale=float(r))
        training_memory(g, mem, rng)
    nodes = len({s.node for s in sl})
    meta = slurm(name, user=str(rng.choice(USERS)), num_nodes=nodes, ntasks=n_gpus, **(meta_kw or {}))
    return sl, tr, ph, meta


@scenario("llm_pretrain_multinode", why="bf16 LLM pre-training over 2 nodes with checkpoints and evaluation passes is "
          "the fleet's reference healthy job: SM ~0.88, tensor ~0.5, nothing to fix.")
def llm_pretrain_multinode(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Megatron/FSDP-style pre-training on 16 H100s: step activity from MegaScale (NSDI'24,
    55% MFU at scale) and the Acme trace (NSDI'24: healthy pre-training SM activity 0.8-0.9);
    gradient all-reduce over NVLink inside a node and IB between nodes (~20-30% of NDR);
    checkpoints every 20-40 min and evaluation every ~1 h (Meta RSC reliability study,
    arXiv 2410.21680: checkpoint cadence set against failures every few hours at scale)."""
    sl, tr, ph, meta = _train(rng, "llm-pretrain", seed, n_gpus=16, duration_s=8400)
    ib = float(rng.uniform(0.2, 0.3))
    for g in tr:
        for t0, t1, n in ph:
            if n == "train":
                g.act["ib"][int(t0):int(t1)] = ib * (1 + 0.05 * rng.standard_normal(int(t1) - int(t0)))
    return [job(stable_id("llm", seed), meta, 8400, sl, tr, expect(), "healthy pre-training")]


@scenario("compile_warmup_long", why="A 10-20 minute torch.compile/autotune and dataset-index warm-up at low, bursty "
          "activity is start-up cost, not waste to flag; the job then trains well.")
def compile_warmup_long(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """torch.compile with mode="max-autotune" benchmarks kernels for minutes on large models,
    and the first epoch builds dataset indices on the CPU; during this the GPU runs short
    bursts (PyTorch 2 compiler docs; typical reports of 5-20 min compile for LLMs)."""
    sl, tr, _ph, meta = _train(rng, "compile-warmup", seed, n_gpus=8, duration_s=7800,
                              schedule_kw={"warmup_s": (600, 1200)})
    return [job(stable_id("compile", seed), meta, 7800, sl, tr, expect(), "long warm-up then healthy")]


@scenario("eval_heavy_finetune", why="Fine-tuning that evaluates every ~20 min for 6-10 min at SM ~0.55 spends a "
          "quarter of its time in eval by design; the evaluation phases are work, not waste.")
def eval_heavy_finetune(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Supervised fine-tuning with frequent generation-based evaluation (common in instruction
    tuning recipes): eval is forward-only, lower tensor use and no gradient traffic."""
    sl, tr, _ph, meta = _train(rng, "sft-eval", seed, device=A100, n_gpus=4, duration_s=7200,
                              schedule_kw={"eval_every_s": (1100, 1400), "eval_len_s": (360, 600)})
    return [job(stable_id("sft", seed), meta, 7200, sl, tr, expect(), "eval-heavy fine-tune")]


@scenario("late_start_staging", why="A job whose first 4-9 minutes are image pull and data staging with idle GPUs, "
          "then two hours of training, is healthy: the idle start is far below any idle-GPU minimum.")
def late_start_staging(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Container image pulls and dataset staging to local NVMe before the first step are
    routine on Kubernetes and Slurm (Alibaba PAI trace: long job start-up times); GPUs are
    allocated (the prolog mapping shows them) with no context yet."""
    d = 7800
    start = float(rng.uniform(240, 540))
    sl = slots(f"late-{seed}", H100, 8)
    tr = truths(rng, sl, d)
    ph = [(0.0, start, "idle"), *training_schedule(rng, d, start_s=start)]
    painters: dict[str, Level | Painter] = {"idle": {}, "warmup": warmup_painter(LLM_STEP), "train": LLM_STEP,
                                            "ckpt": CKPT, "eval": EVAL}
    for g, r in zip(tr, _rank_scales(rng, 8), strict=True):
        paint(g, ph, painters, rank_scale=float(r))
        training_memory(g, (0.7, 0.85), rng, t0=start)
        g.memory(0, start, 0.0)
    meta = slurm("late-start", user=str(rng.choice(USERS)))
    return [job(stable_id("late", seed), meta, d, sl, tr, expect(), "late start")]


@scenario("agent_restart_gaps", why="Healthy training whose node agent restarts 2-4 times (gaps of 1-10 min, one of "
          "up to 25 min) has unknown spans, not idle ones: no flag may come from missing data.")
def agent_restart_gaps(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Agents restart on upgrades, OOM kills and node-exporter-style crash loops; the samples
    of those minutes are simply absent. Unknown is not zero (issue 13)."""
    d = 9000
    sl, tr, _ph, meta = _train(rng, "gaps", seed, n_gpus=8, duration_s=d)
    gaps = []
    for _ in range(int(rng.integers(2, 5))):
        a = float(rng.uniform(900, d - 900))
        gaps.append((a, a + float(rng.uniform(60, 600))))
    a = float(rng.uniform(1800, d - 2400))
    gaps.append((a, a + float(rng.uniform(900, 1500))))
    return [job(stable_id("gaps", seed), meta, d, sl, tr, expect(), "agent gaps",
                gaps={sl[0].node: sorted(gaps)})]


@scenario("power_capped_llm", why="H100s run under an operator power limit of 480-520 W, so clocks sit at 88-95% of "
          "boost with the SW power cap reason set most of the time: normal operation, not throttling to fix.")
def power_capped_llm(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Power capping H100s below 700 W is common practice for facility power budgets (e.g.
    nvidia-smi -pl, Meta and others cap GPUs); the clock event reason 0x4 (SW power cap) is
    then set whenever the workload would draw more (DCGM/NVML clock event reasons)."""
    sl, tr, _ph, meta = _train(rng, "powercap", seed, n_gpus=8, duration_s=7200,
                              step={**LLM_STEP, "tensor": 0.6, "dram": 0.5})
    cap = float(rng.uniform(480, 520))  # ~85-93% of the ~560 W this step would draw
    for g in tr:
        g.power_limit_w = cap
    return [job(stable_id("pcap", seed), meta, 7200, sl, tr, expect(), "power capped")]


@scenario("vision_training_hiccups", why="Vision training on 4 A100s with brief 1-3 s input hiccups every "
                                         "30-120 s keeps "
          "SM ~0.8: a few percent lost to the input pipeline is ordinary, not an input stall to flag.")
def vision_training_hiccups(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """JPEG decoding and augmentation on the CPU occasionally lag the GPU (DALI/FFCV papers
    motivate themselves with this); short hiccups are normal at well-tuned num_workers."""
    d = 7200
    sl, tr, ph, meta = _train(rng, "vision", seed, device=A100, n_gpus=4, duration_s=d, step=VISION_STEP,
                              mem=(0.45, 0.7))
    for g in tr:
        t = float(rng.uniform(30, 120))
        while t < d:
            if all(not (a <= t < b) or n == "train" for a, b, n in ph):
                g.fill(t, t + float(rng.uniform(1, 3)), {"duty": 0.05, "pcie_rx": 3e9})
            t += float(rng.uniform(30, 120))
    return [job(stable_id("vision", seed), meta, d, sl, tr, expect(), "vision with hiccups")]


@scenario("memory_bound_etl", why="A RAPIDS cuDF join/groupby job keeps DRAM ~85% busy with SM ~0.7 and no matrix "
          "math: it is bandwidth-bound by nature, so tensor-core advice and a tensor waste charge would be wrong.")
def memory_bound_etl(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """GPU dataframe work (hash joins, sorts, group-bys) and embedding lookups are limited by
    memory bandwidth; DCGM's DRAM_ACTIVE near 0.8-0.9 with no tensor pipe use is the
    roofline's memory-bound side (DCGM user guide: DRAM_ACTIVE)."""
    d = 7200
    sl = slots(f"etl-{seed}", H100, 4)
    tr = truths(rng, sl, d)
    busy = {"duty": 0.99, "sm": float(rng.uniform(0.62, 0.75)), "occ": 0.55, "dram": float(rng.uniform(0.8, 0.9)),
            "fp32": 0.06, "tensor": float(rng.uniform(0.0, 0.008)), "pcie_rx": 6e9, "pcie_tx": 2e9, "nvlink": 0.05}
    for g in tr:
        g.fill(0, 180, {"duty": 0.3, "sm": 0.1, "dram": 0.2, "pcie_rx": 10e9})
        g.fill(180, d, busy)
        g.memory(0, d, float(rng.uniform(0.6, 0.85)) * g.device.memory_total_bytes, wobble_bytes=2 * GIB)
    meta = slurm("cudf-etl", user=str(rng.choice(USERS)), account="data-eng", partition="gpu", ntasks=4)
    return [job(stable_id("etl", seed), meta, d, sl, tr, expect(), "memory-bound ETL")]


@scenario("comm_heavy_fsdp", why="FSDP over 2 nodes moving 35-45% of NVLink and 40-50% of IB while SM stays ~0.75 "
          "overlaps communication with compute: heavy links on a busy GPU are healthy, not comm-bound.")
def comm_heavy_fsdp(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Fully sharded data parallel all-gathers parameters and reduce-scatters gradients every
    layer; with prefetch the traffic hides behind compute (PyTorch FSDP paper, VLDB'23)."""
    d = 7200
    step = {**LLM_STEP, "sm": 0.76, "tensor": 0.42, "nvlink": float(rng.uniform(0.35, 0.45)),
            "ib": float(rng.uniform(0.4, 0.5))}
    sl, tr, ph, meta = _train(rng, "fsdp", seed, n_gpus=16, duration_s=d, step=step)
    for g in tr:  # IB only moves during steps
        for t0, t1, n in ph:
            if n not in ("train",):
                g.act["ib"][int(t0):int(t1)] *= 0.05
    return [job(stable_id("fsdp", seed), meta, d, sl, tr, expect(), "comm-heavy healthy")]


@scenario("checkpoint_10min_barrier", why="Healthy training where rank 0 writes a 10-minute checkpoint to slow "
                                          "NFS while "
          "the other ranks spin in a barrier (util 100%, SM ~0.15, no traffic): a hang-like pause that must not "
          "be hung.")
def checkpoint_10min_barrier(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Unsharded torch.save on rank 0 followed by dist.barrier(): the waiting ranks run the
    NCCL barrier kernel, which keeps the duty cycle pinned with almost no SM or memory
    activity, exactly like a hang, for as long as the save takes (issue 13: hung must not fire
    on a 10-minute checkpoint)."""
    d = 7200
    sl, tr, _ph, meta = _train(rng, "ckpt-nfs", seed, n_gpus=8, duration_s=d,
                              schedule_kw={"ckpt_every_s": (5000, 6000), "eval_every_s": None})
    a = float(rng.uniform(2400, 3600))
    ln = float(rng.uniform(560, 620))
    spin = {"duty": 1.0, "sm": float(rng.uniform(0.12, 0.17)), "occ": 0.02}
    for i, g in enumerate(tr):
        if i == 0:
            g.fill(a, a + ln, {"duty": 0.08, "sm": 0.01, "pcie_tx": 4e9})
        else:
            g.fill(a, a + ln, spin, rel_noise=0.02)
    return [job(stable_id("ckptnfs", seed), meta, d, sl, tr, expect(), "10-min checkpoint barrier")]

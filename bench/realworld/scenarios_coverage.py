"""Fleets with fewer signals: GPUs that report only NVML (no DCGM profiling), imported history
with only gpu_util and memory, and profiling that goes blank while a user profiles with Nsight.
Unknown is not zero: a missing signal may never be read as an idle GPU."""

from __future__ import annotations

import numpy as np

from .builders import (
    CKPT,
    EVAL,
    LLM_STEP,
    job,
    k8s,
    paint,
    slots,
    slurm,
    stable_id,
    training_memory,
    training_schedule,
    truths,
    warmup_painter,
)
from .hardware import A10G, GIB, H100
from .model import REPLICA_KINDS, JobSpec, expect, scenario
from .scenarios_training import USERS


@scenario("nvml_only_busy", why="H100s on a cloud image without DCGM profiling report only NVML: utilisation ~100% and "
          "~550 W of 700 W are a busy training job, and the missing SM/tensor fields are unknown, not zero.")
def nvml_only_busy(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """DCGM profiling needs datacenter GPUs, a recent driver and no concurrent Nsight/CUPTI
    (DCGM docs: PROFILING_NOT_SUPPORTED -36, conflicts -37); many cloud images and exported
    histories carry only NVML fields. Issue 13: such GPUs at 100%/550 W were called idle."""
    d = 7200
    sl = slots(f"nvml-busy-{seed}", H100, 8)
    tr = truths(rng, sl, d)
    ph = training_schedule(rng, d)
    step = {**LLM_STEP, "tensor": 0.58, "dram": 0.5}
    for g in tr:
        paint(g, ph, {"warmup": warmup_painter(step), "train": step, "ckpt": CKPT, "eval": EVAL})
        training_memory(g, (0.75, 0.9), rng)
    meta = slurm("llm-cloud", user=str(rng.choice(USERS)), ntasks=8)
    return [job(stable_id("nvmlb", seed), meta, d, sl, tr, expect(), "nvml-only busy", field_set="nvml")]


@scenario("nvml_only_idle", requires=["idle_gpu"],
          why="The same NVML-only fleet with a job whose 4 GPUs read 0% utilisation at idle power (~70 W) for "
              "2.5 h: idle, "
          "judged from gpu_util and power, so the flag's confidence must be below high.")
def nvml_only_idle(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Job Defense Shield judges idleness from the utilisation duty cycle alone; with NVML
    fields only, the engine can do the same but must say what it judged from (issue 13)."""
    d = 9000
    sl = slots(f"nvml-idle-{seed}", H100, 4)
    tr = truths(rng, sl, d)
    for g in tr:
        g.memory(0, d, 0.52 * GIB)
    meta = slurm("llm-cloud", user=str(rng.choice(USERS)), ntasks=4)
    return [job(stable_id("nvmli", seed), meta, d, sl, tr, expect(["idle_gpu"], low_confidence=True),
                "nvml-only idle", field_set="nvml")]


@scenario("imported_inference_pods", requires=["idle_gpu"], intervals=(60,), seeds=(1, 2),
          why="A family of inference pods exported as gpu_util + fb_used only at ~60 s point samples (busy pods at "
          "20-95% duty, a few pods idle for hours): busy pods are not flagged, idle pods are, with confidence "
          "below high.")
def imported_inference_pods(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Stands in for the public trace of 143 inference pods that issue 13 mentions and that is
    not in this workspace (shared/data holds only Alibaba PAI mini-batch times): per-pod duty
    cycles drawn wide, as in Alibaba's GPU traces (median utilisation low, many pods busy a few
    tens of percent), sampled the way such exports are (utilization.gpu read once a minute,
    whole percent), imported through gpufleet import (NDJSON)."""
    out = []
    n_pods = 12
    for k in range(n_pods):
        d = int(rng.uniform(1.5, 4.0) * 3600)
        sl = slots(f"pods-{seed}-{k}", A10G, 1)
        tr = truths(rng, sl, d)
        g = tr[0]
        idle = k < 2  # two idle pods per family, the rest serving
        if not idle:
            level = float(rng.uniform(0.2, 0.95))
            busy = np.clip(level + 0.15 * rng.standard_normal(d), 0, 1)
            g.mix(0, d, busy, {"duty": 1.0, "sm": 0.5, "tensor": 0.2, "dram": 0.5}, {})
        g.memory(0, d, float(rng.uniform(6, 20)) * GIB)
        jid, meta = k8s(f"infer-{seed}-{k:03d}-7fd9c", namespace="prod", owner_kind="Deployment",
                        owner_name=f"infer-{k % 4}", app="infer")
        labels = expect(["idle_gpu"], low_confidence=True) if idle else expect(allowed=REPLICA_KINDS)
        out.append(job(jid, meta, d, sl, tr, labels,
                       "imported pod", field_set="util_fb", path="ndjson", offset_s=float(k * 300)))
    return out


@scenario("profiling_paused_nsight", why="Healthy training during which a user runs Nsight Systems for 8-15 "
                                         "min, so DCGM "
          "profiling fields read blank (DCGM -37) while NVML still reports 100% and full power: no flag from the gap.")
def profiling_paused_nsight(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """DCGM pauses profiling metrics while CUPTI/Nsight holds the counters (dcgm-exporter
    issues #22, #148, #328 report blank profiling fields)."""
    d = 7200
    sl = slots(f"nsys-{seed}", H100, 4)
    tr = truths(rng, sl, d)
    ph = training_schedule(rng, d)
    for g in tr:
        paint(g, ph, {"warmup": warmup_painter(LLM_STEP), "train": LLM_STEP, "ckpt": CKPT, "eval": EVAL})
        training_memory(g, (0.7, 0.85), rng)
    a = float(rng.uniform(1800, 4800))
    meta = slurm("llm-profiled", user=str(rng.choice(USERS)), ntasks=4)
    return [job(stable_id("nsys", seed), meta, d, sl, tr, expect(), "profiling paused",
                profiling_paused=[(a, a + float(rng.uniform(480, 900)))])]

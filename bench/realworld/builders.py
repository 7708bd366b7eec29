"""Building blocks shared by the scenario modules: GPU slots on nodes, scheduler metadata
(Slurm partition/QoS/account, Kubernetes namespace/owner kind/labels), job-wide phase
schedules (so a checkpoint pauses every rank at once) and the activity levels of common
workloads.

Levels are per-second means of the engines while that phase runs. Sources for the numbers
are in each level's comment; per-GPU persistent offsets (a few percent) make ranks differ
the way real ranks do (data-dependent work, slightly different silicon)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .hardware import GIB, Device
from .model import Expect, JobSpec, Slot
from .signals import GpuTruth, Level

Phase = tuple[float, float, str]  # [t0, t1) seconds from the job start, phase name
Painter = Callable[[GpuTruth, float, float], None]

# LLM pre-training step on H100 with bf16 (Megatron/FSDP): SM ~0.85-0.92, tensor 0.45-0.6 (MFU
# 40-55%, MegaScale reports 55%), DRAM ~0.4, gradient all-reduce over NVLink overlapped.
LLM_STEP: Level = {"duty": 0.995, "sm": 0.88, "occ": 0.38, "tensor": 0.52, "dram": 0.42, "fp32": 0.07,
                   "fp16": 0.05, "nvlink": 0.16, "pcie_rx": 0.8e9, "pcie_tx": 0.2e9}
# Evaluation pass: forward only, smaller effective batch, little gradient traffic.
EVAL: Level = {"duty": 0.93, "sm": 0.56, "occ": 0.30, "tensor": 0.30, "dram": 0.33, "fp32": 0.05,
               "nvlink": 0.03, "pcie_rx": 0.6e9, "pcie_tx": 0.1e9}
# Sharded checkpoint save: device-to-host copies of the shards, a few small kernels.
CKPT: Level = {"duty": 0.10, "sm": 0.015, "occ": 0.01, "dram": 0.06, "pcie_tx": 9e9, "pcie_rx": 0.1e9}
# Vision training (ResNet/ViT, AMP): busy but lighter tensor use, heavier input pipeline.
VISION_STEP: Level = {"duty": 0.98, "sm": 0.80, "occ": 0.45, "tensor": 0.34, "dram": 0.50, "fp32": 0.12,
                      "fp16": 0.10, "nvlink": 0.06, "pcie_rx": 2.5e9, "pcie_tx": 0.1e9}
IDLE: Level = {}


def stable_id(*parts: object, digits: int = 7) -> str:
    h = hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()
    return str(10 ** (digits - 1) + int(h[:12], 16) % (9 * 10 ** (digits - 1)))


def uuid_for(*parts: object, prefix: str = "GPU") -> str:
    h = hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def slots(tag: str, device: Device, n_gpus: int, *, per_node: int = 8, first_index: int = 0,
          node_names: list[str] | None = None) -> list[Slot]:
    """``n_gpus`` GPUs packed ``per_node`` to a node (nodes named from ``tag``)."""
    out = []
    for i in range(n_gpus):
        k, idx = divmod(i, per_node)
        node = node_names[k] if node_names else f"{tag}-n{k:02d}"
        uuid = uuid_for(tag, node, idx + first_index, prefix="MIG" if device.mig_profile else "GPU")
        parent = uuid_for(tag, node, idx + first_index, "parent") if device.mig_profile else None
        out.append(Slot(node, idx + first_index, uuid, device, parent))
    return out


def truths(rng: np.random.Generator, sl: list[Slot], duration_s: int) -> list[GpuTruth]:
    return [GpuTruth(duration_s, s.device, np.random.default_rng(rng.integers(0, 2**63))) for s in sl]


def slurm(name: str, *, user: str, account: str = "research", partition: str = "gpu", qos: str = "normal",
          num_nodes: int = 1, ntasks: int = 8, extra: dict[str, str] | None = None) -> dict[str, Any]:
    return {"source": "slurm", "user": user, "name": name, "account": account, "partition": partition,
            "num_nodes": num_nodes, "ntasks": ntasks, "labels": {"qos": qos, **(extra or {})}}


def k8s(pod: str, *, namespace: str, owner_kind: str, owner_name: str, app: str,
        extra: dict[str, str] | None = None, user: str | None = None) -> tuple[str, dict[str, Any]]:
    """(job_id, meta) the way the agent names a pod ("namespace/pod") with the owner the pod's
    ownerReferences carry (Deployment pods are owned by a ReplicaSet named after it)."""
    labels = {"pod": pod, "container": app, "owner_kind": owner_kind, "owner_name": owner_name,
              "app.kubernetes.io/name": app, **(extra or {})}
    return f"{namespace}/{pod}", {"source": "kubernetes", "name": pod, "namespace": namespace, "user": user,
                                  "labels": labels}


def scaled(level: Level, f: float, keys: tuple[str, ...] = ("sm", "tensor", "dram", "occ", "fp32", "fp16", "fp64")
           ) -> Level:
    return {k: (min(1.0, v * f) if k in keys else v) for k, v in level.items()}


def paint(g: GpuTruth, phases: list[Phase], painters: dict[str, Level | Painter], *, rank_scale: float = 1.0,
          rel_noise: float = 0.04) -> None:
    """Apply a job-wide schedule to one GPU. A phase's painter is a Level (steady, scaled by the
    GPU's persistent ``rank_scale``) or a function painting [t0, t1) itself."""
    for t0, t1, name in phases:
        p = painters[name]
        if callable(p):
            p(g, t0, t1)
        else:
            g.fill(t0, t1, scaled(p, rank_scale), rel_noise=rel_noise)


Span = tuple[float, float]


def training_schedule(rng: np.random.Generator, duration_s: int, *, start_s: float = 0.0,
                      warmup_s: Span = (120, 420), ckpt_every_s: Span = (1200, 2400), ckpt_len_s: Span = (45, 150),
                      eval_every_s: Span | None = (2700, 4200), eval_len_s: Span = (120, 480)) -> list[Phase]:
    """Warm-up (compile, first data), then steps, interrupted by synchronous checkpoints and
    evaluation passes. Periods and lengths follow common practice: checkpoints every 20-40
    min taking 1-3 min for sharded saves (Meta's RSC study: checkpointing is the main
    protection against failures every few hours at scale); evaluation every ~1 h."""
    out: list[Phase] = []
    t = start_s
    w = float(rng.uniform(*warmup_s))
    out.append((t, t + w, "warmup"))
    t += w
    next_ck = t + rng.uniform(*ckpt_every_s)
    next_ev = t + rng.uniform(*eval_every_s) if eval_every_s else float("inf")
    while t < duration_s:
        nxt = min(next_ck, next_ev, duration_s)
        out.append((t, nxt, "train"))
        t = nxt
        if t >= duration_s:
            break
        if next_ck <= next_ev:
            ln = float(rng.uniform(*ckpt_len_s))
            out.append((t, min(duration_s, t + ln), "ckpt"))
            t += ln
            next_ck = t + rng.uniform(*ckpt_every_s)
        else:
            ln = float(rng.uniform(*eval_len_s))
            out.append((t, min(duration_s, t + ln), "eval"))
            t += ln
            next_ev = t + rng.uniform(*eval_every_s) if eval_every_s else float("inf")
    return out


def warmup_painter(level: Level) -> Painter:
    """torch.compile / CUDA graph capture / first batches: short kernels in bursts while the CPU
    compiles, memory ramping to its working set."""
    def p(g: GpuTruth, t0: float, t1: float) -> None:
        g.alternate(t0, t1, scaled(level, 0.6), {"duty": 0.02}, period_s=8.0, busy_share=0.35)
    return p


def training_memory(g: GpuTruth, share: tuple[float, float], rng: np.random.Generator, *, t0: float = 0.0,
                    ramp_s: float = 180.0) -> None:
    """Framebuffer: the CUDA context (~0.5 GiB) at once, the working set after the first steps."""
    total = g.device.memory_total_bytes
    used = float(rng.uniform(*share)) * total
    g.memory(0, t0 + ramp_s, 0.55 * GIB)
    g.memory(t0 + ramp_s, g.n, used, wobble_bytes=0.01 * total)


def job(job_id: str, meta: dict[str, Any], duration_s: int, sl: list[Slot], tr: list[GpuTruth],
        labels: Callable[[int], Expect] | Expect, why: str, **kw: Any) -> JobSpec:
    fn = labels if callable(labels) else (lambda _iv, e=labels: e)
    return JobSpec(job_id, meta, duration_s, sl, tr, fn, why, **kw)

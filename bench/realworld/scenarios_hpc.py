"""HPC codes, MIG slices and shared nodes: work that is right not to use tensor cores, devices
smaller than a full GPU, and nodes where several jobs live side by side."""

from __future__ import annotations

import numpy as np

from .builders import LLM_STEP, VISION_STEP, job, k8s, slots, slurm, stable_id, training_memory, truths
from .hardware import A100, GIB, H100, H100_MIG_1G10
from .model import JobSpec, expect, scenario
from .scenarios_training import USERS


def _hpc(rng: np.random.Generator, tag: str, seed: int, device, n: int, d: int, level: dict, mem: float,
         name: str, account: str) -> tuple[list, list, dict]:
    sl = slots(f"{tag}-{seed}", device, n)
    tr = truths(rng, sl, d)
    for g in tr:
        g.fill(0, 120, {"duty": 0.2, "sm": 0.05, "pcie_rx": 5e9})  # reading input decks / meshes
        # Solver iterations with periodic I/O (restart files) every 15-30 min.
        t = 120.0
        while t < d:
            ln = float(rng.uniform(900, 1800))
            g.fill(t, min(d, t + ln), level)
            t += ln
            g.fill(t, min(d, t + 40), {"duty": 0.05, "pcie_tx": 6e9})
            t += 40
        g.memory(0, d, mem * g.device.memory_total_bytes, wobble_bytes=0.5 * GIB)
    meta = slurm(name, user=str(rng.choice(USERS)), account=account, partition="hpc", qos="normal", ntasks=n)
    return sl, tr, meta


@scenario("fp64_dense_hpc", why="A dense FP64 electronic-structure code (VASP/CP2K class) keeps FP64 pipes 45-70% busy "
          "at SM ~0.85 on A100s: right not to use bf16 tensor cores; nothing to flag.")
def fp64_dense_hpc(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Scientific codes need double precision; DCGM's PIPE_FP64_ACTIVE shows it (DCGM user
    guide), and mixed-precision advice does not apply."""
    lvl = {"duty": 0.99, "sm": 0.86, "occ": 0.3, "fp64": float(rng.uniform(0.45, 0.7)), "dram": 0.45,
           "tensor": float(rng.uniform(0.0, 0.08)), "nvlink": 0.1, "fp32": 0.05}
    sl, tr, meta = _hpc(rng, "vasp", seed, A100, 4, 7200, lvl, 0.55, "vasp_std", "chemistry")
    return [job(stable_id("fp64d", seed), meta, 7200, sl, tr, expect(), "dense fp64")]


@scenario("fp64_sparse_hpc", why="A sparse FP64 solver (PETSc/AmgX conjugate gradient) uses FP64 pipes only 5-8% with "
          "DRAM ~0.75: bandwidth-bound double precision, which tensor-core advice would get wrong twice.")
def fp64_sparse_hpc(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Sparse matrix-vector products run at a fraction of FP64 peak, limited by memory
    bandwidth (HPCG reaches ~1-3% of peak FLOPs); issue 13 saw no_tensor_cores fire on this."""
    lvl = {"duty": 0.99, "sm": float(rng.uniform(0.55, 0.7)), "occ": 0.5, "fp64": float(rng.uniform(0.05, 0.08)),
           "dram": float(rng.uniform(0.7, 0.82)), "nvlink": 0.12, "fp32": 0.02}
    sl, tr, meta = _hpc(rng, "petsc", seed, A100, 4, 7200, lvl, 0.45, "openfoam_amgx", "cfd")
    return [job(stable_id("fp64s", seed), meta, 7200, sl, tr, expect(), "sparse fp64")]


@scenario("md_fp32_hpc", why="A molecular-dynamics run (GROMACS/LAMMPS class) on the hpc partition is FP32 with no "
          "tensor-core path for its kernels: SM ~0.7 is healthy and bf16 autocast advice does not apply.")
def md_fp32_hpc(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """GROMACS' non-bonded kernels use FP32 SIMD-style arithmetic (mixed precision in the
    FP32/FP64 sense), not matrix units; the workload class (partition hpc, account, job name)
    says it is not deep learning."""
    lvl = {"duty": 0.98, "sm": float(rng.uniform(0.62, 0.78)), "occ": 0.4, "fp32": 0.55, "dram": 0.3,
           "fp64": 0.01, "pcie_rx": 0.5e9, "pcie_tx": 0.5e9}
    sl, tr, meta = _hpc(rng, "gmx", seed, A100, 2, 7200, lvl, 0.08, "gmx_mdrun", "biophysics")
    return [job(stable_id("md", seed), meta, 7200, sl, tr, expect(), "md fp32")]


@scenario("mig_slice_inference", why="Two inference pods on MIG 1g.10gb slices of one H100, each using 8 of "
                                     "9.75 GiB at "
          "SM 0.5-0.7: right-sized already; telling them to move to a MIG slice would be absurd.")
def mig_slice_inference(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """MIG instances are GPUs of their own (uuid MIG-..., 1g.10gb = 1/7 SMs, 9.75 GiB); NVML
    reports no power, clocks, temperature or ECC on an instance handle; DCGM profiling works
    per instance (dcgm-exporter GPU_I_PROFILE labels). Memory must be judged against 9.75 GiB."""
    d = 7200
    out = []
    node = f"mig-{seed}-n00"
    for k in range(2):
        sl = slots(f"mig-{seed}", H100_MIG_1G10, 1, first_index=0, node_names=[node])
        sl[0].uuid = sl[0].uuid[:-1] + str(k)
        tr = truths(rng, sl, d)
        g = tr[0]
        sm = float(rng.uniform(0.5, 0.7))
        g.fill(0, 90, {"duty": 0.5, "sm": 0.2})
        g.fill(90, d, {"duty": 0.97, "sm": sm, "occ": 0.3, "tensor": 0.25, "dram": 0.45, "pcie_rx": 0.2e9})
        g.memory(0, d, float(rng.uniform(7.8, 8.3)) * GIB)
        jid, meta = k8s(f"triton-small-{seed}{k}-p2x9", namespace="inference", owner_kind="Deployment",
                        owner_name="triton-small", app="triton", extra={"nvidia.com/mig.config": "all-1g.10gb"})
        out.append(job(jid, meta, d, sl, tr, expect(), "mig slice", field_set="mig"))
    return out


@scenario("shared_node_neighbours", requires=["idle_gpu"],
          why="One 8-GPU node shared by three jobs: a 4-GPU fine-tune and a 2-GPU vision job (healthy, with mild "
          "noisy-neighbour hiccups) and a 2-GPU job idle for 2 h: only the idle job may be flagged.")
def shared_node_neighbours(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Slurm packs jobs onto shared nodes (gres/gpu per job); attribution must keep each job's
    GPUs apart, and contention on shared PCIe/CPU shows as brief hiccups in the neighbours."""
    d = 7800
    node = f"shared-{seed}-n00"
    out = []
    sl = slots(f"shared-{seed}", H100, 4, node_names=[node])
    tr = truths(rng, sl, d)
    for g in tr:
        g.fill(0, 300, {"duty": 0.3, "sm": 0.1})
        g.fill(300, d, LLM_STEP)
        training_memory(g, (0.6, 0.8), rng)
    out.append(job(stable_id("shared-a", seed), slurm("lora-ft", user="alice", ntasks=4), d, sl, tr, expect(),
                   "shared: fine-tune"))
    sl = slots(f"shared-{seed}", H100, 2, first_index=4, node_names=[node])
    tr = truths(rng, sl, d)
    for g in tr:
        g.fill(0, 200, {"duty": 0.3, "sm": 0.1})
        g.fill(200, d, VISION_STEP)
        t = 300.0
        while t < d:
            g.fill(t, t + float(rng.uniform(1, 4)), {"duty": 0.1, "sm": 0.02})
            t += float(rng.uniform(40, 160))
        training_memory(g, (0.4, 0.6), rng)
    out.append(job(stable_id("shared-b", seed), slurm("vit-train", user="bob", ntasks=2), d, sl, tr, expect(),
                   "shared: vision"))
    sl = slots(f"shared-{seed}", H100, 2, first_index=6, node_names=[node])
    tr = truths(rng, sl, d)
    for g in tr:
        g.memory(0, d, 0.5 * GIB)
    out.append(job(stable_id("shared-c", seed), slurm("wait-for-data", user="chen", ntasks=2), d, sl, tr,
                   expect(["idle_gpu"]), "shared: idle"))
    return out

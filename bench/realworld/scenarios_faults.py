"""Hardware and liveness: stragglers with a hardware signature, pipeline stages that are
uneven by design (not stragglers), throttling, XID faults, counters that climb, hangs."""

from __future__ import annotations

import numpy as np

from .builders import (
    CKPT,
    EVAL,
    LLM_STEP,
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
from .hardware import A100, H100
from .model import PIPELINE_KINDS, JobSpec, expect, scenario
from .scenarios_training import USERS
from .signals import HW_SLOWDOWN, POWER_BRAKE, Level

PAINTERS: dict[str, Level | Painter] = {"warmup": warmup_painter(LLM_STEP), "train": LLM_STEP, "ckpt": CKPT,
                                        "eval": EVAL}


def _healthy_run(rng: np.random.Generator, tag: str, n: int, d: int, device=H100, ib: float = 0.0):
    sl = slots(tag, device, n)
    tr = truths(rng, sl, d)
    ph = training_schedule(rng, d)
    for g in tr:
        paint(g, ph, PAINTERS, rank_scale=float(1 + rng.normal(0, 0.012)))
        training_memory(g, (0.7, 0.88), rng)
        if ib:
            for t0, t1, name in ph:
                if name == "train":
                    g.act["ib"][int(t0):int(t1)] = ib
    return sl, tr, ph


@scenario("straggler_thermal_gpu", requires=["straggler"], allows=["throttled"],
          why="One of 16 GPUs has a failing fan: it runs 20-30% slower with the thermal slowdown reason at 88-95 C, "
          "stays busy while its 15 peers wait in all-reduce at lower SM: a straggler with a hardware signature.")
def straggler_thermal_gpu(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Synchronous data parallel runs at the pace of its slowest rank; Falcon (fail-slow
    study, >10k GPUs) finds such episodes lasting minutes to hours and stretching jobs 1.34x.
    The hardware signature is the clock deficit with reasons 0x20/0x40 (Meta GCM: clocks
    below application clock)."""
    d = 7200
    sl, tr, ph = _healthy_run(rng, f"strag-th-{seed}", 16, d, ib=0.2)
    bad = int(rng.integers(0, 16))
    onset = float(rng.uniform(600, 1500))
    slow = float(rng.uniform(0.7, 0.8))
    for i, g in enumerate(tr):
        for t0, t1, name in ph:
            a, b = max(t0, onset), t1
            if name != "train" or b <= a:
                continue
            if i == bad:
                g.fill(a, b, {**LLM_STEP, "sm": 0.93, "tensor": 0.55})
            else:  # peers wait for the slow rank: less compute per second
                g.fill(a, b, {**LLM_STEP, "sm": 0.88 * slow + 0.04, "tensor": 0.52 * slow, "ib": 0.2 * slow})
    # The fan failed: the die runs ~90 C; thermal slowdown (0x20) follows from physics, the
    # forced factor is the rest of the deficit the failing part shows.
    tr[bad].cooling = 1.35
    tr[bad].ambient_c = 42.0
    tr[bad].slow(onset, d, slow, 0x20)
    meta = slurm("llm-16gpu", user=str(rng.choice(USERS)), num_nodes=2, ntasks=16)
    return [job(stable_id("strag-th", seed), meta, d, sl, tr, expect(["straggler"], ["throttled"]), "thermal "
                                                                                                    "straggler")]


@scenario("straggler_power_brake_node", requires=["straggler"], allows=["throttled"],
          why="One node of three has a PSU fault: its 8 GPUs hold HW power brake (0x80) at 50-65% clock, and "
              "the 16 GPUs "
          "on healthy nodes wait on them every step: a node straggler (drain the node).")
def straggler_power_brake_node(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """HW power brake slowdown is asserted by the system (PSU or BMC) for the whole board
    (NVML clock event reasons); a whole slow node moves a job-wide median, so a node must be
    judged against the other nodes."""
    d = 5400
    sl, tr, ph = _healthy_run(rng, f"strag-pb-{seed}", 24, d, ib=0.25)
    bad_node = sl[8 * int(rng.integers(0, 3))].node
    onset = float(rng.uniform(600, 1200))
    f = float(rng.uniform(0.5, 0.65))
    for s, g in zip(sl, tr, strict=True):
        for t0, t1, name in ph:
            a, b = max(t0, onset), t1
            if name != "train" or b <= a:
                continue
            if s.node == bad_node:
                g.fill(a, b, {**LLM_STEP, "sm": 0.93, "tensor": 0.55, "ib": 0.25 * f})
            else:
                g.fill(a, b, {**LLM_STEP, "sm": 0.88 * f + 0.05, "tensor": 0.52 * f, "ib": 0.25 * f})
        if s.node == bad_node:
            g.slow(onset, d, f, POWER_BRAKE | HW_SLOWDOWN)
    meta = slurm("llm-24gpu", user=str(rng.choice(USERS)), num_nodes=3, ntasks=24)
    return [job(stable_id("strag-pb", seed), meta, d, sl, tr, expect(["straggler"], ["throttled"]), "power brake node")]


@scenario("pipeline_stage_imbalance", allows=sorted(PIPELINE_KINDS),
          why="A 4-stage pipeline-parallel job whose last stage (LM head and loss) does ~30% more work keeps "
              "those GPUs "
          "at SM ~0.9 and the others at ~0.68, with equal clocks and no throttle reasons: rebalance stages, not "
          "a straggler.")
def pipeline_stage_imbalance(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Megatron-LM pipeline parallelism: the first and last stages carry the embedding and the
    output layer + loss, so uneven stages are common and the fix is re-partitioning layers
    (issue 13: a straggler needs a hardware signature; pipeline imbalance is its own finding)."""
    d = 7200
    sl, tr, ph = _healthy_run(rng, f"pp-{seed}", 8, d)
    heavy = float(rng.uniform(1.25, 1.35))
    for i, g in enumerate(tr):
        stage = i // 2
        for t0, t1, name in ph:
            if name != "train":
                continue
            if stage == 3:
                g.fill(t0, t1, {**LLM_STEP, "sm": 0.9, "tensor": 0.55})
            else:
                g.fill(t0, t1, {**LLM_STEP, "sm": 0.9 / heavy, "tensor": 0.55 / heavy, "nvlink": 0.08})
    meta = slurm("gpt-pp4-dp2", user=str(rng.choice(USERS)), ntasks=8)
    return [job(stable_id("pp", seed), meta, d, sl, tr, expect(allowed=PIPELINE_KINDS), "pipeline imbalance")]


@scenario("throttled_hot_aisle", requires=["throttled"],
          why="A cooling failure puts all 8 GPUs of a node at 88-98 C with SW/HW thermal slowdown and clocks at 60-80% "
          "of boost for hours: throttled (a facilities ticket), not a job to tune.")
def throttled_hot_aisle(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Meta GCM treats clocks below the application clock as critical; DCGM reports reasons
    0x20 (SW thermal) and 0x40 (HW thermal) while the die is above its slowdown temperature."""
    d = 7200
    sl, tr, _ph = _healthy_run(rng, f"hot-{seed}", 8, d)
    # Inlet air at ~45 C and degraded airflow: the dies settle at 90-97 C and the driver's
    # thermal slowdown (0x20, 0x40 above the HW limit) takes the clocks down to 60-80%.
    for g in tr:
        g.ambient_c = float(rng.uniform(44.0, 47.0))
        g.cooling = float(rng.uniform(1.4, 1.6))
    meta = slurm("llm-node-hot", user=str(rng.choice(USERS)), ntasks=8)
    return [job(stable_id("hot", seed), meta, d, sl, tr, expect(["throttled"]), "thermal throttling")]


@scenario("xid79_fell_off_bus", requires=["hw_fault"],
          allows=["hung", "idle_gpu", "low_sm_activity", "oversized_allocation"],
          why="GPU k reports XID 79 and stops answering; the 7 other ranks spin in NCCL until the collective timeout "
          "kills the job 10-30 min later: a hardware fault first of all.")
def xid79_fell_off_bus(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """XID 79 'GPU has fallen off the bus' (NVIDIA XID catalog); afterwards NVML returns
    GPU_IS_LOST for that device, so its samples simply stop (no zeros). PyTorch's NCCL
    watchdog aborts after its timeout (10 min default in recent releases, often set to 30)."""
    t_fault = float(rng.uniform(2400, 4200))
    timeout = float(rng.choice([600, 1800]))
    d = int(t_fault + timeout + 60)
    sl, tr, _ph = _healthy_run(rng, f"xid79-{seed}", 8, d)
    bad = int(rng.integers(0, 8))
    for i, g in enumerate(tr):
        if i == bad:
            g.xid_event(t_fault, 79, "GPU has fallen off the bus")
            g.gone(t_fault + 1)
        else:
            g.fill(t_fault, t_fault + timeout, {"duty": 1.0, "sm": 0.14, "occ": 0.02}, rel_noise=0.02)
            g.fill(t_fault + timeout, d, {})
    meta = slurm("llm-8gpu", user=str(rng.choice(USERS)), ntasks=8)
    return [job(stable_id("xid79", seed), meta, d, sl, tr,
                expect(["hw_fault"], ["hung", "idle_gpu", "low_sm_activity", "oversized_allocation"]), "xid 79")]


@scenario("ecc_double_bit", requires=["hw_fault"],
          why="An uncorrectable (double-bit) ECC error on one GPU (XID 48, DBE counter +1, row remap pending) "
              "crashes the "
          "job a minute later: the GPU needs a reset and a row remap before reuse.")
def ecc_double_bit(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """NVIDIA XID catalog: 48 = DBE; 63/64 = row remapping events; the job's CUDA context is
    lost and the job exits (Meta RSC: GPU memory errors among the top hardware failure causes)."""
    t = float(rng.uniform(1800, 4800))
    d = int(t + 90)
    sl, tr, _ph = _healthy_run(rng, f"dbe-{seed}", 4, d, device=A100)
    bad = tr[int(rng.integers(0, 4))]
    bad.bump("ecc_dbe", t, 1)
    bad.xid_event(t, 48, "DBE (Double Bit Error) ECC Error")
    bad.xid_event(t + 2, 63, "ECC page retirement or row remapping recording event")
    for g in tr:
        g.fill(t + 5, d, {})
    meta = slurm("sft-a100", user=str(rng.choice(USERS)), ntasks=4)
    return [job(stable_id("dbe", seed), meta, d, sl, tr, expect(["hw_fault"]), "dbe")]


@scenario("nvlink_crc_storm", requires=["hw_fault"], allows=["straggler", "comm_bound"],
          why="One GPU's NVLink starts logging thousands of CRC flit errors (XID 74) and replays slow its collectives: "
          "a link that needs service, whatever the job does.")
def nvlink_crc_storm(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """XID 74 is an NVLink error (NVIDIA XID catalog); DCGM field 409 counts CRC flit errors
    summed over links; a degrading link shows a steady climb, not a single blip."""
    d = 7200
    sl, tr, _ph = _healthy_run(rng, f"nvl-{seed}", 8, d)
    bad = tr[int(rng.integers(0, 8))]
    onset = float(rng.uniform(1200, 3000))
    rate = float(rng.uniform(2, 8))  # errors per second
    for s in range(int(onset), d, 10):
        bad.bump("nvlink_err", s, rng.poisson(rate * 10))
    bad.xid_event(onset + 5, 74, "NVLink: fatal error detected on link 3")
    meta = slurm("llm-8gpu", user=str(rng.choice(USERS)), ntasks=8)
    return [job(stable_id("nvl", seed), meta, d, sl, tr, expect(["hw_fault"], ["straggler", "comm_bound"]), "nvlink")]


@scenario("pcie_replay_climb", requires=["hw_fault"],
          why="A bad riser makes one GPU's PCIe replay counter climb by thousands during a job while it keeps running: "
          "the link retrains and retries; hardware to service.")
def pcie_replay_climb(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """DCGM field 202 (PCIe replay counter) counts link-level retries since driver load;
    thousands during one job point at a marginal link (GCM health checks include it)."""
    d = 7200
    sl, tr, _ph = _healthy_run(rng, f"pcie-{seed}", 4, d)
    bad = tr[int(rng.integers(0, 4))]
    onset = float(rng.uniform(600, 2400))
    for s in range(int(onset), d, 30):
        bad.bump("pcie_replay", s, rng.poisson(40))
    meta = slurm("llm-4gpu", user=str(rng.choice(USERS)), ntasks=4)
    return [job(stable_id("pcie", seed), meta, d, sl, tr, expect(["hw_fault"]), "pcie replays")]


@scenario("hung_collective", requires=["hung"],
          why="After 30-50 min of training one rank deadlocks and every GPU sits at 100% utilisation, SM ~0.15, no "
          "tensor, DRAM, NVLink or IB traffic for two hours: a hung collective (dump stacks, NCCL_DEBUG=INFO).")
def hung_collective(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """A rank stuck (data-dependent control flow, a lost peer) leaves the others in an NCCL
    kernel that polls forever: utilisation pinned, almost no SM work (issue 13's observation).
    The engine must raise it within 15 minutes of the hang."""
    hang = float(rng.uniform(1800, 3000))
    d = int(hang + 7200)
    sl, tr, _ph = _healthy_run(rng, f"hung-{seed}", 8, d, ib=0.2)
    for g in tr:
        g.fill(hang, d, {"duty": 1.0, "sm": float(rng.uniform(0.12, 0.18)), "occ": 0.02}, rel_noise=0.02)
    meta = slurm("llm-2node", user=str(rng.choice(USERS)), num_nodes=1, ntasks=8)
    return [job(stable_id("hung", seed), meta, d, sl, tr, expect(["hung"], deadline_s={"hung": hang + 900}), "hung")]


@scenario("straggler_one_in_64", requires=["straggler"], allows=["throttled"], intervals=(10, 30, 60), seeds=(1, 2),
          why="In a 64-GPU job one GPU's SM clock sits 15-25% low under HW slowdown (0x8) while the other 63 wait for "
          "it every step: one straggler among many, found without drowning in the others' variation.")
def straggler_one_in_64(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Falcon (fail-slow detection on >10k GPUs): a single slow GPU stalls synchronous training
    at scale; HW slowdown (0x8) is asserted e.g. by an external power-brake or a failing VRM.
    Rendered at 10 s and coarser only, to keep the library's run time in minutes."""
    d = 5400
    sl, tr, ph = _healthy_run(rng, f"strag64-{seed}", 64, d, ib=0.25)
    bad = int(rng.integers(0, 64))
    onset = float(rng.uniform(600, 1200))
    slow = float(rng.uniform(0.75, 0.85))
    for i, g in enumerate(tr):
        for t0, t1, name in ph:
            a, b = max(t0, onset), t1
            if name != "train" or b <= a:
                continue
            if i == bad:
                g.fill(a, b, {**LLM_STEP, "sm": 0.93, "tensor": 0.55, "ib": 0.25 * slow})
            else:
                g.fill(a, b, {**LLM_STEP, "sm": 0.88 * slow + 0.04, "tensor": 0.52 * slow, "ib": 0.25 * slow})
    tr[bad].slow(onset, d, slow, HW_SLOWDOWN)
    meta = slurm("llm-64gpu", user=str(rng.choice(USERS)), num_nodes=8, ntasks=64)
    return [job(stable_id("strag64", seed), meta, d, sl, tr, expect(["straggler"], ["throttled"]), "1 in 64")]


@scenario("llm_64gpu_healthy", intervals=(10, 30, 60), seeds=(1, 2),
          why="A healthy 64-GPU pre-training job whose nodes differ as real nodes do (one rack's inlet 6-8 C warmer, "
          "clocks a few MHz apart, rank-to-rank work +-1.5%): no straggler, no throttling.")
def llm_64gpu_healthy(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Across a large job, per-node temperature and per-GPU clock spread are normal (Meta GCM
    alerts on clocks below the application clock, not on a few MHz); a straggler detector must
    tolerate this spread at scale."""
    d = 5400
    sl, tr, _ = _healthy_run(rng, f"llm64-{seed}", 64, d, ib=0.25)
    warm = {s.node for s in sl[:16]}  # two nodes in the warmer rack
    for s, g in zip(sl, tr, strict=True):
        if s.node in warm:
            g.ambient_c += float(rng.uniform(6, 8))
    meta = slurm("llm-64gpu", user=str(rng.choice(USERS)), num_nodes=8, ntasks=64)
    return [job(stable_id("llm64", seed), meta, d, sl, tr, expect(), "64-GPU healthy")]

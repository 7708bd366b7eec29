"""Harder cases near the lines a verdict has to draw: activity just above and just below the
DCGM guide's 0.5, phases that change for hours, a rank that evaluates alone while the others
wait, a mid-job storage outage, a fleet whose nodes differ in what they report, a small job
with one hot GPU, a tensor-parallel serving replica."""

from __future__ import annotations

import numpy as np

from .builders import (
    CKPT,
    EVAL,
    LLM_STEP,
    Painter,
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
from .hardware import A100, GIB, H100, H100_MIG_1G10, L40S
from .model import JobSpec, expect, scenario
from .scenarios_serving import DECODE, SERVING_OK, busy_from_requests
from .scenarios_training import USERS
from .signals import Level

PAINTERS: dict[str, Level | Painter] = {"warmup": warmup_painter(LLM_STEP), "train": LLM_STEP, "ckpt": CKPT,
                                        "eval": EVAL}


@scenario("long_eval_after_training", why="A job that trains for 60-80 min and then runs a 80-100 min evaluation sweep "
          "(forward only, SM 0.52-0.6) changes phase for hours; both phases are work, so nothing is flagged.")
def long_eval_after_training(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Benchmark suites after a training run (lm-eval-harness style) are forward-only and
    lighter than training; docs/goodput.md lists "jobs that change phase for hours" among what
    the simulator does not model."""
    train = float(rng.uniform(3600, 4800))
    d = int(train + rng.uniform(4800, 6000))
    sl = slots(f"longeval-{seed}", H100, 4)
    tr = truths(rng, sl, d)
    ph = [p for p in training_schedule(rng, int(train), eval_every_s=None)]
    ev = {"duty": 0.95, "sm": float(rng.uniform(0.52, 0.6)), "occ": 0.3, "tensor": 0.3, "dram": 0.35,
          "pcie_rx": 0.4e9}
    for g in tr:
        paint(g, ph, PAINTERS, rank_scale=float(1 + rng.normal(0, 0.01)))
        g.fill(train, d, ev)
        training_memory(g, (0.6, 0.8), rng)
    meta = slurm("train-then-eval", user=str(rng.choice(USERS)), ntasks=4)
    return [job(stable_id("longeval", seed), meta, d, sl, tr, expect(), "long eval")]


@scenario("rank0_only_eval", why="Every hour rank 0 evaluates alone for 12-18 min while ranks 1-7 wait on the CPU "
          "(gloo barrier) with idle GPUs; short, periodic and part of the recipe: not an oversized allocation.")
def rank0_only_eval(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Many training scripts evaluate `if rank == 0:` while the other ranks block in a CPU-side
    barrier; their GPUs then run nothing (Job Defense Shield's multi-GPU rule looks at whole
    jobs, not such minutes)."""
    d = 9000
    sl = slots(f"r0eval-{seed}", A100, 8)
    tr = truths(rng, sl, d)
    ph = training_schedule(rng, d, eval_every_s=None)
    evals = []
    t = float(rng.uniform(2400, 3300))
    while t < d - 1200:
        ln = float(rng.uniform(720, 1080))
        evals.append((t, t + ln))
        t += ln + float(rng.uniform(2700, 3300))
    for i, g in enumerate(tr):
        paint(g, ph, PAINTERS, rank_scale=float(1 + rng.normal(0, 0.01)))
        for a, b in evals:
            g.fill(a, b, EVAL if i == 0 else {})
        training_memory(g, (0.6, 0.8), rng)
    meta = slurm("ddp-rank0-eval", user=str(rng.choice(USERS)), ntasks=8)
    return [job(stable_id("r0eval", seed), meta, d, sl, tr, expect(), "rank-0 eval")]


@scenario("storage_outage_midjob", why="A 15-25 min NFS outage mid-job leaves all GPUs idle until the data loader "
          "recovers, then training resumes: a short incident below any idle-GPU minimum, not an idle job.")
def storage_outage_midjob(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Shared filesystem stalls are a routine source of lost training time (Meta's RSC study
    counts filesystem issues among infrastructure interruptions); the job survives them."""
    d = 9000
    sl = slots(f"nfs-{seed}", H100, 8)
    tr = truths(rng, sl, d)
    ph = training_schedule(rng, d)
    a = float(rng.uniform(3000, 5000))
    ln = float(rng.uniform(900, 1500))
    for g in tr:
        paint(g, ph, PAINTERS, rank_scale=float(1 + rng.normal(0, 0.01)))
        g.fill(a, a + ln, {})
        training_memory(g, (0.7, 0.85), rng)
    meta = slurm("llm-nfs", user=str(rng.choice(USERS)), ntasks=8)
    return [job(stable_id("nfs", seed), meta, d, sl, tr, expect(), "storage outage")]


@scenario("mixed_profiling_nodes", why="A 16-GPU job over two nodes whose second node runs an older image without DCGM "
          "profiling: half its GPUs report SM/tensor, half only NVML; healthy everywhere, and unknown is not zero.")
def mixed_profiling_nodes(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Rolling driver/DCGM upgrades leave fleets mixed for weeks; signal coverage must be
    tracked per GPU (issue 13: "track which signals each GPU has")."""
    d = 7200
    sl = slots(f"mixed-{seed}", H100, 16)
    tr = truths(rng, sl, d)
    ph = training_schedule(rng, d)
    for g in tr:
        paint(g, ph, PAINTERS, rank_scale=float(1 + rng.normal(0, 0.01)))
        training_memory(g, (0.7, 0.85), rng)
        for t0, t1, name in ph:
            if name == "train":
                g.act["ib"][int(t0):int(t1)] = 0.22
    meta = slurm("llm-mixed", user=str(rng.choice(USERS)), num_nodes=2, ntasks=16)
    return [job(stable_id("mixed", seed), meta, d, sl, tr, expect(), "mixed profiling",
                node_field_set={sl[8].node: "nvml"})]


@scenario("sm_just_above_half", why="A mid-sized model trains steadily at SM 0.56-0.65 with tensor ~0.3: below the "
          "0.8 ideal but above the DCGM guide's 0.5 'likely ineffective' line, so it is not flagged.")
def sm_just_above_half(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """DCGM user guide: SM activity >= 0.8 is necessary for effective use, < 0.5 likely
    ineffective; between them lies most of a real fleet (Acme NSDI'24: medians 0.34-0.5)."""
    d = 7200
    sl = slots(f"sm60-{seed}", A100, 4)
    tr = truths(rng, sl, d)
    sm = float(rng.uniform(0.56, 0.65))
    for g in tr:
        g.fill(0, 240, {"duty": 0.4, "sm": 0.1})
        g.fill(240, d, {"duty": 0.99, "sm": sm, "occ": 0.28, "tensor": 0.3, "dram": 0.4, "nvlink": 0.08,
                        "pcie_rx": 0.8e9})
        g.memory(0, d, float(rng.uniform(30, 60)) * GIB, wobble_bytes=GIB)
    meta = slurm("vit-base", user=str(rng.choice(USERS)), ntasks=4)
    return [job(stable_id("sm60", seed), meta, d, sl, tr, expect(), "sm above half")]


@scenario("sm_just_below_half", requires=["low_sm_activity"], why="The same kind of job at SM 0.36-0.45 all along "
          "(small per-GPU batch, launch overheads) is on the wrong side of the DCGM guide's 0.5: low SM activity.")
def sm_just_below_half(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """DCGM user guide's < 0.5 line, approached from below; steady (duty ~97%), so neither an
    input stall nor idle."""
    d = 7200
    sl = slots(f"sm40-{seed}", A100, 4)
    tr = truths(rng, sl, d)
    sm = float(rng.uniform(0.36, 0.45))
    for g in tr:
        g.fill(0, 240, {"duty": 0.4, "sm": 0.1})
        g.fill(240, d, {"duty": 0.97, "sm": sm, "occ": 0.18, "tensor": 0.18, "dram": 0.3, "nvlink": 0.06,
                        "pcie_rx": 0.6e9})
        g.memory(0, d, float(rng.uniform(25, 50)) * GIB, wobble_bytes=GIB)
    meta = slurm("vit-small-bs", user=str(rng.choice(USERS)), ntasks=4)
    return [job(stable_id("sm40", seed), meta, d, sl, tr, expect(["low_sm_activity"]), "sm below half")]


@scenario("small_job_one_hot_gpu", requires=["throttled"], allows=["straggler"],
          why="A 2-GPU job where one GPU sits in a hot slot (~95 C, thermal slowdown, clocks ~65-80%) for the whole "
          "run: throttled, even though half the job is fine.")
def small_job_one_hot_gpu(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Uneven airflow inside a chassis (the GPU furthest from the fans) is a classic cause of
    one GPU throttling (Meta GCM checks clocks per GPU); with two GPUs there are no peers to
    compare against, so the throttle reasons and the clock deficit are the evidence."""
    d = 7200
    sl = slots(f"hot1-{seed}", L40S, 2)
    tr = truths(rng, sl, d)
    for i, g in enumerate(tr):
        g.fill(0, 200, {"duty": 0.4, "sm": 0.1})
        g.fill(200, d, {**LLM_STEP, "nvlink": 0.0, "sm": 0.85, "tensor": 0.45})
        g.memory(0, d, float(rng.uniform(30, 40)) * GIB)
        if i == 1:
            g.ambient_c = float(rng.uniform(36, 40))
            g.cooling = float(rng.uniform(1.45, 1.55))
    meta = slurm("finetune-2gpu", user=str(rng.choice(USERS)), partition="gpu-l40s", ntasks=2)
    return [job(stable_id("hot1", seed), meta, d, sl, tr, expect(["throttled"], ["straggler"]), "one hot GPU")]


@scenario("serving_tensor_parallel", allows=sorted(SERVING_OK),
          why="A vLLM replica with tensor parallelism over 4 GPUs serves bursty traffic: the GPUs alternate in "
          "lockstep with NVLink all-reduce while busy; serving, not comm-bound and not stalled.")
def serving_tensor_parallel(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Tensor-parallel inference all-reduces activations twice per layer (Megatron-style TP),
    so NVLink moves data whenever the replica works; load is request-driven (BurstGPT)."""
    d = 3 * 3600
    sl = slots(f"tp4-{seed}", H100, 4)
    tr = truths(rng, sl, d)
    rate = np.full(d, float(rng.uniform(1.0, 2.5)))
    busy = busy_from_requests(rng, rate[120:], float(rng.uniform(0.15, 0.3)))
    for g in tr:
        g.fill(0, 120, {"duty": 0.4, "sm": 0.2, "pcie_rx": 12e9})
        g.mix(120, d, busy, {**DECODE, "nvlink": 0.25}, {"duty": 0.0})
        g.memory(0, 120, 0.6 * GIB)
        g.memory(120, d, 0.9 * g.device.memory_total_bytes)
    jid, meta = k8s(f"vllm-70b-tp4-{stable_id('tp4', seed, digits=5)}-k2", namespace="inference",
                    owner_kind="Deployment", owner_name="vllm-llama3-70b", app="vllm-llama3-70b")
    return [job(jid, meta, d, sl, tr, expect(allowed=SERVING_OK), "tp serving", field_set="dcgm_no_ib")]


@scenario("serving_zero_traffic", requires=["idle_gpu"], allows=sorted(SERVING_OK),
          why="A canary replica nobody routes to holds a GPU with a full KV cache and serves zero requests for 3 h: "
          "idle, whatever its workload class (an idle serving GPU is still an idle GPU).")
def serving_zero_traffic(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Forgotten canaries and shadow deployments are a known source of idle inference GPUs;
    the serving class changes the advice (scale to zero), not whether the GPU is idle."""
    d = 3 * 3600
    sl = slots(f"canary-{seed}", H100, 1)
    tr = truths(rng, sl, d)
    g = tr[0]
    g.fill(0, 120, {"duty": 0.4, "sm": 0.2, "pcie_rx": 12e9})
    g.memory(0, 120, 0.6 * GIB)
    g.memory(120, d, 0.9 * g.device.memory_total_bytes)
    jid, meta = k8s(f"vllm-canary-{stable_id('canary', seed, digits=5)}-z8", namespace="inference",
                    owner_kind="Deployment", owner_name="vllm-canary", app="vllm-canary")
    labels = expect(any_of=[["idle_gpu", *sorted(SERVING_OK - {"low_sm_activity"})]], allowed=["low_sm_activity"])
    return [job(jid, meta, d, sl, tr, labels, "zero traffic", field_set="dcgm_no_ib")]


@scenario("benign_error_counters", why="Healthy training whose GPUs log what healthy GPUs log: a few corrected ECC "
          "errors, a dozen NVLink CRC retries, a handful of PCIe replays, a stale XID from an earlier job: no fault.")
def benign_error_counters(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Corrected (single-bit) ECC errors and occasional link retries are normal at fleet scale
    (NVIDIA's XID and ECC documentation: SBEs are corrected in hardware; GCM alerts on
    uncorrectable errors and retirement failures, not on a few retries)."""
    d = 7200
    sl = slots(f"benign-{seed}", H100, 8)
    tr = truths(rng, sl, d)
    ph = training_schedule(rng, d)
    for g in tr:
        paint(g, ph, PAINTERS, rank_scale=float(1 + rng.normal(0, 0.01)))
        training_memory(g, (0.7, 0.85), rng)
        for _ in range(int(rng.integers(0, 4))):
            g.bump("ecc_sbe", float(rng.uniform(0, d)), 1)
        for _ in range(int(rng.integers(2, 14))):
            g.bump("nvlink_err", float(rng.uniform(0, d)), 1)
        for _ in range(int(rng.integers(0, 6))):
            g.bump("pcie_replay", float(rng.uniform(0, d)), 1)
    tr[0].xid[:] = 43  # the previous job on this GPU ended with an application fault
    meta = slurm("llm-benign", user=str(rng.choice(USERS)), ntasks=8)
    return [job(stable_id("benign", seed), meta, d, sl, tr, expect(), "benign counters")]


@scenario("notebook_sporadic_cells", requires=["low_sm_activity"], allows=["idle_gpu"],
          why="A notebook where someone runs a 10-40 s cell every 5-15 min for 3 h averages ~3% SM: never all-zero, "
          "so a strict idle rule misses it, yet 97% of the GPU is wasted and must be flagged.")
def notebook_sporadic_cells(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """Interactive sessions with occasional work are the long tail of low utilisation in
    university clusters (jobstats' low-utilisation notes; JDS needs every sample at 0 to call
    a GPU idle)."""
    d = int(rng.uniform(3.0, 4.0) * 3600)
    sl = slots(f"nbcells-{seed}", A100, 1)
    tr = truths(rng, sl, d)
    g = tr[0]
    t = float(rng.uniform(60, 300))
    while t < d:
        g.fill(t, t + float(rng.uniform(10, 40)), {"duty": 0.95, "sm": 0.6, "tensor": 0.25, "dram": 0.35, "occ": 0.3})
        t += float(rng.uniform(300, 900))
    g.memory(0, d, float(rng.uniform(12, 30)) * GIB)
    meta = slurm("jupyter", user=str(rng.choice(USERS)), partition="interactive", qos="interactive", ntasks=1)
    labels = expect(any_of=[["low_sm_activity", "idle_gpu"]])
    return [job(stable_id("nbcells", seed), meta, d, sl, tr, labels, "sporadic notebook")]


@scenario("mig_slice_nearly_idle", requires=["low_sm_activity"], allows=["idle_gpu"],
          why="A pod on the smallest MIG slice (1g.10gb) uses 1 GB at SM ~0.05 for 3 h: wasteful and must be flagged "
          "(low activity, idle or a tiny workload), though 'move to a MIG slice' would be moot advice.")
def mig_slice_nearly_idle(rng: np.random.Generator, seed: int) -> list[JobSpec]:
    """MIG 1g.10gb is the smallest H100 instance (1/7 of the SMs); JDS's too-much-GPU advice
    targets full GPUs. Memory thresholds must be relative to the device (issue 13)."""
    d = 3 * 3600
    sl = slots(f"migidle-{seed}", H100_MIG_1G10, 1)
    tr = truths(rng, sl, d)
    g = tr[0]
    g.alternate(60, d, {"duty": 0.9, "sm": 0.5, "tensor": 0.2, "dram": 0.3}, {}, period_s=60.0,
                busy_share=float(rng.uniform(0.06, 0.12)))
    g.memory(0, d, float(rng.uniform(0.8, 1.2)) * GIB)
    jid, meta = k8s(f"feature-svc-{stable_id('migidle', seed, digits=5)}-x1", namespace="ml-platform",
                    owner_kind="Deployment", owner_name="feature-svc", app="feature-svc")
    # memory_underuse is a true observation here (1 of 9.75 GiB) and, as an explanation of the
    # low activity, acceptable; its usual advice (a MIG slice) is not, which this label cannot see.
    labels = expect(any_of=[["low_sm_activity", "idle_gpu", "memory_underuse",
                             *sorted(SERVING_OK - {"low_sm_activity"})]])
    return [job(jid, meta, d, sl, tr, labels, "mig nearly idle", field_set="mig")]

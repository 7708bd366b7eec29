"""Workload simulator: nodes with N GPUs running jobs of realistic profiles.

It implements the same ``Source`` interface as the NVML source, so everything downstream
(attribution, batching, spool, collector, analysis) runs unchanged on a machine without
GPUs. Each profile carries its ground truth (the flags the goodput engine should raise),
so bench/goodput can measure precision and recall, false positives on healthy jobs too.

Every job draws its own parameters (intensities, periods, fault times, which GPU is slow)
from its seed, so two jobs of one profile differ, and some land near the thresholds on
purpose. What is and is not modelled: docs/goodput.md.

Pure Python (no numpy): the agent installs without the server's packages.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from gpufleet.protocol import Event, GpuInfo, JobInfo

from .sim_faults import fabric_fault
from .sim_stories import STORIES, story
from .sources.base import GpuReading, SourceAttribution

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"
H100_MEM = 80 * GIB
MAX_SM_CLOCK = 1980.0
IDLE_SM_CLOCK = 345.0
MEM_CLOCK = 2619.0
NVLINK_BW = 4.5e11  # H100 SXM, bytes/s per direction
IB_BW = 5.0e10  # NDR 400 Gb/s, bytes/s per direction


@dataclass(frozen=True, slots=True)
class GpuContext:
    """What a profile knows when it draws one GPU's sample."""

    t: float  # seconds since the job started
    rank: int  # GPU rank within the job (0..n_gpus-1)
    n_gpus: int
    node_rank: int
    n_nodes: int
    rng: random.Random
    job_seed: int = 0  # per-job parameters are drawn from this
    interval_s: float = 1.0  # the sampling interval (counters are averaged over it)
    gpus_per_node: int = 8


ProfileFn = Callable[[GpuContext], dict[str, float]]


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    flags: frozenset[str]  # ground truth: the flags a correct engine raises for this job
    fn: ProfileFn
    healthy: bool = False
    min_gpus: int = 1
    multi_node: bool = False
    max_gpus: int = 8
    # Its collectives run through NCCL (the demo writes Inspector records for them), and the
    # flags only the fabric data shows (GPU samples alone must raise ``flags``, no more).
    nccl: bool = False
    fabric_flags: frozenset[str] = frozenset()
    # Its processes report progress (agent/sim_stories.py) and the flags only that shows; such a
    # job starts inside the replayed history, so its whole story (startup included) is seen.
    progress_flags: frozenset[str] = frozenset()


# --- per-job parameters -----------------------------------------------------------------

_PARAMS: dict[tuple[str, int], dict[str, Any]] = {}


def _params(name: str, ctx: GpuContext, draw: Callable[[random.Random, GpuContext], dict[str, Any]]) -> dict[str, Any]:
    key = (name, ctx.job_seed)
    p = _PARAMS.get(key)
    if p is None:
        if len(_PARAMS) > 20000:  # bounded: a long-running simulator sees many jobs
            _PARAMS.clear()
        p = draw(random.Random(f"{name}/{ctx.job_seed}"), ctx)
        _PARAMS[key] = p
    return p


def _gpu_offset(ctx: GpuContext) -> tuple[float, float]:
    """Persistent per-GPU spread (silicon lottery, placement): SM activity and clock."""
    r = random.Random(ctx.job_seed * 1009 + ctx.rank)
    return r.gauss(0.0, 0.012), r.gauss(0.0, 8.0)


_DRIFT: dict[int, list[tuple[float, float, float]]] = {}


def _drift(ctx: GpuContext) -> float:
    """Slow multiplicative drift of a job's intensity (data mix, sequence lengths, thermal
    state): three sinusoids of 4-90 minutes, a few percent each, drawn per job."""
    d = _DRIFT.get(ctx.job_seed)
    if d is None:
        if len(_DRIFT) > 20000:
            _DRIFT.clear()
        r = random.Random(f"drift/{ctx.job_seed}")
        d = [(r.uniform(0.0, 0.035), r.uniform(240, 5400), r.uniform(0, 2 * math.pi)) for _ in range(3)]
        _DRIFT[ctx.job_seed] = d
    return 1.0 + sum(a * math.sin(2 * math.pi * ctx.t / p + ph) for a, p, ph in d)


# --- physics ---------------------------------------------------------------------------------
# The relations the engine relies on, checked against captured nvidia-smi / dcgm-exporter output
# (tests/agent/test_sim_physics.py): an idle GPU draws ~10% of its limit at a low clock with the
# idle reason set; board power follows what the SMs, tensor pipes and DRAM do and the clock they
# run at; a software power cap holds the board at its limit; thermal slowdown happens only above
# the slowdown temperature; GPUDirect RDMA moves every InfiniBand byte over the GPU's PCIe link.
IDLE_W = 70.0  # H100 SXM idle board power (a P0 GPU with nothing running)
POWER_LIMIT_W = 700.0  # H100 SXM default enforced limit
DYN_W = 865.0  # dynamic power at full activity of every unit and full clock (~650 W for LLM training)
THERMAL_SLOWDOWN_C = 87.0  # H100 SXM slowdown temperature; unthrottled GPUs stay below it
THERMAL_BITS = 0x20 | 0x40  # SW / HW thermal slowdown
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
PCIE_HEADERS = 1.03  # PCIe counters include TLP headers: a little more than the payload crossing


def busy_power_w(sm: float, tensor: float, dram: float, clock_mhz: float) -> float:
    """Board power of a busy GPU: idle + dynamic power weighted by what is active, scaled by
    (clock/max)^2 (voltage follows frequency), never above the limit."""
    act = 0.45 * sm + 0.35 * tensor + 0.2 * dram
    return min(POWER_LIMIT_W, IDLE_W + DYN_W * act * (clock_mhz / MAX_SM_CLOCK) ** 2)


def die_temp_c(power_w: float) -> float:
    """Die temperature of a well-cooled GPU at ``power_w``: ~33 C idle, ~80 C at the limit (below
    the slowdown temperature: only a throttled GPU, with its reason set, runs hotter)."""
    return 28.0 + 0.075 * power_w


def _base(ctx: GpuContext, *, sm: float, occ: float, tensor: float, dram: float, fb_gib: float,
          power: float = IDLE_W, fp32: float = 0.05, fp16: float = 0.02, fp64: float = 0.0,
          pcie_rx: float = 2e8, pcie_tx: float = 5e7, nvlink: float = 0.0, ib: float = 0.0,
          clock: float = MAX_SM_CLOCK, reasons: int = 0, sd: float = 0.03,
          temp: float | None = None) -> dict[str, float]:
    """One GPU's sample. ``power`` is the draw while not busy (idle); a busy GPU's power follows
    its activity and clock (busy_power_w). ``temp`` overrides the die temperature (a thermally
    throttled GPU: above THERMAL_SLOWDOWN_C). The noise draws come in a fixed order, so a profile's
    samples are the same for one seed whatever the physics does with them."""
    r = ctx.rng
    g = r.gauss
    sm_off, clk_off = _gpu_offset(ctx)
    if sm > 0.05:
        sm = sm * _drift(ctx) + sm_off
    sm_v = min(1.0, max(0.0, g(sm, sd)))
    busy = sm_v > 0.02
    # Secondary pipes follow the SM activity's noise, within reason: at a checkpoint's 3% the
    # noise alone would otherwise double the DRAM traffic.
    scale = min(1.25, sm_v / sm) if sm > 0.02 else 0.0
    clk = min(MAX_SM_CLOCK, clock + clk_off) if busy else IDLE_SM_CLOCK
    d: dict[str, float] = {"gr_engine_active": min(1.0, sm_v * 1.02), "sm_active": sm_v}
    d["sm_occupancy"] = min(1.0, max(0.0, occ * scale + g(0, 0.01)))
    # The tensor pipes run inside active SMs: never more active than the SMs (a checkpoint's dip
    # takes the tensor work down with it).
    d["tensor_active"] = min(sm_v, max(0.0, tensor * scale + g(0, 0.006)))
    d["dram_active"] = min(1.0, max(0.0, dram * scale + g(0, 0.02)))
    d["fp64_active"] = max(0.0, fp64 * scale + g(0, 0.002))
    d["fp32_active"] = min(1.0, max(0.0, fp32 * scale + g(0, 0.01)))
    d["fp16_active"] = min(1.0, max(0.0, fp16 * scale + g(0, 0.004)))
    d["gpu_util"] = 1.0 if busy else 0.0
    d["mem_copy_util"] = min(1.0, max(0.0, dram * 0.8 * scale + g(0, 0.02)))
    d["fb_used_bytes"] = max(0.0, fb_gib * GIB + r.uniform(-0.2, 0.2) * GIB)
    d["fb_total_bytes"] = float(H100_MEM)
    reasons = reasons if busy else 0x1
    if reasons & SW_POWER_CAP and not reasons & 0x80 and sm_v < 0.5:
        # A light phase (checkpoint, evaluation) draws well under the cap: it does not bind, so
        # the clock goes back up and the reason clears.
        reasons &= ~SW_POWER_CAP
        clk = min(MAX_SM_CLOCK, MAX_SM_CLOCK + clk_off)
    if not busy:
        watts = power
    elif reasons & SW_POWER_CAP and not reasons & 0x80:
        watts = POWER_LIMIT_W - 6.0  # the cap binds: the board sits at its limit (the clock gave way)
    # (a power brake lowers the limit itself: the board draws what its braked clock allows)
    else:
        watts = busy_power_w(sm_v, d["tensor_active"], d["dram_active"], clk)
    sd_w = 3.0 if busy and reasons & SW_POWER_CAP and not reasons & 0x80 else 8.0  # the cap's controller holds it tight
    d["power_w"] = min(POWER_LIMIT_W, max(50.0, g(watts, sd_w)))
    hot = temp is not None and busy
    d["temp_c"] = min(95.0, max(20.0, g(temp if hot and temp is not None else die_temp_c(d["power_w"]), 1.0)))
    # Only a thermally throttled GPU is at or above the slowdown temperature.
    d["temp_c"] = max(d["temp_c"], THERMAL_SLOWDOWN_C) if hot else min(d["temp_c"], THERMAL_SLOWDOWN_C - 1.0)
    d["sm_clock_mhz"] = clk
    d["mem_clock_mhz"] = MEM_CLOCK
    d["clock_event_reasons"] = float(reasons)
    d["pcie_tx_bytes_s"] = max(0.0, g(pcie_tx, pcie_tx * 0.1 + 1))
    d["pcie_rx_bytes_s"] = max(0.0, g(pcie_rx, pcie_rx * 0.1 + 1))
    d["nvlink_tx_bytes_s"] = max(0.0, g(nvlink, nvlink * 0.05 + 1))
    d["nvlink_rx_bytes_s"] = max(0.0, g(nvlink, nvlink * 0.05 + 1))
    d["ib_tx_bytes_s"] = max(0.0, g(ib, ib * 0.05 + 1))
    d["ib_rx_bytes_s"] = max(0.0, g(ib, ib * 0.05 + 1))
    # GPUDirect RDMA: the GPU's NIC (its rail, under the same PCIe switch) reads what it sends
    # from GPU memory and writes what it receives there, so both cross the GPU's PCIe link.
    d["pcie_tx_bytes_s"] += d["ib_tx_bytes_s"] * PCIE_HEADERS
    d["pcie_rx_bytes_s"] += d["ib_rx_bytes_s"] * PCIE_HEADERS
    d.update(xid_last=0.0, ecc_dbe_volatile=0.0, ecc_sbe_volatile=0.0, row_remap_failure=0.0,
             nvlink_error_count=0.0, pcie_replay_count=0.0)
    return d


def _background(ctx: GpuContext, d: dict[str, float], p: dict[str, Any]) -> dict[str, float]:
    """Things healthy jobs see too: corrected ECC, a few NVLink CRC retries, application
    XIDs (13 graphics exception, 31 MMU fault, 43 stopped): none of them is a hardware fault."""
    if p.get("app_xid") and ctx.rank == 0 and ctx.t >= p["app_xid_at"]:
        d["xid_last"] = float(p["app_xid"])
    d["ecc_sbe_volatile"] = float(p.get("sbe", 0) + int(ctx.t / 3600.0 * p.get("sbe_rate", 0)))
    d["nvlink_error_count"] = float(min(int(ctx.t / 600.0), p.get("crc", 0)))
    return d


def _healthy_extras(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    # One node a few percent slower (older firmware, warmer rack) in 30% of jobs: real, and
    # under the straggler threshold (10%), so it must not flag.
    return {"slow_node_k": r.uniform(0.93, 0.97) if r.random() < 0.3 else 1.0,
            "eval_every": r.uniform(2400, 4800), "eval_len": r.uniform(120, 720), "eval_k": r.uniform(0.35, 0.6),
            "app_xid": r.choice([13, 31, 43]) if r.random() < 0.15 else 0, "app_xid_at": r.uniform(60, 2400),
            "sbe": r.choice([0, 0, 0, 3, 12]), "sbe_rate": r.choice([0, 0, 1, 4]), "crc": r.choice([0, 0, 2, 20, 60])}


def _busy_overlap(t: float, width: float, period: float, busy: float, phase: float) -> float:
    """Share of the sampling interval (t - width, t] inside the busy part of a periodic
    busy/idle cycle: DCGM counters are averages over the interval, not point samples."""
    a, b = t - width + phase, t + phase

    def cum(x: float) -> float:  # busy time in [0, x)
        k, rem = divmod(x, period)
        return k * busy + min(rem, busy)

    return (cum(b) - cum(a)) / width if width > 0 else 0.0


def _slow_node(ctx: GpuContext, p: dict[str, Any]) -> tuple[float, float]:
    """(clock factor, SM factor): node 0 runs at ``slow_node_k`` clock, the others wait for it."""
    k = p.get("slow_node_k", 1.0)
    if k >= 1.0 or ctx.n_nodes < 2:
        return 1.0, 1.0
    return (k, 1.0) if ctx.node_rank == 0 else (1.0, k)


def _step_dip(ctx: GpuContext, p: dict[str, Any]) -> float:
    """Training steps end in an all-reduce and an optimizer step: a short SM dip per step
    (mostly averaged away at 1 Hz), and a checkpoint every so often (tens of seconds idle)."""
    if p.get("ckpt_every") and (ctx.t % p["ckpt_every"]) < p["ckpt_len"]:
        return 0.03
    if p.get("eval_every") and (ctx.t % p["eval_every"]) >= p["eval_every"] - p["eval_len"]:
        return p["eval_k"]  # evaluation pass: forward only, smaller kernels, for a few minutes
    return 1.0 - p.get("dip", 0.06) * ctx.rng.random()


# --- healthy profiles -------------------------------------------------------------------

def _draw_llm(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    capped = r.random() < 0.35  # SW power cap at full load is normal on H100s: clocks dip a little
    return {"sm": r.uniform(0.84, 0.96), "tensor": r.uniform(0.38, 0.68), "occ": r.uniform(0.3, 0.5),
            "dram": r.uniform(0.35, 0.55), "fb": r.uniform(55, 78), "power": r.uniform(600, 690),
            "nvl": r.uniform(0.15, 0.45) * NVLINK_BW, "ib": r.uniform(0.2, 0.5) * IB_BW,
            "clock": r.uniform(1700, 1930) if capped else MAX_SM_CLOCK, "reasons": 0x4 if capped else 0,
            "ckpt_every": r.uniform(900, 2400), "ckpt_len": r.uniform(15, 90), "dip": r.uniform(0.02, 0.12),
            **_healthy_extras(r, ctx)}


def llm_pretrain(ctx: GpuContext) -> dict[str, float]:
    p = _params("llm_pretrain", ctx, _draw_llm)
    ck, sk = _slow_node(ctx, p)
    k = _step_dip(ctx, p) * sk
    d = _base(ctx, sm=p["sm"] * k, occ=p["occ"], tensor=p["tensor"], dram=p["dram"], fb_gib=p["fb"],
              nvlink=p["nvl"] if ctx.n_gpus > 1 else 0.0, ib=p["ib"] if ctx.n_nodes > 1 else 0.0,
              fp16=0.05, clock=p["clock"] * ck, reasons=p["reasons"])
    return _background(ctx, d, p)


def _draw_vision(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    return {"sm": r.uniform(0.72, 0.92), "tensor": r.uniform(0.18, 0.45), "occ": r.uniform(0.4, 0.6),
            "dram": r.uniform(0.5, 0.7), "fb": r.uniform(18, 60), "power": r.uniform(480, 600),
            "nvl": r.uniform(0.05, 0.2) * NVLINK_BW,
            # Mild input hiccups (a slow shard now and then): healthy, not an input stall.
            "hiccup_every": r.uniform(20, 120), "hiccup_len": r.uniform(0.5, 3.0),
            "ckpt_every": r.uniform(1200, 3600), "ckpt_len": r.uniform(10, 40), **_healthy_extras(r, ctx)}


def vision_train(ctx: GpuContext) -> dict[str, float]:
    p = _params("vision_train", ctx, _draw_vision)
    k = _step_dip(ctx, p) * _busy_overlap(ctx.t, ctx.interval_s, p["hiccup_every"],
                                          p["hiccup_every"] - p["hiccup_len"], 0.0)
    d = _base(ctx, sm=max(0.02, p["sm"] * k), occ=p["occ"], tensor=p["tensor"], dram=p["dram"], fb_gib=p["fb"],
              pcie_rx=3e9, nvlink=p["nvl"] if ctx.n_gpus > 1 else 0.0)
    return _background(ctx, d, p)


def _draw_infer(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    return {"sm": r.uniform(0.53, 0.85), "tensor": r.uniform(0.15, 0.4), "occ": r.uniform(0.25, 0.45),
            "dram": r.uniform(0.55, 0.8), "fb": r.uniform(30, 72), "power": r.uniform(420, 560),
            "wave": r.uniform(600, 1800), "amp": r.uniform(0.0, 0.1), **_healthy_extras(r, ctx)}


def batch_inference(ctx: GpuContext) -> dict[str, float]:
    # Offline batch inference: steady, memory-bandwidth heavy, load drifts slowly.
    p = _params("batch_inference", ctx, _draw_infer)
    sm = p["sm"] + p["amp"] * math.sin(2 * math.pi * ctx.t / p["wave"])
    d = _base(ctx, sm=sm, occ=p["occ"], tensor=p["tensor"], dram=p["dram"], fb_gib=p["fb"],
              pcie_rx=1.5e9, pcie_tx=1.5e9)
    return _background(ctx, d, p)


def _draw_dp(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    return {"sm": r.uniform(0.8, 0.94), "tensor": r.uniform(0.35, 0.6), "occ": r.uniform(0.35, 0.5),
            "dram": r.uniform(0.4, 0.6), "fb": r.uniform(50, 76), "power": r.uniform(580, 680),
            "nvl": r.uniform(0.1, 0.35) * NVLINK_BW, "ib": r.uniform(0.24, 0.52) * IB_BW,
            "ckpt_every": r.uniform(1200, 3000), "ckpt_len": r.uniform(20, 60), "dip": r.uniform(0.03, 0.1),
            **_healthy_extras(r, ctx)}


def multinode_dp(ctx: GpuContext) -> dict[str, float]:
    # Data parallel over InfiniBand: the network is busy but well below its capacity.
    p = _params("multinode_dp", ctx, _draw_dp)
    ck, sk = _slow_node(ctx, p)
    d = _base(ctx, sm=p["sm"] * _step_dip(ctx, p) * sk, occ=p["occ"], tensor=p["tensor"], dram=p["dram"],
              fb_gib=p["fb"], nvlink=p["nvl"], ib=p["ib"] if ctx.n_nodes > 1 else 0.0,
              clock=MAX_SM_CLOCK * ck)
    return _background(ctx, d, p)


def _draw_hpc(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    return {"sm": r.uniform(0.7, 0.92), "fp64": r.uniform(0.25, 0.6), "dram": r.uniform(0.5, 0.85),
            "fb": r.uniform(20, 70), "power": r.uniform(450, 620), **_healthy_extras(r, ctx)}


def hpc_fp64(ctx: GpuContext) -> dict[str, float]:
    # An FP64 stencil code: no tensor cores, and rightly so (no_tensor_cores must not fire).
    p = _params("hpc_fp64", ctx, _draw_hpc)
    d = _base(ctx, sm=p["sm"], occ=0.4, tensor=0.0, dram=p["dram"], fb_gib=p["fb"],
              fp64=p["fp64"], fp32=0.1)
    return _background(ctx, d, p)


# --- inefficient profiles ---------------------------------------------------------------

def _draw_idle(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    # A forgotten notebook / a hung job: maybe some work first, then nothing.
    return {"work_s": r.choice([0.0, 0.0, r.uniform(60, 900)]), "fb": r.choice([0.4, r.uniform(1, 30)]),
            "power": r.uniform(60, 85)}


def _idle_values(ctx: GpuContext, fb_gib: float, power: float) -> dict[str, float]:
    d = _base(ctx, sm=0.0, occ=0.0, tensor=0.0, dram=0.0, fb_gib=fb_gib, power=power, fp32=0.0, fp16=0.0,
              pcie_rx=1e5, pcie_tx=1e5, sd=0.002)
    d["sm_active"] = d["gr_engine_active"] = d["tensor_active"] = 0.0
    d["sm_clock_mhz"], d["clock_event_reasons"], d["gpu_util"] = IDLE_SM_CLOCK, 1.0, 0.0
    return d


def idle_gpu(ctx: GpuContext) -> dict[str, float]:
    p = _params("idle_gpu", ctx, _draw_idle)
    if ctx.t < p["work_s"]:
        return vision_train(ctx)
    return _idle_values(ctx, p["fb"], p["power"])


def _draw_low(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    sm = r.uniform(0.16, 0.47)
    return {"sm": sm, "occ": sm * r.uniform(0.2, 0.4), "tensor": sm * r.uniform(0.1, 0.5), "fb": r.uniform(14, 60),
            "power": 120 + 500 * sm}


def low_sm_activity(ctx: GpuContext) -> dict[str, float]:
    # gpu_util reads 100% (a small kernel is always running) while SMs are mostly empty.
    p = _params("low_sm_activity", ctx, _draw_low)
    d = _base(ctx, sm=p["sm"], occ=p["occ"], tensor=p["tensor"], dram=p["sm"] * 0.5, fb_gib=p["fb"])
    d["gpu_util"] = 1.0
    return d


def _draw_notc(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    return {"sm": r.uniform(0.5, 0.9), "tensor": r.uniform(0.0, 0.02), "fp32": r.uniform(0.35, 0.7),
            "fb": r.uniform(20, 70), "power": r.uniform(380, 520)}


def no_tensor_cores(ctx: GpuContext) -> dict[str, float]:
    # FP32 matmuls (no autocast, TF32 off): SMs busy, tensor pipes idle.
    p = _params("no_tensor_cores", ctx, _draw_notc)
    return _base(ctx, sm=p["sm"], occ=0.5, tensor=p["tensor"], dram=0.4, fb_gib=p["fb"],
                 fp32=p["fp32"])


def _draw_stall(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    period = r.uniform(6, 40)
    return {"period": period, "busy": period * r.uniform(0.3, 0.72), "phase": r.uniform(0, period),
            "sm": r.uniform(0.82, 0.96), "tensor": r.uniform(0.3, 0.6), "fb": r.uniform(20, 60)}


def input_stall(ctx: GpuContext) -> dict[str, float]:
    # The GPU alternates: a burst of compute, then a wait for the next batch from the host.
    # Data-parallel ranks wait together (same phase); the counters average over the interval.
    p = _params("input_stall", ctx, _draw_stall)
    share = _busy_overlap(ctx.t, ctx.interval_s, p["period"], p["busy"], p["phase"])
    sm = 0.02 + (p["sm"] - 0.02) * share
    return _base(ctx, sm=sm, occ=0.5 * share, tensor=p["tensor"] * share, dram=0.5 * share + 0.01, fb_gib=p["fb"],
                 pcie_rx=2e8 + 6e9 * share)


def _draw_comm(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    sm = r.uniform(0.22, 0.52)
    return {"sm": sm, "tensor": sm * r.uniform(0.3, 0.6), "ib": r.uniform(0.68, 0.97) * IB_BW,
            "nvl": r.uniform(0.62, 0.9) * NVLINK_BW, "fb": r.uniform(50, 76)}


def comm_bound(ctx: GpuContext) -> dict[str, float]:
    # Network saturated (IB across nodes, NVLink within one), SMs waiting on collectives.
    p = _params("comm_bound", ctx, _draw_comm)
    return _base(ctx, sm=p["sm"], occ=0.15, tensor=p["tensor"], dram=0.2, fb_gib=p["fb"],
                 nvlink=p["nvl"], ib=p["ib"] if ctx.n_nodes > 1 else 0.0)


def _draw_strag(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    node_level = ctx.n_nodes > 1 and r.random() < 0.5
    cause = r.choice(["thermal", "thermal", "power_brake", "host"])  # host: CPU contention, clocks normal
    speed = r.uniform(0.55, 0.9)  # the straggler's speed relative to its peers
    return {"node_level": node_level, "slow_node": r.randrange(max(1, ctx.n_nodes)),
            "slow_rank": r.randrange(ctx.n_gpus), "cause": cause, "speed": speed,
            "sm": r.uniform(0.85, 0.97), "tensor": r.uniform(0.35, 0.6), "fb": r.uniform(50, 76),
            "hot": r.uniform(THERMAL_SLOWDOWN_C + 1.0, THERMAL_SLOWDOWN_C + 5.0)}


def straggler(ctx: GpuContext) -> dict[str, float]:
    # One GPU (or one node) is slow; every step waits for it, so its peers idle at barriers.
    p = _params("straggler", ctx, _draw_strag)
    slow = (ctx.node_rank == p["slow_node"]) if p["node_level"] else (ctx.rank == p["slow_rank"])
    if slow:
        clock, reasons, temp = MAX_SM_CLOCK, 0, None
        if p["cause"] == "thermal":  # hotter than its peers: that is why its clock is down
            clock, reasons, temp = MAX_SM_CLOCK * p["speed"], 0x40 | 0x8, p["hot"]
        elif p["cause"] == "power_brake":
            clock, reasons = MAX_SM_CLOCK * p["speed"], 0x80 | 0x4
        return _base(ctx, sm=p["sm"], occ=0.45, tensor=p["tensor"], dram=0.5, fb_gib=p["fb"],
                     nvlink=6e10, ib=1.5e10 if ctx.n_nodes > 1 else 0.0, clock=clock, reasons=reasons, temp=temp)
    k = p["speed"]
    return _base(ctx, sm=p["sm"] * k, occ=0.45 * k, tensor=p["tensor"] * k, dram=0.5 * k, fb_gib=p["fb"],
                 nvlink=6e10, ib=1.5e10 if ctx.n_nodes > 1 else 0.0)


def _draw_mem(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    return {"sm": r.uniform(0.03, 0.17), "fb": r.uniform(0.8, 8.5), "power": r.uniform(90, 160)}


def memory_underuse(ctx: GpuContext) -> dict[str, float]:
    # A small model / small batch on an 80 GB GPU: a MIG slice would do.
    p = _params("memory_underuse", ctx, _draw_mem)
    return _base(ctx, sm=p["sm"], occ=0.05, tensor=p["sm"] * 0.3, dram=p["sm"] * 0.5, fb_gib=p["fb"],
                 sd=0.02)


def _draw_thr(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    # Thermal slowdown (and a bare HW slowdown, which the board's sensors assert) happens above the
    # slowdown temperature: those GPUs run hotter than any unthrottled peer. A power brake lowers
    # the board's limit: its GPUs draw what the braked clock allows, at normal temperatures.
    return {"clock": r.uniform(880, 1660), "reasons": r.choice([0x4 | 0x80, 0x40 | 0x8, 0x20, 0x8]),
            "sm": r.uniform(0.8, 0.95), "tensor": r.uniform(0.3, 0.6), "fb": r.uniform(30, 76),
            "hot": r.uniform(THERMAL_SLOWDOWN_C + 1.0, THERMAL_SLOWDOWN_C + 5.0)}


def throttled(ctx: GpuContext) -> dict[str, float]:
    # Every GPU of the job held down (rack power brake, hot aisle, low power cap).
    p = _params("throttled", ctx, _draw_thr)
    return _base(ctx, sm=p["sm"], occ=0.45, tensor=p["tensor"], dram=0.5, fb_gib=p["fb"],
                 clock=p["clock"], reasons=p["reasons"], temp=None if p["reasons"] & 0x80 else p["hot"])


def _draw_over(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    return {"used": r.randint(1, max(1, ctx.n_gpus // 2))}


def oversized_allocation(ctx: GpuContext) -> dict[str, float]:
    # Asked for N GPUs, the code uses a few (a forgotten torchrun / CUDA_VISIBLE_DEVICES).
    p = _params("oversized_allocation", ctx, _draw_over)
    if ctx.rank < p["used"]:
        return vision_train(ctx)
    return _idle_values(ctx, 0.5, 70.0)


def _draw_fault(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    return {"rank": r.randrange(ctx.n_gpus), "at": r.uniform(120, 1500),
            "kind": r.choice(["dbe", "row_remap", "nvlink", "contained_ecc"])}


def hw_fault(ctx: GpuContext) -> dict[str, float]:
    # A healthy training job on a GPU that develops a hardware fault (and keeps running:
    # contained errors / link retraining, so the fault is the only finding).
    d = llm_pretrain(ctx)
    p = _params("hw_fault", ctx, _draw_fault)
    if ctx.rank == p["rank"] and ctx.t >= p["at"]:
        if p["kind"] == "dbe":
            d["xid_last"], d["ecc_dbe_volatile"] = 48.0, 2.0
        elif p["kind"] == "row_remap":
            d["xid_last"], d["row_remap_failure"] = 64.0, 1.0
        elif p["kind"] == "nvlink":
            d["xid_last"] = 74.0
            d["nvlink_error_count"] = float(100 + int((ctx.t - p["at"]) * 3))
        else:
            d["xid_last"], d["ecc_dbe_volatile"] = 94.0, 1.0
    return d


def _draw_hung(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    # NCCL's spinning kernel holds a few SMs of 132 (1-3%); a kernel spinning on a flag more.
    at, spin = r.uniform(300, 1500), r.choice([r.uniform(0.008, 0.03), r.uniform(0.03, 0.15)])
    r.uniform(95, 150)  # was a hung power the LLM draw overwrote (683 W at SM 13%); kept: the draws after it stay
    return {**_draw_llm(r, ctx), "at": at, "spin_sm": spin}


def hung(ctx: GpuContext) -> dict[str, float]:
    # A training job stuck in a collective (a peer died, a NCCL timeout set to hours): every rank
    # keeps its kernel resident (NVML utilisation 100%), the SM activity is pinned at what the
    # spin loop occupies, no tensor, DRAM or link traffic moves, clocks stay up, power flat.
    p = _params("hung", ctx, _draw_hung)
    if ctx.t < p["at"]:
        return llm_pretrain(ctx)
    d = _base(ctx, sm=p["spin_sm"], occ=0.02, tensor=0.0, dram=0.0, fb_gib=p["fb"], fp32=0.0,
              fp16=0.0, pcie_rx=2e4, pcie_tx=2e4, sd=0.001)
    d["sm_active"] = d["gr_engine_active"] = max(0.004, p["spin_sm"] + ctx.rng.gauss(0, 0.001))
    d["tensor_active"] = d["dram_active"] = d["mem_copy_util"] = 0.0
    d["gpu_util"], d["sm_clock_mhz"], d["clock_event_reasons"] = 1.0, p["clock"], 0.0
    # The spin loop at full clock: a little above idle, flat (no tensor, DRAM or link work).
    d["power_w"] = busy_power_w(d["sm_active"], 0.0, 0.0, p["clock"]) + ctx.rng.gauss(0, 1.5)
    return _background(ctx, d, p)


def _draw_pipe(r: random.Random, ctx: GpuContext) -> dict[str, Any]:
    # Pipeline parallel over the node's GPUs (stages x tensor-parallel pairs): a 1F1B schedule
    # with m micro-batches runs at the pace of its heaviest stage, the others idle in the bubble.
    # The middle stages hold equal transformer layers; the last adds the LM head and the loss
    # (a large vocabulary makes it 15-50% heavier), the first only the embedding.
    stages = 4 if ctx.n_gpus >= 4 else 2
    load = [r.uniform(0.95, 1.0), *[1.0 + r.gauss(0, 0.01) for _ in range(stages - 2)], r.uniform(1.15, 1.5)]
    load = [x / max(load) for x in load]
    return {"stages": stages, "load": load, "micro": r.choice([16, 24, 32]), "sm": r.uniform(0.88, 0.97),
            "tensor": r.uniform(0.35, 0.6), "fb": r.uniform(50, 76), **_healthy_extras(r, ctx)}


def pipeline_imbalance(ctx: GpuContext) -> dict[str, float]:
    p = _params("pipeline_imbalance", ctx, _draw_pipe)
    n, m = p["stages"], p["micro"]
    stage = min(n - 1, ctx.rank * n // max(1, ctx.n_gpus))
    busy = m * p["load"][stage] / (m + n - 1)  # share of the step this stage computes
    k = busy * _step_dip(ctx, p)
    d = _base(ctx, sm=p["sm"] * k, occ=0.45 * k, tensor=p["tensor"] * k, dram=0.5 * k, fb_gib=p["fb"],
              nvlink=2e10)
    return _background(ctx, d, p)


def _fabric_job(name: str) -> ProfileFn:
    """Data-parallel training over InfiniBand whose collectives slow down in the job's fabric
    episodes (agent/sim_faults.py): the SMs wait out the longer all-reduces, the NICs move less."""

    def fn(ctx: GpuContext) -> dict[str, float]:
        p = _params(name, ctx, _draw_dp)
        f = fabric_fault(name, ctx.job_seed, ctx.n_nodes, ctx.gpus_per_node).busbw_factor(ctx.t)
        comm = 0.15 + 0.15 * (ctx.job_seed % 7) / 6  # share of a step spent in exposed communication
        k = 1.0 / (1.0 + comm * (1.0 / f - 1.0))
        d = _base(ctx, sm=p["sm"] * _step_dip(ctx, p) * k, occ=p["occ"], tensor=p["tensor"], dram=p["dram"],
                  fb_gib=p["fb"], nvlink=p["nvl"], ib=p["ib"] * k if ctx.n_nodes > 1 else 0.0)
        return _background(ctx, d, p)

    fn.__name__ = name
    return fn


def _progress_job(name: str) -> ProfileFn:
    """A training job whose GPUs follow its progress story: idle while its process starts, loads
    or saves a checkpoint or is down, training otherwise at the pace of its step time."""

    def fn(ctx: GpuContext) -> dict[str, float]:
        p = _params(name, ctx, _draw_llm)
        st = story(name, ctx.job_seed)
        phase = st.phase(ctx.t)
        if phase == "down":
            d = _idle_values(ctx, 0.0, 68.0)
            d["fb_used_bytes"] = 0.0
            return d
        if phase in ("init", "compile", "checkpoint_load"):
            d = _idle_values(ctx, 2.0 if phase == "init" else p["fb"] * 0.6, 75.0)
            if phase == "checkpoint_load":
                d["pcie_rx_bytes_s"] = ctx.rng.uniform(2e9, 6e9)
            return d
        if phase == "checkpoint_save":
            d = _base(ctx, sm=0.03, occ=0.02, tensor=0.0, dram=0.05, fb_gib=p["fb"], pcie_tx=4e9)
            return _background(ctx, d, p)
        k = st.step_s / st.step_time(ctx.t, ctx.rank)  # a slower step: the GPU waits longer for its input
        d = _base(ctx, sm=p["sm"] * k * (1.0 - p["dip"] * ctx.rng.random()), occ=p["occ"] * k, tensor=p["tensor"] * k,
                  dram=p["dram"] * k, fb_gib=p["fb"], nvlink=p["nvl"] if ctx.n_gpus > 1 else 0.0,
                  fp16=0.05)
        return _background(ctx, d, p)

    fn.__name__ = name
    return fn


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in [
        Profile("llm_pretrain", frozenset(), llm_pretrain, healthy=True, min_gpus=8, max_gpus=32, multi_node=True,
                nccl=True),
        Profile("vision_train", frozenset(), vision_train, healthy=True),
        Profile("batch_inference", frozenset(), batch_inference, healthy=True, max_gpus=4),
        Profile("multinode_dp", frozenset(), multinode_dp, healthy=True, min_gpus=16, multi_node=True, max_gpus=32,
                nccl=True),
        Profile("hpc_fp64", frozenset(), hpc_fp64, healthy=True, max_gpus=4),
        Profile("idle_gpu", frozenset({"idle_gpu"}), idle_gpu, max_gpus=4),
        Profile("low_sm_activity", frozenset({"low_sm_activity"}), low_sm_activity, max_gpus=4),
        Profile("no_tensor_cores", frozenset({"no_tensor_cores"}), no_tensor_cores, max_gpus=8),
        Profile("input_stall", frozenset({"input_stall"}), input_stall, max_gpus=8),
        Profile("comm_bound", frozenset({"comm_bound"}), comm_bound, min_gpus=16, multi_node=True, max_gpus=32),
        Profile("straggler", frozenset({"straggler"}), straggler, min_gpus=8, multi_node=True, max_gpus=24),
        Profile("memory_underuse", frozenset({"memory_underuse"}), memory_underuse, max_gpus=2),
        Profile("throttled", frozenset({"throttled"}), throttled, max_gpus=8),
        Profile("oversized_allocation", frozenset({"oversized_allocation"}), oversized_allocation, min_gpus=4),
        Profile("hw_fault", frozenset({"hw_fault"}), hw_fault, min_gpus=8),
        Profile("hung", frozenset({"hung"}), hung, min_gpus=8),
        Profile("pipeline_imbalance", frozenset({"pipeline_imbalance"}), pipeline_imbalance, min_gpus=8),
        *(Profile(k, frozenset(), _fabric_job(k), min_gpus=16, multi_node=True, max_gpus=16, nccl=True,
                  fabric_flags=frozenset({k, "collective_slow"} if k == "network_degraded" else {k}))
          for k in ("collective_slow", "network_degraded", "link_errors")),
        *(Profile(k, frozenset(), _progress_job(k), min_gpus=4, max_gpus=4, progress_flags=frozenset({k}))
          for k in STORIES),
    ]
}


# What a job looks like on a real cluster. A job's name and labels never say which profile it
# runs (a demo whose "idle_gpu" job gets the idle_gpu flag proves nothing): each profile draws
# from names a healthy job could carry too, and the labels are the usual team/framework tags.
JOB_NAMES: dict[str, tuple[str, ...]] = {
    "llm_pretrain": ("llama3-70b-pretrain", "mixtral-8x7b-pt", "gpt-neox-20b-pt"),
    "vision_train": ("resnet50-dali", "vit-l16-imagenet", "efficientnet-b7-ft"),
    "batch_inference": ("vllm-serve-70b", "whisper-large-batch", "clip-embed-laion"),
    "multinode_dp": ("llama3-8b-pretrain", "bert-large-mlm-dp", "t5-xl-pretrain"),
    "hpc_fp64": ("lammps-md-water", "gromacs-stmv", "openfoam-les"),
    "idle_gpu": ("jupyter-dev", "llama3-8b-eval", "sd-xl-debug"),
    "low_sm_activity": ("rl-ppo-atari", "gnn-ogbn-products", "recsys-dlrm-small"),
    "no_tensor_cores": ("bert-large-ft", "unet-segmentation", "wav2vec2-ft"),
    "input_stall": ("resnet152-s3", "yolov8-coco", "vit-b16-webdataset"),
    "comm_bound": ("llama3-405b-fsdp", "mixtral-8x22b-moe", "gpt3-175b-tp"),
    "straggler": ("llama3-8b-sft", "mistral-7b-sft", "qwen2-7b-dpo"),
    "memory_underuse": ("distilbert-ft", "xgboost-hpo-sweep", "tabnet-sweep"),
    "throttled": ("sdxl-finetune", "llama2-13b-lora", "detr-coco"),
    "oversized_allocation": ("codegen-6b-ft", "opt-1.3b-ft", "gpt2-medium-ft"),
    "hw_fault": ("llama3-70b-dpo", "falcon-40b-sft", "mpt-30b-pt"),
    "hung": ("llama3-8b-sft", "gemma2-27b-pt", "phi3-medium-sft"),
    "pipeline_imbalance": ("gpt-neox-20b-pp", "bloom-7b-pp", "llama2-34b-pp"),
    "collective_slow": ("llama3-8b-pretrain", "olmo-7b-pt", "pythia-12b-pt"),
    "network_degraded": ("mistral-7b-pt", "llama3-70b-cpt", "starcoder2-15b-pt"),
    "link_errors": ("t5-xl-pretrain", "bert-large-mlm-dp", "deberta-v3-pt"),
    "step_time_regression": ("llama3-8b-sft", "qwen2-7b-dpo", "mistral-7b-sft"),
    "slow_rank": ("whisper-large-batch", "clip-embed-laion", "llama3-8b-eval"),
    "restart_lost_progress": ("mixtral-8x7b-ft", "gemma2-9b-sft", "phi3-mini-pt"),
    "checkpoint_overhead": ("llama2-13b-lora", "codegen-6b-ft", "opt-1.3b-ft"),
    "startup_overhead": ("sdxl-finetune", "vit-l16-imagenet", "dit-xl-train"),
}
TEAMS = ("llm-core", "vision", "inference", "science", "recsys", "speech")
FRAMEWORKS = ("pytorch", "jax", "deepspeed", "megatron")


def _pick(options: tuple[str, ...], job_id: str, salt: str) -> str:
    return options[int(hashlib.sha1(f"{salt}/{job_id}".encode()).hexdigest()[:8], 16) % len(options)]


# PCIe topology of a DGX/HGX H100 node: each GPU shares a PCIe switch with its own NIC (its rail),
# the first four switches on CPU socket 0, the rest on socket 1. agent/sim_fabric.py lays the same
# tree under the node's fake /sys, so the agent's InfiniBand sampler maps each NIC to its one GPU.
MAX_PCI_GPUS = 14  # buses below 0x100 in one PCI domain; a node with more GPUs gets no topology


def _gpu_bus(index: int) -> int:
    return 0x10 * (index + 1) + 4


def gpu_pci_bus_id(index: int) -> str:
    """GPU ``index``'s PCI address ("0000:14:00.0"), "" past MAX_PCI_GPUS."""
    return f"0000:{_gpu_bus(index):02x}:00.0" if index < MAX_PCI_GPUS else ""


def pci_device_path(index: int, nic: bool = False) -> str:
    """Where GPU ``index`` (or its rail NIC) sits under /sys/devices: root complex (one per CPU
    socket) / root port / switch upstream port / switch downstream port / device."""
    b = _gpu_bus(index)
    rc = "00" if index < 4 else "80"
    down = f"0000:{b - 1:02x}:0{int(nic)}.0"
    dev = f"0000:{b + int(nic):02x}:00.0"
    return f"pci0000:{rc}/0000:{rc}:{index + 1:02x}.0/0000:{b - 2:02x}:00.0/{down}/{dev}"


def gpu_uuid(node: str, index: int) -> str:
    h = hashlib.sha1(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _job_seed(job_id: str) -> int:
    return int(hashlib.sha1(job_id.encode()).hexdigest()[:12], 16)


@dataclass(slots=True)
class SimJob:
    job_id: str
    profile: Profile
    user: str
    start_ts: float
    gpus: list[tuple[str, int]]  # (node, gpu index), in rank order
    name: str = ""
    account: str = "research"
    partition: str = "gpu"
    end_ts: float | None = None  # None: runs for as long as the simulator does

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(n for n, _ in self.gpus))

    @property
    def seed(self) -> int:
        return _job_seed(self.job_id)

    def info(self) -> JobInfo:
        names = JOB_NAMES.get(self.profile.name, ("train",))
        return JobInfo(job_id=self.job_id, source="simulator", user=self.user,
                       name=self.name or _pick(names, self.job_id, "name"),
                       account=self.account, partition=self.partition, num_nodes=len(self.nodes),
                       ntasks=len(self.gpus), start_ts=self.start_ts,
                       labels={"team": _pick(TEAMS, self.job_id, "team"),
                               "framework": _pick(FRAMEWORKS, self.job_id, "fw")})


@dataclass
class SimulatedFleet:
    """A fleet of ``nodes`` x ``gpus_per_node`` GPUs with jobs placed on them at start.

    About 1 in 8 GPUs is left unallocated (a real fleet is never full). Healthy and
    inefficient profiles are mixed, roughly 60/40, deterministically from ``seed``."""

    nodes: int = 16
    gpus_per_node: int = 8
    seed: int = 0
    start_ts: float = 0.0
    node_prefix: str = "sim-node"
    jobs: list[SimJob] = field(default_factory=list)
    # The agent's --node: one simulated node takes it as is, several are <node>-000, -001, ...
    # Without it every simulated agent would be sim-node-NNN and two of them would clash (409).
    node_name: str | None = None

    def __post_init__(self) -> None:
        if not self.jobs:
            self.jobs = place_jobs(self.node_names(), self.gpus_per_node, self.seed, self.start_ts)

    def node_names(self) -> list[str]:
        if self.node_name:
            if self.nodes == 1:
                return [self.node_name]
            return [f"{self.node_name}-{i:03d}" for i in range(self.nodes)]
        return [f"{self.node_prefix}-{i:03d}" for i in range(self.nodes)]

    def source(self, node: str) -> SimulatedSource:
        return SimulatedSource(node=node, gpus_per_node=self.gpus_per_node, jobs=self.jobs, seed=self.seed)


def place_jobs(nodes: list[str], gpus_per_node: int, seed: int, start_ts: float) -> list[SimJob]:
    rng = random.Random(seed)
    healthy = [p for p in PROFILES.values() if p.healthy]
    sick = [p for p in PROFILES.values() if not p.healthy]
    small_healthy = [PROFILES["vision_train"], PROFILES["batch_inference"]]
    jobs: list[SimJob] = []
    users = ["alice", "bob", "chen", "dana", "eve", "farid", "gita", "hiro"]
    jid = 100000 + rng.randrange(1000)
    # A fleet of demo size (gpufleet up simulates 16 nodes) runs every inefficient profile at
    # least once, so the demo shows every flag the engine can raise; smaller fleets (tests,
    # single-node agents) keep the plain 60/40 draw.
    # Those jobs also started before the replayed history (>= 45 min ago) and multi-node
    # profiles span two nodes at least, so each has the evidence its flag needs at start.
    must = sorted(sick, key=lambda q: random.Random(f"{seed}/{q.name}").random()) if len(nodes) >= 12 else []

    def nodes_for(q: Profile) -> int:
        return max(2, -(-q.min_gpus // gpus_per_node)) if q.multi_node else 1

    i = 0
    while i < len(nodes):
        covering = bool(must) and len(nodes) - i <= sum(nodes_for(q) for q in must)
        if covering:
            p = must.pop()
        else:
            p = rng.choice(healthy) if rng.random() < 0.6 else rng.choice(sick)
            if must and not p.healthy:
                p, covering = must.pop(), True
        need_nodes = nodes_for(p) if covering else max(1, -(-p.min_gpus // gpus_per_node))
        if p.multi_node and need_nodes >= 2 and i + need_nodes <= len(nodes):
            n_nodes = need_nodes
            gpus = [(nodes[i + k], g) for k in range(n_nodes) for g in range(gpus_per_node)]
            i += n_nodes
        else:
            i += 1
            node = nodes[i - 1]
            if _whole_node(p, gpus_per_node):
                gpus = [(node, g) for g in range(gpus_per_node)]
            else:
                # Split the node between a job of this profile, a healthy 2-GPU job,
                # and leave the rest unallocated.
                n = _share_of_node(p, gpus_per_node)
                gpus = [(node, g) for g in range(n)]
                # The rest of the node: another profile still to cover when one fits (the demo
                # fleet stays small), else a healthy 2-GPU job; what remains is unallocated.
                fits = [k for k, q in enumerate(must)
                        if covering and _share_of_node(q, gpus_per_node) + n <= gpus_per_node
                        and nodes_for(q) == 1 and not _whole_node(q, gpus_per_node)]
                if fits:
                    q = must.pop(fits[-1])
                    m = _share_of_node(q, gpus_per_node)
                    jid += 1
                    jobs.append(SimJob(f"{jid}", q, rng.choice(users), start_ts - _age(q, rng, True),
                                       [(node, n + g) for g in range(m)]))
                elif gpus_per_node >= n + 2:
                    jid += 1
                    jobs.append(SimJob(f"{jid}", rng.choice(small_healthy), rng.choice(users),
                                       start_ts - rng.uniform(60, 7200), [(node, n), (node, n + 1)]))
        jid += 1
        jobs.append(SimJob(f"{jid}", p, rng.choice(users), start_ts - _age(p, rng, covering), gpus))
        if covering:
            _in_episode_at_start(jobs[-1], start_ts, gpus_per_node)
    return jobs


EPISODE_AT_START_S = 150.0


def _in_episode_at_start(job: SimJob, start_ts: float, gpus_per_node: int) -> None:
    """A job covering a fabric fault that comes and goes starts earlier (by less than one period)
    so that the fleet starts EPISODE_AT_START_S into an episode: the first analysis pass, a minute
    or two later, finds it under way for longer than its kind's 3 minutes (an open flag), with the
    healthy gap before it in the replayed history as the baseline."""
    f = fabric_fault(job.profile.name, job.seed, len(job.nodes), gpus_per_node)
    if f.period_s <= 0:
        return
    age = start_ts - job.start_ts
    job.start_ts -= (EPISODE_AT_START_S - f.phase_s - age) % f.period_s  # now (age + phase) % period == 150 s


def _whole_node(p: Profile, gpus_per_node: int) -> bool:
    return p.min_gpus >= gpus_per_node or (p.max_gpus >= gpus_per_node and p.min_gpus > 4)


def _share_of_node(p: Profile, gpus_per_node: int) -> int:
    return max(p.min_gpus, min(4, gpus_per_node, p.max_gpus))


def _age(p: Profile, rng: random.Random, covering: bool) -> float:
    """Seconds the job has run at the fleet's start. A job covering a profile started before
    the replayed history (>= 45 min), so its flag has the evidence it needs at start; one with a
    progress story started inside it (30-35 min: a crash comes 15-25 min in, its restart up to 3
    min later), so its whole story, startup included, is seen."""
    age = rng.uniform(60, 7200)
    if not covering:
        return age
    return 1800.0 + age % 300.0 if p.progress_flags else 2700.0 + age % 3600.0


def sample_job(job: SimJob, now: float, rng: random.Random, *, interval_s: float = 1.0,
               gpus_per_node: int = 8) -> list[dict[str, float]]:
    """One sample per GPU of ``job`` (rank order) at time ``now``."""
    nodes = job.nodes
    out = []
    seed = job.seed
    for rank, (node, _) in enumerate(job.gpus):
        ctx = GpuContext(t=max(0.0, now - job.start_ts), rank=rank, n_gpus=len(job.gpus),
                         node_rank=nodes.index(node), n_nodes=len(nodes), rng=rng, job_seed=seed,
                         interval_s=interval_s, gpus_per_node=gpus_per_node)
        out.append(job.profile.fn(ctx))
    return out


class SimulatedSource:
    """One simulated node, exposed through the ``Source`` interface."""

    name = "simulator"

    def __init__(self, node: str, gpus_per_node: int, jobs: list[SimJob], seed: int = 0,
                 model: str = H100, interval_s: float = 1.0) -> None:
        self.node = node
        self.gpus_per_node = gpus_per_node
        self.model = model
        self.interval_s = interval_s
        self._rng = random.Random(f"{seed}/{node}")
        self._jobs = [j for j in jobs if node in j.nodes]
        self._slot: dict[int, tuple[SimJob, int, int]] = {}  # gpu index -> (job, rank, node rank)
        for j in self._jobs:
            nodes = j.nodes
            for rank, (n, g) in enumerate(j.gpus):
                if n == node:
                    self._slot[g] = (j, rank, nodes.index(n))
        self._fired: dict[str, float] = {}
        self._pending: list[Event] = []

    @property
    def jobs(self) -> list[SimJob]:
        """The jobs placed on this node (gpufleet up sizes each node's replayed past by them)."""
        return self._jobs

    def pci_bus_ids(self) -> dict[str, str]:
        """GPU uuid -> PCI address (the agent maps InfiniBand HCAs to GPUs by it)."""
        return {gpu_uuid(self.node, i): gpu_pci_bus_id(i) for i in range(min(self.gpus_per_node, MAX_PCI_GPUS))}

    def devices(self) -> list[GpuInfo]:
        return [GpuInfo(index=i, uuid=gpu_uuid(self.node, i), model=self.model,
                        memory_total_bytes=float(H100_MEM)) for i in range(self.gpus_per_node)]

    def _running(self, now: float) -> dict[int, tuple[SimJob, int, int]]:
        return {i: s for i, s in self._slot.items()
                if s[0].start_ts <= now and (s[0].end_ts is None or now < s[0].end_ts)}

    def read(self, now: float) -> list[GpuReading]:
        out = []
        running = self._running(now)
        for i in range(self.gpus_per_node):
            uuid = gpu_uuid(self.node, i)
            slot = running.get(i)
            if slot is None:
                ctx = GpuContext(t=now, rank=0, n_gpus=1, node_rank=0, n_nodes=1, rng=self._rng)
                values = _idle_values(ctx, 0.0, 68.0)
                values["fb_used_bytes"] = 0.0
            else:
                job, rank, node_rank = slot
                ctx = GpuContext(t=max(0.0, now - job.start_ts), rank=rank, n_gpus=len(job.gpus),
                                 node_rank=node_rank, n_nodes=len(job.nodes), rng=self._rng, job_seed=job.seed,
                                 interval_s=self.interval_s, gpus_per_node=self.gpus_per_node)
                values = job.profile.fn(ctx)
                xid = values.get("xid_last")
                if xid and self._fired.get(uuid) != xid:
                    self._fired[uuid] = xid
                    self._pending.append(Event(ts=now, kind="xid", gpu_uuid=uuid, code=int(xid),
                                               message="simulated XID"))
            values["energy_j"] = now * 100.0 % 1e12
            out.append(GpuReading(uuid=uuid, values=values))
        return out

    def drain_events(self) -> list[Event]:
        ev, self._pending = self._pending, []
        return ev

    def attribution(self, now: float) -> SourceAttribution:
        a = SourceAttribution()
        for i, (job, _, _) in self._running(now).items():
            a.jobs[job.job_id] = job.info()
            a.gpu_job[gpu_uuid(self.node, i)] = job.job_id
        return a

    def close(self) -> None:
        pass


# --- history generators (bench, tests, demos) ----------------------------------------------

def make_job(profile: str | Profile, job_id: str, n_gpus: int, start_ts: float, duration_s: float, *,
             gpus_per_node: int = 8, node_prefix: str = "hist", user: str = "alice") -> SimJob:
    """A job of ``n_gpus`` packed onto nodes of ``gpus_per_node`` (its own nodes)."""
    p = PROFILES[profile] if isinstance(profile, str) else profile
    gpus = [(f"{node_prefix}-{job_id}-{r // gpus_per_node}", r % gpus_per_node) for r in range(n_gpus)]
    return SimJob(job_id, p, user, start_ts, gpus, end_ts=start_ts + duration_s)


def job_rows(job: SimJob, *, interval_s: float = 1.0, seed: int = 0, cluster: str | None = None,
             gpus_per_node: int = 8) -> Iterator[dict[str, Any]]:
    """The job's samples as NDJSON-shaped rows: {"ts", "node", "gpu", "job", "user",
    "cluster", <catalog field>: value...}, in time order."""
    rng = random.Random(f"{seed}/{job.job_id}")
    end = job.end_ts if job.end_ts is not None else job.start_ts + 3600.0
    steps = int((end - job.start_ts) / interval_s)
    for s in range(1, steps + 1):
        now = job.start_ts + s * interval_s
        for (node, idx), values in zip(job.gpus, sample_job(job, now, rng, interval_s=interval_s,
                                                             gpus_per_node=gpus_per_node), strict=True):
            yield {"ts": round(now, 3), "node": node, "gpu": idx, "job": job.job_id, "user": job.user,
                   "cluster": cluster, **values}


def write_ndjson_history(out: IO[str], jobs: list[SimJob], *, interval_s: float = 1.0, seed: int = 0,
                         cluster: str | None = None) -> int:
    """Write the jobs' samples as NDJSON (the ``gpufleet import`` format). Returns lines written."""
    n = 0
    for job in jobs:
        for row in job_rows(job, interval_s=interval_s, seed=seed, cluster=cluster):
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
            n += 1
    return n

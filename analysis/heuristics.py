"""The goodput heuristics: one job's window views -> flag findings (pure numpy).

Each detector returns the per-window mask it judged, the per-GPU waste it claims in those
windows (fraction of GPU time lost, 0..1) and the evidence. ``detect`` (windows.py) turns a
mask into episodes, so thresholds and minimum durations come from one config file.

Kinds are mutually explanatory, not independent: a job whose low SM activity is explained by
a more specific cause (input stall, communication, a straggler, a tiny workload on a big GPU)
gets the specific flag, not also the generic ``low_sm_activity``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import ModelLimits, Thresholds
from .windows import Detection, Windows, detect, episode_mask, masked_median, share

SUGGESTIONS = {
    "idle_gpu": "GPUs allocated but idle: end the job (or its interactive session) or release the GPUs with a "
                "shorter --time",
    "oversized_allocation": "some allocated GPUs do no work: request only the GPUs the code uses, or launch one "
                            "rank per GPU (torchrun --nproc_per_node, check CUDA_VISIBLE_DEVICES)",
    "low_sm_activity": "SMs mostly empty: raise the batch size, fuse small kernels (torch.compile) or use CUDA "
                       "graphs to cut launch overhead",
    "memory_underuse": "tiny workload on a big GPU: run it on a MIG slice or a smaller GPU, or pack several "
                       "runs onto this one",
    "no_tensor_cores": "matmuls run without tensor cores: enable bf16 autocast "
                       "(torch.autocast('cuda', dtype=torch.bfloat16)) or TF32 "
                       "(torch.backends.cuda.matmul.allow_tf32 = True)",
    "input_stall": "GPU waits on input: raise DataLoader num_workers, set pin_memory=True and prefetch_factor, "
                   "or move decoding/augmentation to the GPU (DALI)",
    "comm_bound": "communication-bound: overlap gradients with compute (DDP bucket_cap_mb, FSDP prefetch), "
                  "use gradient accumulation or fewer, fuller nodes",
    "straggler": "one GPU/node slows every step: drain or check the slow node (clocks, cooling, power, host "
                 "CPU contention) and restart on healthy nodes",
    "throttled": "clocks held down by power or thermal limits: check the power cap (nvidia-smi -q -d PERFORMANCE), "
                 "cooling and rack power with the cluster admins",
    "hw_fault": "hardware fault on this node: drain it (scontrol update state=drain), open a ticket, and "
                "resubmit the job from its last checkpoint elsewhere",
}


@dataclass
class Finding:
    kind: str
    scope: str  # "" = the whole job, else a node name or GPU uuid
    severity: str
    start_ts: float
    end_ts: float
    ongoing: bool
    wasted_gpu_hours: float
    evidence: dict[str, Any]
    suggestion: str
    claim: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0)))  # (G, K) waste fraction


@dataclass(frozen=True)
class JobContext:
    """What the heuristics know about the job besides its samples."""

    gpu_uuids: list[str]
    gpu_nodes: list[str]
    model: str | None
    limits: ModelLimits
    first_ts: float
    last_ts: float


def _r(x: Any, nd: int = 3) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if not np.isfinite(v) else round(v, nd)


class Detector:
    """Builds findings from masks; holds the shared window views."""

    def __init__(self, w: Windows, ctx: JobContext, th: Thresholds) -> None:
        self.w = w
        self.ctx = ctx
        self.th = th
        self.window_s = w.w_min * 60.0
        self.valid_k = w.valid.any(axis=0)
        f = w.f
        g = th.raw["general"]
        self.idle = w.valid & (np.nan_to_num(f["sm"], nan=0.0) < g["idle_sm_active"]) & (
            np.nan_to_num(f["busy_frac"], nan=0.0) <= g["idle_busy_frac"])
        self.active = w.valid & ~self.idle
        self.n_active = self.active.sum(axis=0)
        self.findings: list[Finding] = []

    def _finding(self, kind: str, det: Detection, claim: np.ndarray, evidence: dict[str, Any],
                 scope: str = "") -> Finding:
        w, cfg = self.w, self.th.kind(kind)
        em = episode_mask(det, w.k)
        claim = np.where(em[None, :] & w.valid, np.clip(np.nan_to_num(claim), 0.0, 1.0), 0.0)
        wasted = float((claim * w.obs_s).sum() / 3600.0)
        start = max(self.ctx.first_ts, w.t0(det.episodes[0].k0))
        end = min(self.ctx.last_ts, w.t1(det.episodes[-1].k1 - 1))
        sev = cfg.get("severity", "warning")
        longest = max(e.windows for e in det.episodes) * self.window_s
        if kind == "idle_gpu" and longest >= float(cfg.get("critical_after_s", 1e18)):
            sev = "critical"
        if wasted >= float(self.th.general("critical_wasted_gpu_hours")):
            sev = "critical"
        evidence = {**evidence, "flagged_minutes": round(det.flagged_s / 60, 1),
                    "judged_minutes": round(det.judged_s / 60, 1), "episodes": len(det.episodes),
                    "longest_episode_minutes": round(longest / 60, 1)}
        fnd = Finding(kind, scope, sev, start, end, det.ongoing, round(wasted, 4), evidence, SUGGESTIONS[kind], claim)
        self.findings.append(fnd)
        return fnd

    def _em(self, det: Detection | None) -> np.ndarray:
        return episode_mask(det, self.w.k) if det else np.zeros(self.w.k, dtype=bool)

    def _stats(self, name: str, mask_k: np.ndarray, gpus: np.ndarray | None = None) -> float | None:
        """Median over the flagged windows of the per-window GPU median (evidence numbers)."""
        x = self.w.f[name]
        m = (self.active if gpus is None else gpus) & mask_k[None, :]
        vals = masked_median(x, m)
        vals = vals[~np.isnan(vals)]
        return _r(np.median(vals)) if len(vals) else None

    # --- detectors --------------------------------------------------------------------------

    def run(self) -> list[Finding]:
        f, cfg = self.w.f, self.th.raw
        g = len(self.ctx.gpu_uuids)
        target = float(cfg["general"]["target_sm_active"])
        sm = np.nan_to_num(f["sm"])
        low_activity_claim = np.where(self.active, 1.0 - np.minimum(1.0, sm / target), 0.0)

        # idle_gpu: every GPU of the job idle (a whole job doing nothing).
        all_idle = self.valid_k & (self.n_active == 0) & (self.idle.sum(axis=0) > 0)
        det = detect(all_idle, self.valid_k, self.window_s, cfg["idle_gpu"])
        if det:
            self._finding("idle_gpu", det, self.idle.astype(float), {
                "sm_active_max": _r(np.nanmax(np.where(self.idle & episode_mask(det, self.w.k), f["sm"], np.nan))),
                "idle_gpus": int(self.idle.any(axis=1).sum()), "n_gpus": g,
                "threshold_sm_active": cfg["general"]["idle_sm_active"]})

        # oversized_allocation: some GPUs idle while their peers work.
        if g >= 2:
            idle_share = share(self.idle, self.w.valid)
            mask = self.valid_k & (self.n_active > 0) & (idle_share >= cfg["oversized_allocation"]["min_idle_share"])
            det = detect(mask, self.valid_k, self.window_s, cfg["oversized_allocation"])
            if det:
                em = episode_mask(det, self.w.k)
                idle_gpus = (self.idle & em[None, :]).sum(axis=1) >= 0.5 * em.sum()
                self._finding("oversized_allocation", det, self.idle.astype(float), {
                    "n_gpus": g, "idle_gpus": int(idle_gpus.sum()), "used_gpus": int(g - idle_gpus.sum()),
                    "idle_gpu_uuids": [u for u, i in zip(self.ctx.gpu_uuids, idle_gpus, strict=True) if i][:16],
                    "active_sm_active": self._stats("sm", em)})

        # hw_fault is found from counters (see faults()); here the activity-based detectors.
        comm_det = self._comm()
        stall_det = self._input_stall()
        mem_det = self._memory_underuse(low_activity_claim)
        strag_mask = self._straggler()
        self._throttled()
        self._no_tensor()

        # low_sm_activity: the generic diagnosis, when nothing more specific explains it.
        c = cfg["low_sm_activity"]
        med_sm = masked_median(f["sm"], self.active)
        med_busy = masked_median(f["busy_frac"], self.active)
        explained = self._em(comm_det) | self._em(stall_det) | self._em(mem_det) | strag_mask
        mask = (self.valid_k & (self.n_active > 0) & (med_sm < c["sm_active_max"])
                & ~(med_busy < c["busy_frac_min"]) & ~explained)
        det = detect(mask, self.valid_k, self.window_s, c)
        if det:
            em = episode_mask(det, self.w.k)
            self._finding("low_sm_activity", det, low_activity_claim, {
                "sm_active": self._stats("sm", em), "sm_occupancy": self._stats("occ", em),
                "gpu_util": self._stats("gpu_util", em), "threshold_sm_active": c["sm_active_max"]})
        return self.findings

    def _comm(self) -> Detection | None:
        f, c, lim = self.w.f, self.th.kind("comm_bound"), self.ctx.limits
        zero = np.zeros_like(f["sm"])
        nvl = np.fmax(f["nvl_tx"], f["nvl_rx"]) / lim.nvlink_bytes_s if lim.nvlink_bytes_s > 0 else zero
        ib = np.fmax(f["ib_tx"], f["ib_rx"]) / lim.ib_bytes_s if lim.ib_bytes_s > 0 else zero
        link = np.fmax(np.nan_to_num(nvl), np.nan_to_num(ib))
        per_gpu = self.active & (link >= c["link_util_min"]) & (np.nan_to_num(f["sm"], nan=1.0) < c["sm_active_max"])
        mask = self.valid_k & (self.n_active > 0) & (share(per_gpu, self.active) >= c["gpu_share_min"])
        det = detect(mask, self.valid_k, self.window_s, c)
        if det:
            em = episode_mask(det, self.w.k)
            target = float(self.th.general("target_sm_active"))
            claim = np.where(per_gpu, 1.0 - np.minimum(1.0, np.nan_to_num(f["sm"]) / target), 0.0)
            med = masked_median
            self._finding("comm_bound", det, claim, {
                "nvlink_util": _r(np.nanmedian(med(np.nan_to_num(nvl), self.active)[em])),
                "ib_util": _r(np.nanmedian(med(np.nan_to_num(ib), self.active)[em])),
                "sm_active": self._stats("sm", em), "threshold_link_util": c["link_util_min"],
                "link_capacity_bytes_s": {"nvlink": lim.nvlink_bytes_s, "ib": lim.ib_bytes_s}})
        return det

    def _input_stall(self) -> Detection | None:
        f, c = self.w.f, self.th.kind("input_stall")
        bf = f["busy_frac"]
        per_gpu = (self.active & (bf >= c["busy_frac_min"]) & (bf <= c["busy_frac_max"])
                   & (np.nan_to_num(f["trans_rate"]) >= c["transitions_per_min_min"])
                   & (np.nan_to_num(f["busy_sm"]) >= c["busy_sm_active_min"]))
        mask = self.valid_k & (self.n_active > 0) & (share(per_gpu, self.active) >= c["gpu_share_min"])
        det = detect(mask, self.valid_k, self.window_s, c)
        if det:
            em = episode_mask(det, self.w.k)
            claim = np.where(per_gpu, 1.0 - np.nan_to_num(bf), 0.0)
            tr = self._stats("trans_rate", em)
            self._finding("input_stall", det, claim, {
                "busy_fraction": self._stats("busy_frac", em), "sm_active_when_busy": self._stats("busy_sm", em),
                "switches_per_minute": tr, "period_s": _r(120.0 / tr, 1) if tr else None,
                "sm_active": self._stats("sm", em), "pcie_rx_note": "host->device feed is the bottleneck"})
        return det

    def _memory_underuse(self, claim: np.ndarray) -> Detection | None:
        f, c = self.w.f, self.th.kind("memory_underuse")
        med_sm = masked_median(f["sm"], self.active)
        fb = np.where(self.active, f["fb_used_max"], np.nan)
        with np.errstate(invalid="ignore"):
            fb_max = np.fmax.reduce(fb, axis=0) if fb.shape[0] else np.full(self.w.k, np.nan)
        mask = self.valid_k & (self.n_active > 0) & (med_sm < c["sm_active_max"]) & (fb_max <= c["fb_used_max_bytes"])
        det = detect(mask, self.valid_k, self.window_s, c)
        if det:
            em = episode_mask(det, self.w.k)
            total = np.nanmax(f["fb_total"]) if np.any(~np.isnan(f["fb_total"])) else None
            self._finding("memory_underuse", det, claim, {
                "fb_used_max_gib": _r(np.nanmax(fb_max[em]) / 2**30, 2), "fb_total_gib": _r((total or 0) / 2**30, 1),
                "sm_active": self._stats("sm", em), "threshold_fb_used_bytes": c["fb_used_max_bytes"],
                "threshold_sm_active": c["sm_active_max"]})
        return det

    def _no_tensor(self) -> None:
        f, c = self.w.f, self.th.kind("no_tensor_cores")
        med_t = masked_median(f["tensor"], self.active)
        med_sm = masked_median(f["sm"], self.active)
        med_fp64 = masked_median(f["fp64"], self.active)
        mask = (self.valid_k & (self.n_active > 0) & (med_t < c["tensor_active_max"]) & (med_sm >= c["sm_active_min"])
                & ~(med_fp64 >= c["fp64_active_max"]))
        det = detect(mask, self.valid_k, self.window_s, c)
        if det:
            em = episode_mask(det, self.w.k)
            claim = np.where(self.active, float(c["waste_fraction"]) * np.minimum(1.0, np.nan_to_num(f["sm"])), 0.0)
            self._finding("no_tensor_cores", det, claim, {
                "tensor_active": self._stats("tensor", em), "sm_active": self._stats("sm", em),
                "fp32_active": self._stats("fp32", em), "fp64_active": self._stats("fp64", em),
                "threshold_tensor_active": c["tensor_active_max"]})

    def _throttled(self) -> None:
        f, c, lim = self.w.f, self.th.kind("throttled"), self.ctx.limits
        ratio = f["clock_busy"] / lim.max_sm_clock_mhz
        per_gpu = self.active & (np.nan_to_num(ratio, nan=1.0) < c["clock_ratio_max"]) & (
            np.nan_to_num(f["throttle_frac"]) >= c["throttle_frac_min"])
        min_peers = int(self.th.kind("straggler")["min_gpus"])
        sh = share(per_gpu, self.active)
        # Few GPUs: no peers to compare, any throttled GPU is the job's problem.
        job_wide = np.where(self.n_active < min_peers, sh > 0, sh >= c["gpu_share_min"])
        mask = self.valid_k & (self.n_active > 0) & job_wide
        det = detect(mask, self.valid_k, self.window_s, c)
        if det:
            em = episode_mask(det, self.w.k)
            claim = np.where(per_gpu, 1.0 - np.minimum(1.0, np.nan_to_num(ratio, nan=1.0)), 0.0)
            self._finding("throttled", det, claim, {
                "sm_clock_mhz": self._stats("clock_busy", em, per_gpu), "max_sm_clock_mhz": lim.max_sm_clock_mhz,
                "throttle_fraction": self._stats("throttle_frac", em, per_gpu),
                "throttled_gpus": int((per_gpu & em[None, :]).any(axis=1).sum()),
                "threshold_clock_ratio": c["clock_ratio_max"]})

    def _straggler(self) -> np.ndarray:
        """Robust deviation from peers over aligned windows, per GPU and per node. Returns the
        windows explained by a straggler (peers waiting), for low_sm_activity's sake."""
        f, c = self.w.f, self.th.kind("straggler")
        explained = np.zeros(self.w.k, dtype=bool)
        if self.active.shape[0] < int(c["min_gpus"]):
            return explained
        z, rel = float(c["robust_z"]), float(c["min_rel_dev"])
        act = self.active & (self.n_active >= int(c["min_gpus"]))[None, :]
        clock = f["clock_busy"]
        sm = f["sm"]

        def deviates(x: np.ndarray, ref: np.ndarray, mad: np.ndarray, sign: float, floor: float) -> np.ndarray:
            d = sign * (x - ref)
            return np.nan_to_num(d) >= np.maximum(z * mad, np.maximum(rel * np.abs(ref), floor))

        def ref_mad(x: np.ndarray, peers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            ref = masked_median(x, peers)
            mad = 1.4826 * masked_median(np.abs(x - ref[None, :]), peers)
            return ref, np.nan_to_num(mad)

        # GPU level: against the median of all active GPUs (one outlier cannot move it).
        ref_c, mad_c = ref_mad(clock, act)
        ref_s, mad_s = ref_mad(sm, act)
        slow_clock = act & deviates(clock, ref_c[None, :], mad_c[None, :], -1.0, 20.0)
        busier = act & deviates(sm, ref_s[None, :], mad_s[None, :], +1.0, 0.05)
        gpu_dev = slow_clock | busier
        # Node level: each node against the GPUs of the other nodes (half a job on one slow
        # node moves the overall median, the leave-node-out reference does not).
        nodes = np.asarray(self.ctx.gpu_nodes)
        node_names = list(dict.fromkeys(self.ctx.gpu_nodes))
        node_dev: dict[str, np.ndarray] = {}
        if len(node_names) >= 2:
            for nd in node_names:
                mine = (nodes == nd)[:, None] & act
                others = (nodes != nd)[:, None] & act
                if mine.sum() == 0:
                    continue
                oc, mc = ref_mad(clock, others)
                os_, ms = ref_mad(sm, others)
                xc = masked_median(clock, mine)
                xs = masked_median(sm, mine)
                dev = deviates(xc, oc, mc, -1.0, 20.0) | deviates(xs, os_, ms, +1.0, 0.05)
                frac = share(gpu_dev, mine)
                enough_gpus = mine.sum(axis=0) >= 2
                node_dev[nd] = enough_gpus & (dev | (frac >= float(c["node_share_min"]))) & (mine.sum(axis=0) > 0)
        # Never call more than half the job stragglers: then the "peers" are the odd ones.
        scopes: list[tuple[str, np.ndarray, np.ndarray]] = []  # scope, window mask, gpu rows
        covered = np.zeros_like(gpu_dev)
        for nd, m in node_dev.items():
            rows = nodes == nd
            scopes.append((nd, m, rows))
            covered |= rows[:, None] & m[None, :]
        for i, uuid in enumerate(self.ctx.gpu_uuids):
            m = gpu_dev[i] & ~covered[i]
            if m.any():
                rows = np.zeros(len(nodes), dtype=bool)
                rows[i] = True
                scopes.append((uuid, m, rows))
        for scope, m, rows in scopes:
            slow_rows = rows[:, None] & act
            peers = ~rows[:, None] & act
            ok = m & (slow_rows.sum(axis=0) * 2 <= act.sum(axis=0))
            det = detect(ok & self.valid_k, self.valid_k, self.window_s, c)
            if not det:
                continue
            em = episode_mask(det, self.w.k)
            explained |= em
            s_sm, p_sm = masked_median(sm, slow_rows), masked_median(sm, peers)
            s_ck, p_ck = masked_median(clock, slow_rows), masked_median(clock, peers)
            with np.errstate(invalid="ignore", divide="ignore"):
                wait_sm = np.clip(1.0 - p_sm / s_sm, 0.0, 1.0)
                wait_ck = np.clip(1.0 - s_ck / p_ck, 0.0, 1.0)
            wait = np.fmax(np.nan_to_num(wait_sm), np.nan_to_num(wait_ck))  # (K,) share of peer time spent waiting
            claim = np.where(peers, wait[None, :], 0.0)

            def med_over(x: np.ndarray, em: np.ndarray = em) -> float | None:
                v = x[em & ~np.isnan(x)]
                return _r(np.median(v)) if len(v) else None

            self._finding("straggler", det, claim, {
                "level": "gpu" if scope in self.ctx.gpu_uuids else "node",
                "gpus": [u for u, r in zip(self.ctx.gpu_uuids, rows, strict=True) if r][:16],
                "sm_active": med_over(s_sm), "peers_sm_active": med_over(p_sm),
                "sm_clock_mhz": med_over(s_ck), "peers_sm_clock_mhz": med_over(p_ck),
                "throttle_fraction": self._stats("throttle_frac", em, slow_rows),
                "peers_wait_fraction": med_over(wait), "n_peers": int(peers.any(axis=1).sum()),
                "robust_z": z, "min_rel_dev": rel}, scope=scope)
        return explained


def faults(ctx: JobContext, minute_b0: int, fmax: dict[str, np.ndarray], th: Thresholds,
           events: list[tuple[float, int | None, str, int | None]] | None = None) -> list[Finding]:
    """hw_fault per node from per-minute counter maxima/minima (G x M) and agent events.
    ``events``: (ts, GPU row or None, kind, code)."""
    c = th.kind("hw_fault")
    crit = set(int(x) for x in c["critical_xids"])
    g = len(ctx.gpu_uuids)
    per_gpu: list[dict[str, Any]] = [{} for _ in range(g)]
    first: list[float | None] = [None] * g

    def note(i: int, key: str, value: Any, ts: float) -> None:
        per_gpu[i].setdefault(key, value)
        first[i] = ts if first[i] is None else min(first[i], ts)

    def minute_ts(m: int) -> float:
        return float((minute_b0 + m) * 60)

    for i in range(g):
        xc = fmax["xid_crit"][i]
        hit = np.flatnonzero(np.nan_to_num(xc) > 0)
        if len(hit):
            note(i, "xid", int(xc[hit[0]]), minute_ts(int(hit[0])))
        rm = np.flatnonzero(np.nan_to_num(fmax["remap_max"][i]) >= 1)
        if len(rm):
            note(i, "row_remap_failure", 1, minute_ts(int(rm[0])))
        for key, mx, mn, need in (("ecc_dbe_new", "ecc_max", "ecc_min", 1.0),
                                  ("nvlink_errors_new", "nvl_err_max", "nvl_err_min", float(c["nvlink_errors_min"])),
                                  ("pcie_replays_new", "replay_max", "replay_min", float(c["pcie_replays_min"]))):
            hi, lo = fmax[mx][i], fmax[mn][i]
            ok = ~np.isnan(hi)
            if not ok.any():
                continue
            # Counters are cumulative since driver load: count what the job added (a
            # reset makes a step down, which is not an error).
            series = np.fmax.accumulate(np.where(ok, hi, -np.inf))
            base = float(np.nanmin(lo)) if np.any(~np.isnan(lo)) else float(hi[ok][0])
            added = series - base
            hit = np.flatnonzero(added >= need)
            if len(hit):
                note(i, key, int(added[-1]), minute_ts(int(hit[0])))
    for ts, row, kind, code in events or []:
        if row is None or not (0 <= row < g):
            continue
        if kind == "xid" and code is not None and int(code) in crit:
            note(row, "xid", int(code), ts)
        elif kind in ("ecc_dbe", "row_remap_failure", "nvlink_error", "fell_off_bus"):
            note(row, f"event_{kind}", code if code is not None else 1, ts)
    out: list[Finding] = []
    for node in dict.fromkeys(ctx.gpu_nodes):
        rows = [i for i in range(g) if ctx.gpu_nodes[i] == node and per_gpu[i]]
        if not rows:
            continue
        start = min(first[i] or ctx.last_ts for i in rows)
        evidence = {"gpus": [{"gpu_uuid": ctx.gpu_uuids[i], **per_gpu[i]} for i in rows][:16],
                    "critical_xids": sorted(crit)}
        out.append(Finding("hw_fault", node, c.get("severity", "critical"), max(ctx.first_ts, start), ctx.last_ts,
                           True, 0.0, evidence, SUGGESTIONS["hw_fault"]))
    return out

"""straggler: one GPU or node measurably slower than its peers, who wait for it at every step.

Robust deviation from peers over aligned windows, per GPU and per node (median + MAD, so one
outlier cannot move the reference)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import episode_mask, masked_median, share
from .base import Finding, Found, JobView, make_finding, r3

KIND = "straggler"


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    min_gpus: int  # robust statistics need peers
    robust_z: float  # |x - median| / (1.4826 MAD) of peers
    min_rel_dev: float  # Falcon: >= 10% slower matters
    node_share_min: float  # this share of a node's GPUs deviating makes it a node-level straggler


def _ref_mad(x: np.ndarray, peers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ref = masked_median(x, peers)
    mad = 1.4826 * masked_median(np.abs(x - ref[None, :]), peers)
    return ref, np.nan_to_num(mad)


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    f = job.w.f
    if job.n_gpus < cfg.min_gpus:
        return []
    z, rel = cfg.robust_z, cfg.min_rel_dev
    act = job.active & (job.n_active >= cfg.min_gpus)[None, :]
    clock, sm = f.clock_busy, f.sm

    def deviates(x: np.ndarray, ref: np.ndarray, mad: np.ndarray, sign: float, floor: float) -> np.ndarray:
        d = sign * (x - ref)
        return np.nan_to_num(d) >= np.maximum(z * mad, np.maximum(rel * np.abs(ref), floor))

    # GPU level: against the median of all active GPUs.
    ref_c, mad_c = _ref_mad(clock, act)
    ref_s, mad_s = _ref_mad(sm, act)
    slow_clock = act & deviates(clock, ref_c[None, :], mad_c[None, :], -1.0, 20.0)
    busier = act & deviates(sm, ref_s[None, :], mad_s[None, :], +1.0, 0.05)
    gpu_dev = slow_clock | busier
    # Node level: each node against the GPUs of the other nodes (half a job on one slow
    # node moves the overall median, the leave-node-out reference does not).
    nodes = np.asarray(job.ctx.gpu_nodes)
    node_names = list(dict.fromkeys(job.ctx.gpu_nodes))
    node_dev: dict[str, np.ndarray] = {}
    if len(node_names) >= 2:
        for nd in node_names:
            mine = (nodes == nd)[:, None] & act
            others = (nodes != nd)[:, None] & act
            if mine.sum() == 0:
                continue
            oc, mc = _ref_mad(clock, others)
            os_, ms = _ref_mad(sm, others)
            xc = masked_median(clock, mine)
            xs = masked_median(sm, mine)
            dev = deviates(xc, oc, mc, -1.0, 20.0) | deviates(xs, os_, ms, +1.0, 0.05)
            frac = share(gpu_dev, mine)
            enough_gpus = mine.sum(axis=0) >= 2
            node_dev[nd] = enough_gpus & (dev | (frac >= cfg.node_share_min)) & (mine.sum(axis=0) > 0)
    # Never call more than half the job stragglers: then the "peers" are the odd ones.
    scopes: list[tuple[str, np.ndarray, np.ndarray]] = []  # scope, window mask, gpu rows
    covered = np.zeros_like(gpu_dev)
    for nd, m in node_dev.items():
        rows = nodes == nd
        scopes.append((nd, m, rows))
        covered |= rows[:, None] & m[None, :]
    for i, uuid in enumerate(job.ctx.gpu_uuids):
        m = gpu_dev[i] & ~covered[i]
        if m.any():
            rows = np.zeros(len(nodes), dtype=bool)
            rows[i] = True
            scopes.append((uuid, m, rows))
    out: list[Finding] = []
    for scope, m, rows in scopes:
        slow_rows = rows[:, None] & act
        peers = ~rows[:, None] & act
        ok = m & (slow_rows.sum(axis=0) * 2 <= act.sum(axis=0))
        det = job.episodes(ok, cfg)
        if not det:
            continue
        em = episode_mask(det, job.w.k)
        s_sm, p_sm = masked_median(sm, slow_rows), masked_median(sm, peers)
        s_ck, p_ck = masked_median(clock, slow_rows), masked_median(clock, peers)
        with np.errstate(invalid="ignore", divide="ignore"):
            wait_sm = np.clip(1.0 - p_sm / s_sm, 0.0, 1.0)
            wait_ck = np.clip(1.0 - s_ck / p_ck, 0.0, 1.0)
        wait = np.fmax(np.nan_to_num(wait_sm), np.nan_to_num(wait_ck))  # (K,) share of peer time spent waiting
        claim = np.where(peers, wait[None, :], 0.0)

        def med_over(x: np.ndarray, em: np.ndarray = em) -> float | None:
            v = x[em & ~np.isnan(x)]
            return r3(np.median(v)) if len(v) else None

        out.append(make_finding(job, KIND, cfg, det, claim, {
            "level": "gpu" if scope in job.ctx.gpu_uuids else "node",
            "gpus": [u for u, r in zip(job.ctx.gpu_uuids, rows, strict=True) if r][:16],
            "sm_active": med_over(s_sm), "peers_sm_active": med_over(p_sm),
            "sm_clock_mhz": med_over(s_ck), "peers_sm_clock_mhz": med_over(p_ck),
            "throttle_fraction": job.stats(f.throttle_frac, em, slow_rows),
            "peers_wait_fraction": med_over(wait), "n_peers": int(peers.any(axis=1).sum()),
            "robust_z": z, "min_rel_dev": rel}, scope=scope))
    return out

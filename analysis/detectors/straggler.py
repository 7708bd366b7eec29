"""straggler: one GPU or node measurably slower than its peers, who wait for it at every step.

Robust deviation from peers over aligned windows, per GPU and per node (median + MAD, so one
outlier cannot move the reference). A deviant is named a straggler only with a hardware
signature (a busy-clock deficit, throttle reasons, or errors on its GPUs): a GPU that is merely
busier than its peers at equal clocks is the heaviest stage of a pipeline-parallel job doing
its share, which is ``pipeline_imbalance`` (rebalance the stages, do not drain the node).

Two paths. The windowed one above needs ``min_duration_s`` (15 min) of 5-minute windows and
names any hardware signature. The fast one judges each minute and raises a straggler after
``fast_minutes`` consecutive minutes with the full physical picture of synchronous training
held back by one GPU or node: its busy SM clock below its peers' (robustly, as above), a
reason that takes a clock down set on it (``fast_reasons_mask``: HW slowdown 0x8, SW/HW
thermal 0x20/0x40, HW power brake 0x80; the SW power cap 0x4 is the normal state of a busy
H100 and does not count), and its SM activity above its peers' by ``fast_sm_gap`` (they wait
for it in the collective while it computes). A busier GPU at an equal clock (a pipeline
stage), a lower clock without a reason, or a throttled GPU whose peers do not wait, needs the
windowed path's 15 minutes or is not a straggler at all."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import Detection, episode_mask, masked_median, median1d, nz, share
from ..windows import detect as find_episodes
from .base import Finding, Found, JobView, Signals, make_finding, r3
from .hw_fault import Config as FaultConfig

KIND = "straggler"
SIGNALS = Signals(needs=("sm_active", "sm_clock_mhz"), corroborate=("power_w",))


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    min_gpus: int  # robust statistics need peers
    robust_z: float  # |x - median| / (1.4826 MAD) of peers
    min_rel_dev: float  # Falcon: >= 10% slower matters
    node_share_min: float  # this share of a node's GPUs deviating makes it a node-level straggler
    fast_minutes: int = 0  # consecutive minutes of the fast path's picture (0: off)
    fast_sm_gap: float = 0.05  # the slow GPU's SM activity this much above its peers' median (they wait)
    fast_reasons_mask: int = 0xE8  # clock-event reasons that slow a GPU (0x8, 0x20, 0x40, 0x80)


def _ref_mad(xs: list[np.ndarray], peers: list[np.ndarray],
             plain: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each (G, C) ``xs[i]``'s median over ``peers[i]`` per column, and for all but the last
    ``plain`` of them the scaled MAD too: all in two calls (side by side as columns: a median
    is per column, so this is each one's arithmetic)."""
    x = np.concatenate(xs, axis=1)
    p = np.concatenate(peers, axis=1)
    ref = masked_median(x, p)
    spans = list(pairwise(np.cumsum([0, *(a.shape[1] for a in xs)]).tolist()))
    c = spans[len(xs) - plain - 1][1]
    mad = nz(1.4826 * masked_median(np.abs(x[:, :c] - ref[None, :c]), p[:, :c]))
    return [ref[a:b] for a, b in spans], [mad[a:b] for a, b in spans[:len(xs) - plain]]


@dataclass
class Deviant:
    """One GPU or node deviating from its peers over ``em`` (K,), with the medians compared."""

    scope: str
    rows: np.ndarray  # (G,) its GPUs
    det: Detection
    em: np.ndarray
    slow_rows: np.ndarray  # (G, K)
    peers: np.ndarray  # (G, K)
    s_sm: np.ndarray
    p_sm: np.ndarray
    s_ck: np.ndarray
    p_ck: np.ndarray
    signature: list[str]


def _errors(job: JobView, rows: np.ndarray) -> bool:
    """Errors a hardware fault would be raised on (critical XIDs, row remaps, new double-bit ECC,
    NVLink CRC errors past hw_fault's threshold), per GPU: counters are cumulative and each GPU
    has its own baseline."""
    c, need_nvl = job.counters, job.th.get(FaultConfig).nvlink_errors_min
    for i in np.flatnonzero(rows):
        if nz(c.xid_crit[i]).any() or nz(c.remap_max[i]).any():
            return True
        for hi, lo, need in ((c.ecc_max[i], c.ecc_min[i], 1.0), (c.nvl_err_max[i], c.nvl_err_min[i], need_nvl)):
            if np.any(~np.isnan(hi)) and np.any(~np.isnan(lo)) and np.nanmax(hi) - np.nanmin(lo) >= need:
                return True
    return False


_last = threading.local()  # the previous call's (job, cfg, deviants): see deviants()


def deviants(job: JobView, cfg: Config) -> list[Deviant]:
    """GPUs and nodes that deviate from their peers long enough to count, each with its
    hardware signature (empty: none). straggler and pipeline_imbalance both ask for the same
    job, one after the other: the second gets the first's answer (read-only) instead of
    paying for it again."""
    prev = getattr(_last, "entry", None)
    if prev is not None and prev[0] is job and prev[1] == cfg:
        return list(prev[2])
    out = _deviants(job, cfg)
    _last.entry = (job, cfg, out)
    return list(out)


def _scopes(job: JobView, node_dev: dict[str, np.ndarray], gpu_dev: np.ndarray
            ) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(scope, time mask, GPU rows): each deviating node over its masked times, then each GPU
    over its deviating times not covered by its node's."""
    nodes = np.asarray(job.ctx.gpu_nodes)
    scopes: list[tuple[str, np.ndarray, np.ndarray]] = []
    covered = np.zeros_like(gpu_dev)
    for nd, m in node_dev.items():
        rows = nodes == nd
        scopes.append((nd, m, rows))
        covered |= rows[:, None] & m[None, :]
    alone = gpu_dev & ~covered
    # (the GPUs with a window of their own found in one call: two numpy calls per GPU added up
    # to a fifth of a 32-GPU job's straggler check)
    for i in np.flatnonzero(alone.any(axis=1)).tolist():
        rows = np.zeros(len(nodes), dtype=bool)
        rows[i] = True
        scopes.append((job.ctx.gpu_uuids[i], alone[i], rows))
    return scopes


def _deviants(job: JobView, cfg: Config) -> list[Deviant]:
    f = job.w.f
    if job.n_gpus < cfg.min_gpus:
        return []
    z, rel = cfg.robust_z, cfg.min_rel_dev
    act = job.active & (job.n_active >= cfg.min_gpus)[None, :]
    if not act.any():
        return []  # no window with enough active peers: nobody deviates from anyone
    clock, sm = f.clock_busy, f.sm

    def deviates(x: np.ndarray, ref: np.ndarray, mad: np.ndarray, sign: float, floor: float) -> np.ndarray:
        d = sign * (x - ref)
        return nz(d) >= np.maximum(z * mad, np.maximum(rel * np.abs(ref), floor))

    # GPU level: against the median of all active GPUs. Node level: each node against the GPUs
    # of the other nodes (half a job on one slow node moves the overall median, the
    # leave-node-out reference does not), every node's (K,) medians at once: the nodes' masks
    # side by side as columns of one (G, N*K) problem (a median is per column, so this is the
    # per-node loop's arithmetic), in the same two median calls as the GPU level's.
    nodes = np.asarray(job.ctx.gpu_nodes)
    node_names = list(dict.fromkeys(job.ctx.gpu_nodes))
    node_dev: dict[str, np.ndarray] = {}
    xs_: list[np.ndarray] = [clock, sm]
    peers_: list[np.ndarray] = [act, act]
    k = act.shape[1]
    if len(node_names) >= 2:
        in_node = np.stack([nodes == nd for nd in node_names], axis=1)  # (G, N)
        act_n = np.concatenate([act] * len(node_names), axis=1)  # (np.tile's, without its Python layers)
        mine = np.repeat(in_node, k, axis=1) & act_n  # (G, N*K)
        others = np.repeat(~in_node, k, axis=1) & act_n
        clock_n = np.concatenate([clock] * len(node_names), axis=1)
        sm_n = np.concatenate([sm] * len(node_names), axis=1)
        # against the others (median and MAD), and each node's own median (plain)
        xs_ += [clock_n, sm_n, clock_n, sm_n]
        peers_ += [others, others, mine, mine]
    refs, mads = _ref_mad(xs_, peers_, plain=2 if len(node_names) >= 2 else 0)
    slow_clock = act & deviates(clock, refs[0][None, :], mads[0][None, :], -1.0, 20.0)
    busier = act & deviates(sm, refs[1][None, :], mads[1][None, :], +1.0, 0.05)
    gpu_dev = slow_clock | busier
    if len(node_names) >= 2:
        oc, os_, xc, xs = refs[2:]
        mc, ms = mads[2:]
        dev = deviates(xc, oc, mc, -1.0, 20.0) | deviates(xs, os_, ms, +1.0, 0.05)
        frac = share(np.concatenate([gpu_dev] * len(node_names), axis=1), mine)
        n_mine = mine.sum(axis=0)
        node_ok = (n_mine >= 2) & (dev | (frac >= cfg.node_share_min)) & (n_mine > 0)
        for j, nd in enumerate(node_names):
            if n_mine[j * k:(j + 1) * k].sum() == 0:
                continue
            node_dev[nd] = node_ok[j * k:(j + 1) * k]
    # Never call more than half the job stragglers: then the "peers" are the odd ones.
    out: list[Deviant] = []
    for scope, m, rows in _scopes(job, node_dev, gpu_dev):
        slow_rows = rows[:, None] & act
        peers = ~rows[:, None] & act
        ok = m & (slow_rows.sum(axis=0) * 2 <= act.sum(axis=0))
        det = job.episodes(ok, cfg)
        if not det:
            continue
        em = episode_mask(det, job.w.k)
        s_sm, p_sm = masked_median(sm, slow_rows), masked_median(sm, peers)
        s_ck, p_ck = masked_median(clock, slow_rows), masked_median(clock, peers)
        sig = []
        with np.errstate(invalid="ignore", divide="ignore"):
            deficit = np.nanmedian(np.where(em, 1.0 - s_ck / p_ck, np.nan)) if np.any(em & ~np.isnan(s_ck)) else 0.0
        if nz(deficit) >= rel:
            sig.append("clock_deficit")
        thr_s = job.stats(f.throttle_frac, em, slow_rows)
        thr_p = job.stats(f.throttle_frac, em, peers)
        if thr_s is not None and thr_s >= 0.25 and thr_s >= (thr_p or 0.0) + 0.2:
            sig.append("throttle_reasons")
        if _errors(job, rows):
            sig.append("errors")
        out.append(Deviant(scope, rows, det, em, slow_rows, peers, s_sm, p_sm, s_ck, p_ck, sig))
    return out


def med_over(x: np.ndarray, em: np.ndarray) -> float | None:
    v = x[em & ~np.isnan(x)]
    return r3(median1d(v)) if len(v) else None


@dataclass
class FastDeviant:
    """One GPU or node with the fast path's picture for ``fast_minutes`` in a row: ``det`` over
    the job's minutes, ``minutes`` (M,) its qualifying minutes inside those episodes."""

    scope: str
    rows: np.ndarray  # (G,) its GPUs
    det: Detection
    minutes: np.ndarray
    reasons: int  # the slowing reason bits seen on its GPUs in those minutes


def _below(x: np.ndarray, ref: np.ndarray, mad: np.ndarray, z: float, rel: float) -> np.ndarray:
    """``x`` (a clock) below ``ref`` by z MADs, by ``rel`` of it and by 20 MHz (boost steps)."""
    return nz(ref - x) >= np.maximum(z * mad, np.maximum(rel * np.abs(nz(ref)), 20.0))


def fast_deviants(job: JobView, cfg: Config) -> list[FastDeviant]:
    """The fast path, minute by minute (see the module's docstring): GPUs, and nodes against the
    GPUs of the other nodes, whose busy clock is low with a slowing reason set while their SM
    activity stays above their waiting peers'."""
    m = job.minutes
    if cfg.fast_minutes <= 0 or job.n_gpus < cfg.min_gpus or m.clock_busy.shape != m.sm.shape:
        return []
    cause = (nz(m.reasons_or).astype(np.int64) & cfg.fast_reasons_mask) != 0
    if not cause.any():
        return []  # no slowing reason on any GPU-minute: the usual case stops here
    clock, sm = m.clock_busy, m.sm
    ok = (m.n > 0) & ~np.isnan(clock) & (sm >= job.general.busy_sm_active)  # (NaN compares False)
    judged = ok.sum(axis=0) >= cfg.min_gpus  # (M,) minutes with enough busy peers to compare
    ok &= judged[None, :]
    if not (ok & cause).any():
        return []
    z, rel, gap = cfg.robust_z, cfg.min_rel_dev, cfg.fast_sm_gap

    def picture(rows: np.ndarray, peers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(M,) minutes where ``rows`` (G, M) run a clock robustly below ``peers``', and where
        they are busier than ``peers`` by the gap (the peers wait)."""
        ref = masked_median(clock, peers)
        mad = 1.4826 * nz(masked_median(np.abs(clock - ref[None, :]), peers))
        return (_below(masked_median(clock, rows), ref, mad, z, rel),
                nz(masked_median(sm, rows) - masked_median(sm, peers), -1.0) >= gap)

    n_ok = ok.sum(axis=0)
    # held: slow with a cause; full: held while the peers wait (the picture). Only GPUs that
    # had a cause are looked at.
    gpu_held, gpu_full = np.zeros_like(ok), np.zeros_like(ok)
    for i in np.flatnonzero((ok & cause).any(axis=1)).tolist():
        r = np.zeros_like(ok)
        r[i] = ok[i]
        below, busier = picture(r, ok & ~r)
        gpu_held[i] = ok[i] & cause[i] & below
        gpu_full[i] = gpu_held[i] & busier
    nodes = np.asarray(job.ctx.gpu_nodes)
    node_held: dict[str, np.ndarray] = {}  # node -> (M,) as gpu_held, for the node as a whole
    node_full: dict[str, np.ndarray] = {}
    names = list(dict.fromkeys(job.ctx.gpu_nodes))
    for nd in names if len(names) >= 2 else []:
        rows = nodes == nd
        mine, others = ok & rows[:, None], ok & ~rows[:, None]
        if rows.sum() < 2 or not (cause & mine).any():
            continue
        below, busier = picture(mine, others)
        two = mine.sum(axis=0) >= 2
        held = two & ((below & (share(cause, mine) >= cfg.node_share_min))
                      | (share(gpu_held, mine) >= cfg.node_share_min))
        full = two & ((held & busier) | (share(gpu_full, mine) >= cfg.node_share_min))
        if full.any():
            node_held[nd], node_full[nd] = held, full
    out: list[FastDeviant] = []
    newest = int(np.flatnonzero(judged)[-1]) if judged.any() else -1
    for scope, full, rows in _scopes(job, node_full, gpu_full):
        n_mine = ok[rows].sum(axis=0)
        full = full & (n_mine * 2 <= n_ok)  # never half the busy GPUs: then the peers are odd
        held = node_held[scope] if scope in node_held else gpu_held[rows][0]
        # Judged where the scope has busy samples (two of a node's GPUs): a minute that holds
        # none (the newest, partly arrived; a sample every 60 s with jitter skipping a minute)
        # neither breaks nor extends its run; nor does a minute where it is still slow with its
        # cause while the peers do not wait (a checkpoint or an evaluation pass of the whole job).
        seen_m = judged & (n_mine >= min(2, int(rows.sum())))
        valid = seen_m & (full | ~held)
        det = find_episodes(full & valid, valid, 60.0, cfg.fast_minutes * 60.0, 0.0)
        if det is None:
            continue
        # ... and it is going on only while the scope still reports: up to the job's newest
        # minute, or the one before while the newest is still arriving
        last_seen = int(np.flatnonzero(seen_m)[-1])
        det = replace(det, ongoing=det.ongoing and last_seen >= newest - 1)
        in_eps = episode_mask(det, len(full)) & full
        bits = nz(m.reasons_or[rows][:, in_eps]).astype(np.int64) & cfg.fast_reasons_mask
        seen = int(np.bitwise_or.reduce(bits, axis=None)) if bits.size else 0
        out.append(FastDeviant(scope, rows, det, in_eps, seen))
    return out


def _fast_windows(job: JobView, q: FastDeviant) -> np.ndarray:
    """(K,) the windows holding a minute of ``q``'s episodes."""
    w = job.w
    em = np.zeros(w.k, dtype=bool)
    k = (np.flatnonzero(q.minutes) + job.minutes.b0 - w.b0) // w.w_min
    em[k[(k >= 0) & (k < w.k)]] = True
    return em


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    from .throttled import REASONS  # (throttled reads this module's Config)

    slow = {d.scope: d for d in deviants(job, cfg) if d.signature}  # no hardware cause: pipeline_imbalance's
    fast = {q.scope: q for q in fast_deviants(job, cfg)}
    w, f = job.w, job.w.f
    act = job.active & (job.n_active >= cfg.min_gpus)[None, :]
    out: list[Finding] = []
    for scope in dict.fromkeys([*slow, *fast]):
        d, q = slow.get(scope), fast.get(scope)
        rows = d.rows if d is not None else q.rows  # type: ignore[union-attr]  # one of them is there
        em = np.zeros(w.k, dtype=bool) if d is None else d.em.copy()
        if q is not None:
            em |= _fast_windows(job, q)
        det = find_episodes(em & job.valid_k, job.valid_k, job.window_s, 0.0, 0.0)
        if det is None:
            continue
        em = episode_mask(det, w.k)
        slow_rows, peers = rows[:, None] & act, ~rows[:, None] & act
        s_sm, p_sm = masked_median(f.sm, slow_rows), masked_median(f.sm, peers)
        s_ck, p_ck = masked_median(f.clock_busy, slow_rows), masked_median(f.clock_busy, peers)
        signature = list(d.signature) if d is not None else []
        if q is not None:
            signature += [s for s in ("clock_deficit", "throttle_reasons") if s not in signature]
        with np.errstate(invalid="ignore", divide="ignore"):
            wait_sm = np.clip(1.0 - p_sm / s_sm, 0.0, 1.0)
            wait_ck = np.clip(1.0 - s_ck / p_ck, 0.0, 1.0)
        wait = np.fmax(nz(wait_sm), nz(wait_ck))  # (K,) share of peer time spent waiting
        claim = np.where(peers, wait[None, :], 0.0)
        fd = make_finding(job, KIND, cfg, det, claim, {
            "level": "gpu" if scope in job.ctx.gpu_uuids else "node",
            "gpus": [u for u, r in zip(job.ctx.gpu_uuids, rows, strict=True) if r][:16],
            "sm_active": med_over(s_sm, em), "peers_sm_active": med_over(p_sm, em),
            "sm_clock_mhz": med_over(s_ck, em), "peers_sm_clock_mhz": med_over(p_ck, em),
            "throttle_fraction": job.stats(f.throttle_frac, em, slow_rows),
            "peers_wait_fraction": med_over(wait, em), "n_peers": int(peers.any(axis=1).sum()),
            "signature": signature, "robust_z": cfg.robust_z, "min_rel_dev": cfg.min_rel_dev,
            # the minute-by-minute path: its minutes, and the slowing reasons it saw
            "fast_minutes": int(q.minutes.sum()) if q is not None else 0,
            "slowing_reasons": [n for b, n in REASONS.items() if q is not None and q.reasons & b]}, scope=scope)
        # Found by the minute: the onset is its first minute, not its window's start (which the
        # windowed path, finding the same episode later, must not move).
        if q is not None:
            first = float((job.minutes.b0 + q.det.episodes[0].k0) * 60)
            slow_t0 = w.t0(d.det.episodes[0].k0) if d is not None else first
            if first < slow_t0 + job.window_s:
                fd.start_ts = max(job.ctx.first_ts, first)
            fd.ongoing = q.det.ongoing or (d is not None and d.det.ongoing)
        out.append(fd)
    return out

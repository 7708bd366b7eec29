"""The GPU-time ledger: every allocated GPU-second of a job attributed exactly once (pure numpy).

Per GPU and minute, the allocated seconds split into ``productive``, a badput cause (a hardware
flag kind, or a progress cause of ``ledger_categories.toml``) or ``unobserved`` (neither
telemetry nor progress covered it: unknown is not zero, and not waste). Every number the
product shows (goodput, waste by cause, a flag's waste, ETTR, fleet totals) is a sum over it
(docs/goodput.md, "The ledger").

Precedence, per GPU-minute:

1. Seconds the job's progress covers: progress decides productive or not. Its productive
   seconds stay productive. Its not-productive seconds of an *explainable* cause (hang, idle,
   restart lost, unexplained) go to the hardware flags that claim that GPU-minute, in the
   share they claim; spans the program named (data wait, checkpoint, ...) stay its own.
   A serving replica's minutes (analysis/serving/ledger.py) decide the same way: productive in
   the share of requests that met the SLOs, the rest a serving cause (``[serving]`` of
   ``ledger_categories.toml``) that no claim takes; only a critical work-stopping fault takes
   them, on the GPUs it stopped. Where a job has both, the requests it served decide.
2. Seconds only telemetry covers: the hardware flags' claims (fractions of the observed time).
3. Neither: ``unobserved``; except after a work-stopping fault (``stops_work``, critical) on
   the faulted GPU, where they are the fault's (the stopped time).

Two flags never claim one second: flags are ordered (severity, then the narrower scope, then
the detectors' explanation order), and each takes only what it claims beyond the flags
before it (the GPU-minute's total waste is the largest claim, as before the ledger)."""

from __future__ import annotations

import math
import tomllib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.flagkinds import SEVERITIES, flag_kinds

from .progress.goodput import processes, rank_goodput
from .progress.model import Allocation, Window

CATEGORIES_PATH = Path(__file__).with_name("ledger_categories.toml")
PRODUCTIVE = "productive"
UNOBSERVED = "unobserved"
_SCOPE_ORDER = {"gpu": 0, "node": 1, "job": 2}


@dataclass(frozen=True)
class Categories:
    """``ledger_categories.toml`` plus the hardware flag kinds of the registry."""

    progress: tuple[str, ...]  # progress causes, in file order
    explainable: frozenset[str]
    titles: Mapping[str, str]
    hardware: tuple[str, ...]  # hardware flag kinds (each a category)
    flag_categories: Mapping[str, tuple[str, ...]]  # flag kinds without claims -> their categories
    stops_work: frozenset[str]
    # Serving causes ([serving] causes): the badput categories of a replica-minute
    # (analysis/serving/ledger.py), which ``fold`` takes as the application's own view, as it
    # takes progress: no claim takes them, a work-stopping fault does on the GPUs it stopped.
    serving: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Every category: productive, the progress causes, the hardware and serving kinds, unobserved."""
        hw = tuple(k for k in (*self.hardware, *self.serving) if k not in self.progress)
        return (PRODUCTIVE, *self.progress, *hw, UNOBSERVED)

    def as_json(self) -> list[dict[str, Any]]:
        reg = flag_kinds()
        out = [{"name": PRODUCTIVE, "kind": "productive", "source": None, "title": "productive"}]
        out += [{"name": c, "kind": "badput", "source": "progress", "title": self.titles[c]} for c in self.progress]
        out += [{"name": k, "kind": "badput", "source": reg.get(k).source, "title": reg.title(k)}
                for k in (*self.hardware, *self.serving) if k not in self.progress]
        out.append({"name": UNOBSERVED, "kind": "unobserved", "source": None, "title": "no telemetry, no progress"})
        return out


def parse_categories(text: str) -> Categories:
    raw = tomllib.loads(text)
    if raw.get("productive") != PRODUCTIVE or raw.get("unobserved") != UNOBSERVED:
        raise ValueError("ledger categories: productive/unobserved names are fixed")
    causes = raw.get("cause") or []
    names = [str(c["name"]) for c in causes]
    if len(set(names)) != len(names):
        raise ValueError(f"ledger categories: a cause is defined twice: {names}")
    reg = flag_kinds()
    hardware = tuple(k.name for k in reg.kinds if k.source == "hardware")
    serving = tuple(str(k) for k in (raw.get("serving") or {}).get("causes", []))
    not_serving = sorted(set(serving) - {k.name for k in reg.kinds if k.source == "serving"})
    if not_serving:
        raise ValueError(f"ledger categories: [serving].causes names kinds that are not serving kinds {not_serving}")
    flags = {str(k): tuple(str(x) for x in v) for k, v in (raw.get("flags") or {}).items()}
    unknown = sorted({c for v in flags.values() for c in v} - set(names) - set(hardware) - set(serving))
    if unknown:
        raise ValueError(f"ledger categories: [flags] names unknown categories {unknown}")
    stops = frozenset(str(k) for k in (raw.get("precedence") or {}).get("stops_work", []))
    return Categories(tuple(names), frozenset(str(c["name"]) for c in causes if c.get("explainable")),
                      {str(c["name"]): str(c.get("title", c["name"])) for c in causes}, hardware, flags, stops,
                      serving)


@cache
def categories() -> Categories:
    return parse_categories(CATEGORIES_PATH.read_text())


@dataclass(frozen=True)
class Grid:
    """The job's allocation on whole minutes: minute ``b0 + j`` holds ``alloc_s[j]`` allocated
    seconds per GPU (the first and last minutes partly)."""

    b0: int
    n_gpus: int
    alloc_s: np.ndarray  # (M,)

    @property
    def m(self) -> int:
        return len(self.alloc_s)

    @classmethod
    def of(cls, start: float, end: float, n_gpus: int) -> Grid:
        end = max(end, start)
        b0 = math.floor(start / 60)
        m = max(1, math.ceil(end / 60) - b0) if end > start else 0
        edges = (b0 + np.arange(m + 1)) * 60.0
        alloc = np.clip(np.minimum(edges[1:], end) - np.maximum(edges[:-1], start), 0.0, 60.0)
        return cls(b0, n_gpus, alloc)

    def place(self, x: np.ndarray, b0: int, fill: float = 0.0) -> np.ndarray:
        """(G, M') per-minute values starting at minute ``b0`` -> this grid's (G, M) minutes."""
        out = np.full((x.shape[0], self.m), fill, dtype=x.dtype)
        lo, hi = max(b0, self.b0), min(b0 + x.shape[1], self.b0 + self.m)
        if hi > lo:
            out[:, lo - self.b0:hi - self.b0] = x[:, lo - b0:hi - b0]
        return out


@dataclass(frozen=True)
class Claim:
    """One hardware finding's claim on the job's GPU-minutes."""

    kind: str
    scope: str
    severity: str
    frac: np.ndarray | None  # (G, M) share of the observed seconds it claims; None: claims none
    stopped: np.ndarray | None = None  # (G, M) bool: the fault stopped these GPU-minutes (stops_work kinds)
    scope_kind: str = "job"  # gpu | node | job (specificity)


def precedence(claims: Sequence[Claim]) -> list[int]:
    """Indexes of ``claims`` in the order they take seconds: severity (critical first), then
    the narrower scope, then their own order (the detectors' explanation order)."""
    sev = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(range(len(claims)), key=lambda i: (-sev.get(claims[i].severity, 0),
                                                      _SCOPE_ORDER.get(claims[i].scope_kind, 2), i))


@dataclass
class Ledger:
    """A job's ledger: category -> (G, M) GPU-seconds on ``grid``; ``flag_s[i]``: the seconds
    claim ``i`` got (its share: the sum over its kind's claims is the kind's category)."""

    grid: Grid
    seconds: dict[str, np.ndarray]
    flag_s: list[float] = field(default_factory=list)

    def totals(self) -> dict[str, float]:
        return {k: float(v.sum()) for k, v in self.seconds.items()}

    def per_minute(self) -> dict[str, np.ndarray]:
        """Category -> (M,) GPU-seconds per minute (summed over GPUs): what is stored."""
        return {k: v.sum(axis=0) for k, v in self.seconds.items()}

    def per_gpu(self) -> dict[str, np.ndarray]:
        return {k: v.sum(axis=1) for k, v in self.seconds.items()}

    @property
    def allocated_s(self) -> float:
        return float(self.grid.alloc_s.sum()) * self.grid.n_gpus


def _add(out: dict[str, np.ndarray], k: str, v: np.ndarray) -> None:
    if not v.any():
        return
    if k in out:
        out[k] = out[k] + v
    else:
        out[k] = v.astype(np.float64, copy=True)


def _app_view(progress: Mapping[str, np.ndarray] | None,
              serving: Mapping[str, np.ndarray] | None) -> Mapping[str, np.ndarray] | None:
    """The application's own view: the replica's serving seconds on the GPU-minutes they cover,
    the job's progress on the others (a job that is both: the requests it served decide)."""
    if not serving:
        return progress
    if not progress:
        return serving
    covered = sum((np.fmax(v, 0.0) for v in serving.values()), np.zeros(next(iter(serving.values())).shape)) > 0
    out = {k: np.where(covered, 0.0, v) for k, v in progress.items()}
    for k, v in serving.items():
        out[k] = out[k] + v if k in out else v
    return out


def fold(grid: Grid, observed_s: np.ndarray, claims: Sequence[Claim] = (), *,
         idle: np.ndarray | None = None, progress: Mapping[str, np.ndarray] | None = None,
         serving: Mapping[str, np.ndarray] | None = None, cats: Categories | None = None) -> Ledger:
    """The ledger of one job. ``observed_s``: (G, M) seconds of telemetry per GPU-minute;
    ``idle``: (G, M) judged idle by the hardware view; ``progress``: the application's own view,
    cause (``productive`` included) -> (G, M) seconds: the job's progress (``progress_minutes``);
    ``serving``: a serving replica's minutes in the same form (``serving_minutes_grid``; its
    causes stay its own against claims, as spans do, and it decides the GPU-minutes it covers).
    See the module docstring."""
    cats = cats or categories()
    g, m = grid.n_gpus, grid.m
    alloc = np.broadcast_to(grid.alloc_s, (g, m))
    obs = np.minimum(np.fmax(observed_s, 0.0), alloc)
    out: dict[str, np.ndarray] = {}
    prog: dict[str, np.ndarray] = {}
    progress = _app_view(progress, serving)
    if progress:
        # Progress first: its seconds are taken out of the GPU-minute (scaled down, never over it).
        prog = {k: np.fmax(v, 0.0) for k, v in progress.items()}
        total = sum(prog.values(), np.zeros((g, m)))
        over = total > alloc
        if over.any():
            scale = np.where(over, alloc / np.where(total > 0, total, 1.0), 1.0)
            prog = {k: v * scale for k, v in prog.items()}
        rest = alloc - np.minimum(total, alloc)
        # The telemetry-only seconds: observed in the same share as the whole minute.
        obs_rest = rest * np.where(alloc > 0, obs / np.where(alloc > 0, alloc, 1.0), 0.0)
    else:
        obs_rest = obs
        rest = alloc
    unobs_rest = rest - obs_rest
    # Claims in precedence order: each its increment over the largest claim before it.
    order = precedence(claims)
    flag_s = [0.0] * len(claims)
    top = np.zeros((g, m))
    incs: list[tuple[int, np.ndarray]] = []
    stopped_any: np.ndarray | None = None
    stop_owner: list[tuple[int, np.ndarray]] = []
    for i in order:
        c = claims[i]
        if c.stopped is not None and c.severity == "critical" and c.kind in cats.stops_work:
            mine = c.stopped if stopped_any is None else c.stopped & ~stopped_any
            if mine.any():
                stop_owner.append((i, mine))
                stopped_any = mine.copy() if stopped_any is None else stopped_any | mine
        if c.frac is None:
            continue
        f = np.minimum(np.fmax(c.frac, 0.0), 1.0)  # (fmax: NaN -> 0, a claim not measured is none)
        inc = np.fmax(f - top, 0.0)
        if inc.any():
            incs.append((i, inc))
            top = np.fmax(top, f)

    def give(i: int, secs: np.ndarray) -> None:
        _add(out, claims[i].kind, secs)
        flag_s[i] += float(secs.sum())

    if stopped_any is None:
        # 1. telemetry-only observed seconds: the claims' increments, the rest productive
        for i, inc in incs:
            give(i, inc * obs_rest)
        _add(out, PRODUCTIVE, obs_rest * (1.0 - top) if incs else obs_rest)
        # 2. progress: productive and the spans stay; explainable causes go to the flags
        explained = np.zeros((g, m)) if incs and prog else None
        for k, v in prog.items():
            if k == PRODUCTIVE or k not in cats.explainable or not incs:
                _add(out, k, v)
                continue
            _add(out, k, v * (1.0 - top))
            explained = v * top if explained is None else explained + v * top
        if explained is not None:
            share = explained / np.where(top > 0, top, 1.0)
            for i, inc in incs:
                give(i, inc * share)
        # 3. neither: unknown
        _add(out, UNOBSERVED, unobs_rest)
        return Ledger(grid, out, flag_s)
    # A work-stopping fault: from its start its GPUs' idle, unobserved and not-productive
    # seconds are its own; observed activity after it stays as measured.
    idle_m = idle if idle is not None else np.zeros((g, m), dtype=bool)
    stopped_obs = np.where(stopped_any & idle_m, obs_rest, 0.0)
    live = obs_rest - stopped_obs
    top_live = np.where(stopped_any, 0.0, top)
    for i, inc in incs:
        give(i, np.where(stopped_any, 0.0, inc) * live)
    _add(out, PRODUCTIVE, live * (1.0 - top_live))
    explain = np.where(stopped_any, 1.0, top)
    stop_only = np.where(stopped_any, 1.0, 0.0)  # serving causes: the fault's where it stopped the GPU
    explained_prog = np.zeros((g, m))
    for k, v in prog.items():
        if k == PRODUCTIVE or (k not in cats.explainable and k not in cats.serving):
            _add(out, k, v)
            continue
        ex = explain if k in cats.explainable else stop_only
        _add(out, k, v * (1.0 - ex))
        explained_prog = explained_prog + v * ex
    _add(out, UNOBSERVED, np.where(stopped_any, 0.0, unobs_rest))
    for i, mine in stop_owner:
        give(i, np.where(mine, unobs_rest + stopped_obs + explained_prog, 0.0))
    if incs:
        share = np.where(stopped_any, 0.0, explained_prog) / np.where(top > 0, top, 1.0)
        for i, inc in incs:
            give(i, inc * share)
    return Ledger(grid, out, flag_s)


def claims_per_minute(claim_gk: np.ndarray, w_min: int, m_feat: int) -> np.ndarray:
    """A (G, K) per-window claim as (G, M) per minute (each window's minutes share its claim)."""
    if claim_gk.size == 0:
        return np.zeros((claim_gk.shape[0] if claim_gk.ndim == 2 else 0, m_feat))
    return np.repeat(claim_gk, w_min, axis=1)[:, :m_feat]


# --- serving replica-minutes -> per-minute seconds -------------------------------------------

@dataclass(frozen=True)
class ServingCell:
    """One replica-minute in ledger categories (analysis/serving/ledger.py): GPU-seconds of the
    replica's GPUs by category (``unobserved`` left out: the telemetry decides those)."""

    minute_ts: int  # epoch seconds of the minute's start
    gpu_uuids: tuple[str, ...]  # the replica's GPUs as the minute names them (() when it names none)
    seconds: Mapping[str, float]


def serving_minutes_grid(cells: Sequence[ServingCell], grid: Grid, gpu_uuids: Sequence[str]) -> dict[str, np.ndarray]:
    """Category -> (G, M) seconds of the job's replica-minutes: on the GPUs a minute names when
    the job holds them all, else spread evenly over the job's GPUs (``fold`` scales a GPU-minute
    given more than its allocated seconds down to them)."""
    g, m = grid.n_gpus, grid.m
    row = {u: i for i, u in enumerate(gpu_uuids)}
    out: dict[str, np.ndarray] = {}
    for c in cells:
        j = c.minute_ts // 60 - grid.b0
        if not 0 <= j < m or not g:
            continue
        rows = [row[u] for u in c.gpu_uuids if u in row]
        if not rows or len(rows) != len(c.gpu_uuids):
            rows = list(range(g))
        for k, v in c.seconds.items():
            if k == UNOBSERVED or not v > 0:
                continue
            a = out.setdefault(k, np.zeros((g, m)))
            a[rows, j] += v / len(rows)
    return out


# --- progress -> per-minute seconds ---------------------------------------------------------

def _spread(starts: np.ndarray, ends: np.ndarray, weights: np.ndarray, b0: int, m: int) -> np.ndarray:
    """(N, C) seconds of N intervals -> (C, M) per minute, each interval's seconds spread over
    its wall time (clipped to the grid)."""
    c = weights.shape[1]
    out = np.zeros((c, m))
    if not len(starts) or m == 0:
        return out
    span = np.maximum(ends - starts, 1e-9)
    first = np.floor(starts / 60).astype(np.int64)
    last = np.floor(np.maximum(ends - 1e-9, starts) / 60).astype(np.int64)
    for j in range(int((last - first).max()) + 1):
        mi = first + j
        ok = (mi <= last) & (mi >= b0) & (mi < b0 + m)
        if not ok.any():
            continue
        ov = np.clip(np.minimum(ends, (mi + 1) * 60.0) - np.maximum(starts, mi * 60.0), 0.0, None) / span
        for ci in range(c):
            np.add.at(out[ci], (mi - b0)[ok], (weights[:, ci] * ov)[ok])
    return out


def _lost_work(prod: np.ndarray, redone: float, procs: Sequence[Sequence[Window]], b0: int) -> np.ndarray:
    """(M,) productive seconds that were lost: the work of the processes before the last
    restart, latest first (a crash throws away what was done since the last checkpoint, just
    before it); what remains (in-process restarts) spread over the rest."""
    moved = np.zeros_like(prod)
    earlier = [w for p in procs[:-1] for w in p]
    if earlier:
        cand_all = _spread(np.array([w.start for w in earlier]), np.array([max(w.end, w.start) for w in earlier]),
                           np.array([[w.productive_s] for w in earlier]), b0, len(prod))[0]
        cand = np.minimum(cand_all, prod)[::-1]
        cum = np.cumsum(cand)
        moved = np.clip(redone - (cum - cand), 0.0, cand)[::-1].copy()
    left = redone - float(moved.sum())
    if left > 1e-9:
        rest = prod - moved
        total = float(rest.sum())
        if total > 0:
            moved += rest * min(1.0, left / total)
    return moved


def progress_minutes(windows: Sequence[Window], grid: Grid, gpu_uuids: Sequence[str], *,
                     eval_productive: bool = False, cats: Categories | None = None) -> dict[str, np.ndarray]:
    """The job's progress windows as cause -> (G, M) seconds on ``grid`` (``productive``
    included). A rank maps to the GPU named by its windows, else rank ``r`` to the job's
    ``r``-th GPU when there are as many ranks as GPUs, else every GPU gets the ranks' mean.
    Per rank: each window's productive, span, stall (``hung``) and unfinished-step
    (``restart_lost``) seconds over its wall time; steps redone after a restart move from
    productive to ``restart_lost`` (``rank_goodput``'s figure); time between the rank's first
    and last window with no process running is ``idle``; the rest of a window is ``unexplained``."""
    cats = cats or categories()
    if not windows or grid.m == 0:
        return {}
    g, m, b0 = grid.n_gpus, grid.m, grid.b0
    by_rank: dict[int, list[Window]] = defaultdict(list)
    for w in windows:
        by_rank[w.rank].append(w)
    names = [PRODUCTIVE, *cats.progress]
    col = {k: i for i, k in enumerate(names)}
    t_start, t_end = b0 * 60.0, (b0 + m) * 60.0
    alloc = Allocation(t_start, t_end, "grid")
    ranks = sorted(by_rank)
    per_rank: list[dict[str, np.ndarray]] = []  # cause -> (M,) each
    for r in ranks:
        ws = by_rank[r]
        rows = np.zeros((len(ws), len(names) + 1))  # last column: wall span covered
        extra: dict[str, np.ndarray] = {}
        for i, w in enumerate(ws):
            rows[i, col[PRODUCTIVE]] = w.productive_s
            for k, v in w.spans.items():
                key = PRODUCTIVE if (k == "eval" and eval_productive) else k
                if key in col:
                    rows[i, col[key]] += v
                else:  # a span name the job made up: its own category
                    extra.setdefault(key, np.zeros(len(ws)))[i] += v
            rows[i, col["hung"]] += w.stall_s
            rows[i, col["restart_lost"]] += w.unfinished_s
            span = max(0.0, w.end - w.start)
            acc = float(rows[i, :-1].sum()) + sum(float(e[i]) for e in extra.values())
            if acc > span > 0:  # more accounted than wall time: scale to the wall (one thing at a time)
                rows[i, :-1] *= span / acc
                for e in extra.values():
                    e[i] *= span / acc
            rows[i, col["unexplained"]] += max(0.0, span - min(acc, span)) if span > 0 else 0.0
            rows[i, -1] = span
        starts = np.array([w.start for w in ws])
        ends = np.array([max(w.end, w.start) for w in ws])
        ex = list(extra)
        weights = np.concatenate([rows, np.array([extra[k] for k in ex]).T], axis=1) if ex else rows
        spread = _spread(starts, ends, weights, b0, m)
        # Redone steps: productive -> restart_lost in the share rank_goodput finds.
        rg = rank_goodput(r, ws, alloc, eval_productive=eval_productive)
        procs = processes(ws)
        redone = float(spread[col[PRODUCTIVE]].sum()) - rg.productive_s
        if redone > 1e-9:
            moved = _lost_work(spread[col[PRODUCTIVE]], redone, procs, b0)
            spread[col[PRODUCTIVE]] -= moved
            spread[col["restart_lost"]] += moved
        # No process running between the rank's first and last windows: idle.
        covered = spread[len(names)]
        r0 = min(w.start for w in procs[0])
        r1 = max(w.end for w in procs[-1])
        edges = (b0 + np.arange(m + 1)) * 60.0
        inside = np.clip(np.minimum(edges[1:], r1) - np.maximum(edges[:-1], r0), 0.0, 60.0)
        spread[col["idle"]] += np.clip(inside - covered, 0.0, None)
        mine = {k: spread[i] for i, k in enumerate(names)}
        for j, k in enumerate(ex):  # (after the covered column)
            mine[k] = spread[len(names) + 1 + j]
        per_rank.append(mine)
    all_names = list(dict.fromkeys(k for d in per_rank for k in d))
    stacked = np.zeros((len(ranks), len(all_names), m))
    for ri, d in enumerate(per_rank):
        for ni, k in enumerate(all_names):
            if k in d:
                stacked[ri, ni] = d[k]
    uuid_row = {u: i for i, u in enumerate(gpu_uuids)}
    rows_of = [uuid_row.get(str(by_rank[r][-1].gpu)) for r in ranks]
    out = np.zeros((len(all_names), g, m))
    if g and all(x is not None for x in rows_of) and len(set(rows_of)) == len(rows_of):
        for ri, gi in enumerate(rows_of):
            out[:, gi] = stacked[ri]
    elif g and len(ranks) == g:
        for ri in range(g):
            out[:, ri] = stacked[ri]
    elif g:
        out[:] = stacked.mean(axis=0)[:, None, :]
    return {k: out[i] for i, k in enumerate(all_names) if out[i].any()}


# --- derived figures ------------------------------------------------------------------------

def summary(totals: Mapping[str, float], *, failures: int = 0, wall_s: float = 0.0,
            price: float | None = None) -> dict[str, Any]:
    """The figures every surface shows, from category totals (GPU-seconds): see docs/goodput.md,
    "Definitions". Keys in GPU-hours; None where unknown (never 0)."""
    allocated = sum(totals.values())
    unobserved = totals.get(UNOBSERVED, 0.0)
    observed = allocated - unobserved
    productive = totals.get(PRODUCTIVE, 0.0)
    waste = {k: v for k, v in totals.items() if k not in (PRODUCTIVE, UNOBSERVED) and v > 0}
    wasted = sum(waste.values())
    h = 3600.0
    return {
        "allocated_gpu_hours": round(allocated / h, 4),
        "observed_gpu_hours": round(observed / h, 4),
        "unobserved_gpu_hours": round(unobserved / h, 4),
        "productive_gpu_hours": round(productive / h, 4),
        "wasted_gpu_hours": round(wasted / h, 4),
        "coverage": round(observed / allocated, 4) if allocated > 0 else None,
        "goodput": round(min(1.0, max(0.0, productive / observed)), 4) if observed > 0 else None,
        "ettr": round(min(1.0, max(0.0, productive / allocated)), 4) if allocated > 0 else None,
        "categories": {k: round(v / h, 4) for k, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v > 0},
        "failures": failures,
        "wall_hours": round(wall_s / h, 4),
        "mtbf_hours": round(wall_s / h / failures, 4) if failures and wall_s > 0 else None,
        "cost": round(wasted / h * price, 2) if price is not None else None,
        "allocated_cost": round(allocated / h * price, 2) if price is not None else None,
    }


def add_totals(parts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for p in parts:
        for k, v in p.items():
            out[k] += v
    return dict(out)


def restarts(windows: Sequence[Window]) -> int:
    """Restarts the job's progress shows: the most any rank had (a job-wide restart restarts
    every rank: counted once, not once per rank)."""
    by_rank: dict[int, list[Window]] = defaultdict(list)
    for w in windows:
        by_rank[w.rank].append(w)
    return max((len(processes(ws)) - 1 + sum(w.restarts for w in ws) for ws in by_rank.values()), default=0)


def _scope_kind(scope: str, uuids: Sequence[str]) -> str:
    return "job" if not scope else "gpu" if scope in uuids else "node"


def _fault_rows(fd: Any, uuids: Sequence[str], nodes: Sequence[str]) -> list[int]:
    """The GPUs a fault finding names (only the GPU that faulted), else its scope's GPUs."""
    row = {u: i for i, u in enumerate(uuids)}
    named = [row[x["gpu_uuid"]] for x in (fd.evidence.get("gpus") or [])
             if isinstance(x, dict) and x.get("gpu_uuid") in row]
    if named:
        return sorted(set(named))
    if fd.scope in row:
        return [row[fd.scope]]
    return [i for i, n in enumerate(nodes) if not fd.scope or n == fd.scope]


def fold_job(uuids: Sequence[str], nodes: Sequence[str], start: float, end: float, feats: Any,
             findings: Sequence[Any], job: Any, progress: Sequence[Window] | None,
             price: float | None = None,
             serving: Sequence[ServingCell] | None = None) -> tuple[Ledger, dict[str, Any]]:
    """One job's ledger from what ``analysis.report.analyze`` has: its minute features (observed
    seconds), its findings' per-window claims (``Finding.claim``), the hardware idle split
    (``JobView.idle``), its progress windows and its serving replica-minutes. Returns the ledger
    and the report's ``ledger``."""
    cats = categories()
    g = len(uuids)
    grid = Grid.of(start, end, g)
    m_feat = feats.n.shape[1] if feats.n.ndim == 2 else 0
    interval = float(feats.interval_s)
    # A minute with half its time sampled is observed (a lost sample is not a lost second).
    sampled = feats.n * interval
    obs_feat = np.where(sampled >= 30.0, 60.0, np.minimum(sampled, 60.0)) if m_feat else np.zeros((g, 0))
    observed = grid.place(obs_feat, feats.b0)
    idle = None
    claims: list[Claim] = []
    if job is not None and m_feat:
        w_min = job.w.w_min
        idle = grid.place(claims_per_minute(job.idle.astype(np.float64), w_min, m_feat), feats.b0) > 0.5
        # Observed = judged: samples enough to judge and an activity signal (JobView.judged);
        # telemetry that cannot be judged says nothing about the second (unknown, not productive).
        judged = grid.place(claims_per_minute(job.judged.astype(np.float64), w_min, m_feat), feats.b0) > 0.5
        observed = np.where(judged, observed, 0.0)
        for fd in findings:
            frac = (grid.place(claims_per_minute(fd.claim, w_min, m_feat), feats.b0)
                    if fd.claim.size else None)
            stopped = None
            if fd.kind in cats.stops_work and fd.severity == "critical":
                stopped = np.zeros((g, grid.m), dtype=bool)
                j0 = max(0, math.floor(fd.start_ts / 60) - grid.b0)
                stopped[_fault_rows(fd, uuids, nodes), j0:] = True
            claims.append(Claim(fd.kind, fd.scope, fd.severity, frac, stopped, _scope_kind(fd.scope, uuids)))
    else:
        observed = np.zeros_like(observed)
        claims = [Claim(fd.kind, fd.scope, fd.severity, None) for fd in findings]
    prog = progress_minutes(progress, grid, uuids) if progress else None
    served = serving_minutes_grid(serving, grid, uuids) if serving else None
    led = fold(grid, observed, claims, idle=idle, progress=prog, serving=served, cats=cats)
    n_faults = sum(1 for fd in findings if fd.kind in cats.stops_work and fd.severity == "critical")
    failures = max(restarts(progress) if progress else 0, n_faults)
    names = list(led.seconds)
    # (one reduction per category, rounded in one call: a report is written every pass)
    per_gpu = np.array([led.seconds[k].sum(axis=1) for k in names]).reshape(len(names), g)
    out = summary(dict(zip(names, per_gpu.sum(axis=1).tolist(), strict=True)), failures=failures,
                  wall_s=max(0.0, end - start), price=price)
    hours = np.round(per_gpu / 3600.0, 4).tolist()
    out["by_gpu"] = [{"gpu_uuid": u, "categories": {k: h[i] for k, h in zip(names, hours, strict=True) if h[i] > 0}}
                     for i, u in enumerate(uuids)]
    out["progress"] = bool(progress)
    out["serving"] = bool(served)
    return led, out


def progress_only_gpus(windows: Sequence[Window], allocated: Sequence[str]) -> list[str]:
    """The GPUs of a job seen only through its progress (no GPU telemetry): the allocated GPUs
    when the scheduler named them, else one GPU per rank (the rank's GPU as its windows name
    it, else ``rank<r>``): a rank process drives one GPU (docs/goodput.md)."""
    if allocated:
        return list(allocated)
    last: dict[int, Window] = {}
    for w in windows:
        last[w.rank] = w
    named = [str(last[r].gpu) if last[r].gpu else f"rank{r}" for r in sorted(last)]
    # Two ranks naming one GPU (a shared device, or a relay that names none): still one row per rank.
    return named if len(set(named)) == len(named) else [f"rank{r}" for r in sorted(last)]


def fold_progress_only(windows: Sequence[Window], gpu_uuids: Sequence[str], start: float | None = None,
                       end: float | None = None) -> Ledger:
    """The ledger of a job with progress but no GPU telemetry: ``gpu_uuids`` (see
    ``progress_only_gpus``) x [start, end] (its allocation; default the extent of its windows)
    allocated; the seconds its progress covers attributed by progress (``progress_minutes``),
    the rest ``unobserved`` (no telemetry: no hardware claim, no observed second)."""
    t0 = min(w.start for w in windows) if start is None else start
    t1 = max(w.end for w in windows) if end is None else end
    grid = Grid.of(t0, t1, len(gpu_uuids))
    return fold(grid, np.zeros((grid.n_gpus, grid.m)), progress=progress_minutes(windows, grid, gpu_uuids))

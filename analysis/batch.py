"""Many jobs' minute features and windows in one set of array operations (a pass's fixed cost
per job was ~1,100 small numpy and Python calls; this module does the arithmetic-only part of
that once for all the jobs of a pass).

``build_many`` takes each job's stored states (rows of ``READ_COLUMNS``, as ``from_states``
does) and returns each job's ``MinuteFeatures`` and its ``Windows``, each element computed by
the same float operations as ``from_states`` and ``build_windows`` on that job alone, so the
reports are byte-identical to one job at a time (bench/goodput/analysis_ab.py checks it).

How: jobs whose rows hold every GPU in every minute in (minute, GPU) order (a job that
reported throughout, as ``read_states`` reads it: ``from_states``' fast path) and that share
their GPU count and minute count form a group. A group's rows are one array: the ratios are one
call over all of them, the (features, GPUs, minutes) block one transposing copy, the windows one
``build_windows`` over the group's GPUs stacked (every window operation is per GPU row along the
minutes, and the sample interval, per job, multiplies per row). Each job's arrays are then
row slices of its group's (C-contiguous views, no copies). Any other job goes through
``from_states`` and ``build_windows`` on its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from .features import ALL_FEATURES, MinuteFeatures, from_states, median1d, state_values
from .windows import WindowFeatures, Windows, build_windows

# Rows per group built at once: a bigger group streams its temporaries through memory (L3 and
# beyond) and costs more than it saves; 1,024-16,384 all beat one job at a time, 4,096 best here.
CHUNK_ROWS = 4096
_WF = tuple(f.name for f in fields(WindowFeatures))


@dataclass(frozen=True)
class Built:
    """One job's features and its windows (None: no data, nothing to window)."""

    feats: MinuteFeatures
    windows: Windows | None


def _one(data: np.ndarray, gpu_pks: list[int], window_s: float, min_coverage: float) -> Built:
    feats = from_states(data, gpu_pks)
    has = feats.n.size and feats.n.sum() > 0
    return Built(feats, build_windows(feats, window_s, min_coverage) if has else None)


def _full_grid(data: np.ndarray, gpu_pks: list[int]) -> tuple[int, int] | None:
    """(first minute, minutes) when ``data`` is every GPU of ``gpu_pks`` in every minute in
    (minute, GPU-in-``gpu_pks``-order) order (``from_states``' fast path), else None."""
    g = len(gpu_pks)
    if not len(data) or not g or len(data) % g:
        return None
    m = len(data) // g
    minute = np.floor(data[:, 0] / 60.0 + 0.5).astype(np.int64)  # from_states' minute
    b0 = int(minute[0])
    grid = minute.reshape(m, g)
    if not bool((grid == np.arange(b0, b0 + m)[:, None]).all()):
        return None
    if not bool((data[:, 1].reshape(m, g) == np.asarray(gpu_pks, dtype=np.float64)[None, :]).all()):
        return None
    if len(set(gpu_pks)) != g:
        return None  # (repeated pks: from_states' lookup decides, not this)
    return b0, m


def _interval(n: np.ndarray, first: np.ndarray, last: np.ndarray) -> float | None:
    """``state_interval``'s answer for a job whose minutes hold two samples or more somewhere
    (None otherwise: the caller asks ``state_interval``)."""
    multi = n > 1
    if not multi.any():
        return None
    sp = (last[multi] - first[multi]) / (n[multi] - 1)
    sp = sp[sp > 0]
    return max(0.1, round(median1d(sp), 1)) if len(sp) else 1.0


def build_many(jobs: Sequence[tuple[np.ndarray, list[int]]], window_s: float, min_coverage: float) -> list[Built]:
    """Each job's (states, GPU pks in row order) -> its features and windows (see the module
    docstring); ``window_s``/``min_coverage``: the thresholds' ``general`` section's."""
    out: list[Built | None] = [None] * len(jobs)
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (GPUs, minutes) -> [(job, b0)]
    for i, (data, gpu_pks) in enumerate(jobs):
        grid = _full_grid(data, gpu_pks)
        if grid is None:
            out[i] = _one(data, gpu_pks, window_s, min_coverage)
        else:
            groups.setdefault((len(gpu_pks), grid[1]), []).append((i, grid[0]))
    for (g, m), members in groups.items():
        step = max(1, CHUNK_ROWS // (g * m))
        for c in range(0, len(members), step):
            part = members[c:c + step]
            if len(part) == 1:
                i = part[0][0]
                out[i] = _one(*jobs[i], window_s, min_coverage)
            else:
                _build_group(jobs, g, m, part, window_s, min_coverage, out)
    return [b for b in out if b is not None]


def _build_group(jobs: Sequence[tuple[np.ndarray, list[int]]], g: int, m: int, members: list[tuple[int, int]],
                 window_s: float, min_coverage: float, out: list[Built | None]) -> None:
    nj = len(members)
    data = np.concatenate([jobs[i][0] for i, _ in members])  # (nj * m * g, columns), job by job
    vals, n_rows, first, last = state_values(data)
    nf = len(ALL_FEATURES)
    # (features, job, minute, GPU) -> (features, job, GPU, minute): from_states' transposing
    # copy, for the whole group in one call.
    block = np.ascontiguousarray(vals.reshape(nf, nj, m, g).transpose(0, 1, 3, 2)).reshape(nf, nj * g, m)
    n = np.ascontiguousarray(n_rows.reshape(nj, m, g).transpose(0, 2, 1)).reshape(nj * g, m)
    per_job = m * g
    intervals: list[float] = []
    for j, (i, _) in enumerate(members):
        r = slice(j * per_job, (j + 1) * per_job)
        got = _interval(n_rows[r], first[r], last[r])
        intervals.append(got if got is not None else from_states(*jobs[i]).interval_s)
    stacked = MinuteFeatures(b0=0, n=n, f={k: block[x] for x, k in enumerate(ALL_FEATURES)})
    # (the interval per GPU row: obs = n_sum * interval multiplies per element, the same product)
    w_all = build_windows(stacked, window_s, min_coverage, interval=np.repeat(intervals, g)[:, None])
    for j, (i, b0) in enumerate(members):
        rows = slice(j * g, (j + 1) * g)
        feats = MinuteFeatures(b0=b0, n=n[rows], f={k: block[x, rows] for x, k in enumerate(ALL_FEATURES)},
                               interval_s=intervals[j])
        windows = None
        if feats.n.sum() > 0:
            wf = w_all.f
            windows = Windows(w_min=w_all.w_min, b0=b0, k=w_all.k, obs_s=w_all.obs_s[rows],
                              valid=w_all.valid[rows], f=WindowFeatures(**{a: getattr(wf, a)[rows] for a in _WF}),
                              seen={k: v[rows] for k, v in w_all.seen.items()})
        out[i] = Built(feats, windows)

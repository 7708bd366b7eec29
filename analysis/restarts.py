"""Restarts seen in GPU memory (pure): a process that dies gives its memory back, so the job's
GPU memory falling to almost nothing and rising again is a restart, whatever the scheduler
says. ``crash_loop`` judges from it, and the workload classifier uses it so that a job whose
busy share swings because it keeps dying is not taken for a request-driven replica."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EMPTY_SHARE = 0.10  # memory under this share of the GPU's own peak: the process is gone
LOADED_SHARE = 0.50  # memory at half its peak or more: the process is back and working
MIN_PEAK_BYTES = 2.0 * 2**30  # a GPU that never held 2 GiB has nothing to give back (an idle context)


@dataclass(frozen=True)
class Restart:
    crash_m: int  # first minute (index) with the memory gone
    back_m: int  # first minute loaded again
    up_minutes: int  # how long it had been loaded before the crash


def job_states(fb: np.ndarray) -> np.ndarray:
    """(M,) per minute: 1 loaded, -1 empty, 0 neither or not measured, by the majority of the
    GPUs whose memory was measured in that minute (G x M bytes in; NaN = not measured)."""
    if fb.size == 0:
        return np.zeros(fb.shape[1] if fb.ndim == 2 else 0, dtype=np.int8)
    with np.errstate(invalid="ignore"):
        peak = np.where(np.isnan(fb).all(axis=1), 0.0, np.nanmax(np.where(np.isnan(fb), -np.inf, fb), axis=1))
    ok = (peak >= MIN_PEAK_BYTES)[:, None] & ~np.isnan(fb)
    loaded = ok & (fb >= LOADED_SHARE * peak[:, None])
    empty = ok & (fb < EMPTY_SHARE * peak[:, None])
    n = ok.sum(axis=0)
    state = np.zeros(fb.shape[1], dtype=np.int8)
    state[(n > 0) & (2 * loaded.sum(axis=0) > n)] = 1
    state[(n > 0) & (2 * empty.sum(axis=0) > n)] = -1
    return state


def restarts(fb: np.ndarray) -> list[Restart]:
    """Each time the job's memory went from loaded to empty and back to loaded (minutes where
    nothing was measured neither break nor make a run: an agent gap is not a crash)."""
    out: list[Restart] = []
    up_since: int | None = None
    crash: int | None = None
    last_loaded: int | None = None
    for m, s in enumerate(job_states(fb).tolist()):
        if s == 1:
            if crash is not None and up_since is not None and last_loaded is not None:
                out.append(Restart(crash, m, last_loaded - up_since + 1))
                up_since, crash = m, None
            elif up_since is None:
                up_since = m
            last_loaded = m
        elif s == -1 and up_since is not None and crash is None:
            crash = m
    return out


def empty_minutes(fb: np.ndarray) -> np.ndarray:
    """(G, M) per GPU: its memory gone (under ``EMPTY_SHARE`` of its own peak) that minute."""
    with np.errstate(invalid="ignore"):
        peak = np.nanmax(np.where(np.isnan(fb), -np.inf, fb), axis=1) if fb.size else np.zeros(0)
    return (peak >= MIN_PEAK_BYTES)[:, None] & ~np.isnan(fb) & (fb < EMPTY_SHARE * peak[:, None])

"""ETTR and badput by cause from a job's progress windows: a pure function.

Per rank, every allocated second is one of: productive step time; a span kind (init, compile,
data_wait, checkpoint_save, checkpoint_load, eval unless eval counts as productive, or any
other name the job used); ``restart_lost`` (steps redone after the step counter went back,
at the rank's mean step time, plus the step a process was in when it disappeared);
``hung`` (alive, no step for far longer than usual, no span open: unless the hardware says
the GPUs were idle, then ``idle``); ``idle`` (no process of the rank running); and
``unexplained`` (what remains). The job's figures are the mean over its ranks, so they stay
wall seconds: ETTR = productive / allocated (docs/progress.md, "Accounting").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from gpufleet.progress_fold import hist_quantile

from .model import OTHER_CAUSES, SPAN_CAUSES, Allocation, Goodput, RankGoodput, Window

GpuBusy = Callable[[float, float], bool | None]  # were the rank's GPUs busy in [t0, t1]? None = not known


def processes(windows: Iterable[Window]) -> list[list[Window]]:
    """The rank's windows grouped by process (host, pid, start), in start order."""
    groups: dict[tuple[str | None, int], list[list[Window]]] = defaultdict(list)
    for w in sorted(windows, key=lambda w: w.start):
        runs = groups[(w.host, w.pid)]
        # Only a process's first window carries process_start: another one on the same pid
        # is a new process that reused it.
        if not runs or (w.process_start is not None and runs[-1]):
            runs.append([])
        runs[-1].append(w)
    out = [r for runs in groups.values() for r in runs]
    out.sort(key=_pstart)
    return out


def _pstart(proc: Sequence[Window]) -> float:
    for w in proc:
        if w.process_start is not None:
            return w.process_start
    return proc[0].start


def process_interval(proc: Sequence[Window]) -> tuple[float, float]:
    """[start, end] of a process: its accounted seconds are exactly the time it reported."""
    t0 = _pstart(proc)
    accounted = sum(w.accounted_s for w in proc)
    end = t0 + accounted
    last = proc[-1]
    if last.alive and not last.ended:  # still running: at least up to its latest window
        end = max(end, last.end)
    return t0, end


def allocation_from_progress(windows: Sequence[Window]) -> Allocation | None:
    if not windows:
        return None
    ivs = [process_interval(p) for rank in _by_rank(windows).values() for p in processes(rank)]
    return Allocation(min(a for a, _ in ivs), max(b for _, b in ivs), "progress")


def _by_rank(windows: Iterable[Window]) -> dict[int, list[Window]]:
    d: dict[int, list[Window]] = defaultdict(list)
    for w in windows:
        d[w.rank].append(w)
    return d


def _covered(ivs: list[tuple[float, float]], a0: float, a1: float) -> float:
    total, cur0, cur1 = 0.0, None, None
    for s, e in sorted((max(a0, s), min(a1, e)) for s, e in ivs):
        if e <= s:
            continue
        if cur1 is None or s > cur1:
            if cur1 is not None and cur0 is not None:
                total += cur1 - cur0
            cur0, cur1 = s, e
        else:
            cur1 = max(cur1, e)
    if cur1 is not None and cur0 is not None:
        total += cur1 - cur0
    return total


def rank_goodput(rank: int, windows: list[Window], alloc: Allocation, *, eval_productive: bool = False,
                 gpu_busy: GpuBusy | None = None) -> RankGoodput:
    procs = processes(windows)
    productive = 0.0
    bad: dict[str, float] = defaultdict(float)
    steps = restarts = lost = 0
    hist: dict[int, int] = defaultdict(int)
    prev_max: int | None = None
    for i, proc in enumerate(procs):
        firsts = [w.first_step for w in proc if w.first_step is not None]
        if i > 0:
            restarts += 1
            if prev_max is not None and firsts and firsts[0] <= prev_max:
                lost += prev_max - firsts[0] + 1  # the new process redoes these steps
        for w in proc:
            productive += w.productive_s
            steps += w.steps
            restarts += w.restarts
            lost += w.lost_steps
            for k, v in w.spans.items():
                if k == "eval" and eval_productive:
                    productive += v
                else:
                    bad[k] += v
            if w.stall_s:
                busy = gpu_busy(w.start, w.end) if gpu_busy is not None else None
                bad["idle" if busy is False else "hung"] += w.stall_s
            bad["restart_lost"] += w.unfinished_s
            for b, n in w.step_hist.items():
                hist[int(b)] += n
        maxes = [w.max_step for w in proc if w.max_step is not None]
        if maxes:
            # After an in-process restart the process's own counter continues from its last step.
            last_step = proc[-1].last_step if proc[-1].last_step is not None else max(maxes)
            prev_max = last_step if any(w.restarts for w in proc) else max(maxes)
    mean_step = productive / steps if steps else 0.0
    redone = min(productive, lost * mean_step)
    productive -= redone
    bad["restart_lost"] += redone
    a_len = max(0.0, alloc.end - alloc.start)
    covered = _covered([process_interval(p) for p in procs], alloc.start, alloc.end)
    gap = max(0.0, a_len - covered)
    if gap:  # no process of this rank running: nothing could make progress
        bad["idle"] += gap
    accounted = productive + sum(bad.values())
    bad["unexplained"] += max(0.0, a_len - accounted)
    last = max(windows, key=lambda w: w.end)
    return RankGoodput(rank=rank, host=last.host, node=last.node, gpu=last.gpu, productive_s=productive,
                       badput_s=dict(bad), steps=steps, restarts=restarts, lost_steps=lost,
                       step_time_p50_s=hist_quantile(hist, 0.5), step_time_p95_s=hist_quantile(hist, 0.95),
                       processes=len(procs))


def job_goodput(windows: Sequence[Window], alloc: Allocation | None = None, *, eval_productive: bool = False,
                gpu_busy: GpuBusy | None = None, peak_tflops_per_gpu: float | None = None,
                n_gpus: int | None = None) -> Goodput | None:
    """The job's goodput from its windows; None without any. ``alloc`` defaults to the extent
    of the job's processes (when the scheduler's allocation is not known)."""
    if not windows:
        return None
    alloc = alloc or allocation_from_progress(windows)
    assert alloc is not None
    ranks = _by_rank(windows)
    per = [rank_goodput(r, ws, alloc, eval_productive=eval_productive, gpu_busy=gpu_busy)
           for r, ws in sorted(ranks.items())]
    n = len(per)
    allocated = max(0.0, alloc.end - alloc.start)
    productive = sum(p.productive_s for p in per) / n
    causes = [c for c in SPAN_CAUSES if not (c == "eval" and eval_productive)] + list(OTHER_CAUSES)
    extra = sorted({k for p in per for k in p.badput_s} - set(causes))
    badput = {c: sum(p.badput_s.get(c, 0.0) for p in per) / n for c in causes + extra}
    hist: dict[int, int] = defaultdict(int)
    for w in windows:
        for b, k in w.step_hist.items():
            hist[int(b)] += k
    tokens = [w.tokens for w in windows if w.tokens is not None]
    prod_wall = productive if productive > 0 else None
    tokens_per_s = sum(tokens) / prod_wall if (tokens and prod_wall) else None
    gpus = n_gpus or max((w.world_size or 0 for w in windows), default=0) or n
    flops = 0.0
    known = False
    for w in windows:
        if w.flops_per_step is not None:
            flops += w.flops_per_step * w.steps
            known = True
        elif w.params is not None and w.tokens is not None:
            flops += 6.0 * w.params * w.tokens
            known = True
    useful = sum(p.steps for p in per)
    redone = sum(p.lost_steps for p in per)
    if known and useful:
        flops *= max(0.0, (useful - redone) / useful)  # redone steps are not useful work
    achieved = flops / prod_wall / 1e12 if (known and prod_wall) else None
    mfu = achieved / (peak_tflops_per_gpu * gpus) if (achieved is not None and peak_tflops_per_gpu) else None
    return Goodput(ettr=productive / allocated if allocated > 0 else None, allocated_s=allocated,
                   productive_s=productive, badput_s=badput, tokens_per_s=tokens_per_s,
                   tokens_per_gpu_s=tokens_per_s / gpus if tokens_per_s is not None else None, mfu=mfu,
                   achieved_tflops=achieved, step_time_p50_s=hist_quantile(hist, 0.5),
                   step_time_p95_s=hist_quantile(hist, 0.95), restarts=max(p.restarts for p in per),
                   lost_steps=max(p.lost_steps for p in per), steps=max(p.steps for p in per), ranks=n,
                   allocation_source=alloc.source, eval_productive=eval_productive, per_rank=per)

"""Per-flag precision and recall of the goodput heuristics on simulated jobs with ground truth.

    .venv/bin/python bench/goodput/accuracy.py            # 15 seeds x 15 profiles = 225 jobs
    .venv/bin/python bench/goodput/accuracy.py --quick    # 4 seeds (60 jobs)

Every profile of the simulator (healthy ones too) runs once per seed with its own size,
duration and parameters; a job "raises" a kind when any finding of that kind exists (open or
resolved). Prints a table per flag kind, the healthy-job false-flag rate and timings."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simjobs import analyze_data, generate, plan_jobs

from gpufleet.agent.simulator import PROFILES
from gpufleet.analysis.config import FLAG_KINDS


def baseline(d: object) -> list[str]:
    """The reference: jobstats / Job Defense Shield style rules on the GPU utilization duty
    cycle (GPU_UTIL, what nvidia-smi and dcgm-exporter's default dashboard show), per GPU:
    every GPU at 0 -> idle; some GPUs at 0 -> oversized; job mean <= 25% -> low utilization."""
    import numpy as np

    util = d.cols["gpu_util"]  # type: ignore[attr-defined]
    per_gpu = np.bincount(d.gpu, weights=util) / np.bincount(d.gpu)  # type: ignore[attr-defined]
    if (per_gpu < 0.01).all():
        return ["idle_gpu"]
    out = ["oversized_allocation"] if (per_gpu < 0.01).any() else []
    if per_gpu.mean() <= 0.25:
        out.append("low_sm_activity")
    return out


def _one(args: tuple[object, float]) -> tuple[str, str, list[str], float, float, int, float | None, list[str]]:
    job, interval = args
    t0 = time.perf_counter()
    d = generate(job, interval_s=interval)  # type: ignore[arg-type]
    t1 = time.perf_counter()
    res = analyze_data(d)
    t2 = time.perf_counter()
    kinds = sorted({f.kind for f in res.findings})
    return (job.job_id, job.profile.name, kinds, t1 - t0, t2 - t1, len(d.ts),  # type: ignore[attr-defined]
            res.goodput_score, baseline(d))


# The worker processes' plan: a job holds its Profile, whose ``fn`` may be a closure (the
# simulator's fabric jobs), which does not pickle. Each worker builds the same plan from the
# seeds once (plan_jobs is deterministic) and is sent indexes into it.
_PLAN: list[object] = []


def _init_worker(seeds: range, max_minutes: float) -> None:
    _PLAN[:] = plan_jobs(seeds, min_minutes=40, max_minutes=max_minutes)


def _one_of_plan(args: tuple[int, float]) -> tuple[str, str, list[str], float, float, int, float | None, list[str]]:
    i, interval = args
    return _one((_PLAN[i], interval))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 seeds, shorter jobs")
    ap.add_argument("--seeds", type=int, default=15)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--interval", type=float, default=1.0, help="sampling interval, seconds (agent default 1)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    ap.add_argument("--verbose", action="store_true", help="list every misclassified job")
    a = ap.parse_args(argv)
    seeds = range(a.first_seed, a.first_seed + (4 if a.quick else a.seeds))
    max_minutes = 70 if a.quick else 100
    plan = plan_jobs(seeds, min_minutes=40, max_minutes=max_minutes)
    t0 = time.perf_counter()
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs, initializer=_init_worker, initargs=(seeds, max_minutes)) as ex:
            results = list(ex.map(_one_of_plan, [(i, a.interval) for i in range(len(plan))], chunksize=2))
    else:
        results = [_one((j, a.interval)) for j in plan]
    if [r[0] for r in results] != [j.job_id for j in plan]:  # the workers' plans are this one
        raise RuntimeError("worker processes planned other jobs than the main process")
    wall = time.perf_counter() - t0

    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    btp: Counter[str] = Counter()
    bfp: Counter[str] = Counter()
    bfn: Counter[str] = Counter()
    base_healthy_flagged = 0
    misses: list[str] = []
    healthy_jobs = healthy_flagged = 0
    by_profile: dict[str, list[float]] = defaultdict(list)
    gen_s = an_s = 0.0
    samples = 0
    for job_id, prof, kinds, g_s, a_s, n, score, base in results:
        truth = PROFILES[prof].flags
        got = set(kinds)
        for counts, found in (((tp, fp, fn), got), ((btp, bfp, bfn), set(base))):
            for k in FLAG_KINDS:
                if k in found and k in truth:
                    counts[0][k] += 1
                elif k in found:
                    counts[1][k] += 1
                elif k in truth:
                    counts[2][k] += 1
        if PROFILES[prof].healthy and base:
            base_healthy_flagged += 1
        if got != truth:
            misses.append(f"{job_id:28s} truth={sorted(truth)} got={sorted(got)}")
        if PROFILES[prof].healthy:
            healthy_jobs += 1
            healthy_flagged += bool(got)
        by_profile[prof].append(score if score is not None else float("nan"))
        gen_s += g_s
        an_s += a_s
        samples += n

    print(f"jobs: {len(results)} ({len(seeds)} seeds x {len(PROFILES)} profiles), GPU-samples: {samples:,}, "
          f"interval {a.interval:g} s")
    def pr(t: int, f: int, n: int) -> tuple[float, float]:
        return (t / (t + f) if t + f else float("nan"), t / (t + n) if t + n else float("nan"))

    print(f"{'flag':22s} {'TP':>4s} {'FP':>4s} {'FN':>4s} {'precision':>10s} {'recall':>8s}   "
          f"{'reference (GPU_UTIL rules)':>27s}")
    worst = 1.0
    for k in FLAG_KINDS:
        p, r = pr(tp[k], fp[k], fn[k])
        worst = min(worst, p if p == p else 1.0, r if r == r else 1.0)
        bp, br = pr(btp[k], bfp[k], bfn[k])
        print(f"{k:22s} {tp[k]:4d} {fp[k]:4d} {fn[k]:4d} {p:10.3f} {r:8.3f}   precision {bp:5.3f} recall {br:5.3f}")
    rate = healthy_flagged / healthy_jobs if healthy_jobs else 0.0
    print(f"healthy jobs flagged: {healthy_flagged}/{healthy_jobs} = {rate:.1%} (goal <= 2%); "
          f"reference: {base_healthy_flagged}/{healthy_jobs}")
    print(f"worst precision/recall: {worst:.3f} (goal >= 0.95)")
    print("mean goodput score by profile: " + ", ".join(
        f"{p}={sum(v) / len(v):.0%}" for p, v in sorted(by_profile.items())))
    print(f"time: wall {wall:.1f} s; simulate {gen_s:.1f} s; analyze {an_s:.2f} s "
          f"({samples / max(an_s, 1e-9) / 1e6:.1f} M GPU-samples/s per core)")
    if misses and (a.verbose or len(misses) <= 12):
        print("misclassified jobs:")
        for m in misses:
            print("  " + m)
    return 0


if __name__ == "__main__":
    sys.exit(main())

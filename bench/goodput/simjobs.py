"""Simulated jobs -> the heuristics' inputs, without a database (bench and tests share it).

The job mix: every profile of ``gpufleet.agent.simulator.PROFILES`` with a size and a
duration drawn per seed, sampled at 1 Hz like the agent."""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

import numpy as np

from gpufleet.agent.simulator import H100, PROFILES, SimJob, make_job, sample_job
from gpufleet.analysis.config import Thresholds, load_thresholds
from gpufleet.analysis.detectors import features_for
from gpufleet.analysis.features import RAW_FIELDS, histograms
from gpufleet.analysis.report import JobAnalysis, JobMeta, analyze

SIZES = (1, 2, 4, 8, 16, 24, 32)


@dataclass
class JobData:
    job: SimJob
    ts: np.ndarray
    gpu: np.ndarray
    cols: dict[str, np.ndarray]


def plan_jobs(seeds: range, *, min_minutes: float = 45, max_minutes: float = 120,
              start_ts: float = 1_790_000_000.0) -> list[SimJob]:
    jobs = []
    for seed in seeds:
        rng = random.Random(seed)
        for name, p in PROFILES.items():
            sizes = [s for s in SIZES if p.min_gpus <= s <= p.max_gpus]
            n = rng.choice(sizes)
            dur = rng.uniform(min_minutes, max_minutes) * 60
            t0 = start_ts + rng.uniform(0, 86400) + 0.5 * rng.random()
            jobs.append(make_job(p, f"{name}-{seed}", n, t0, dur))
    return jobs


def generate(job: SimJob, *, interval_s: float = 1.0, seed: int = 0, drop: float = 0.01,
             jitter_s: float = 0.05) -> JobData:
    """The job's samples; ``drop`` of them lost (agent/DCGM misses), timestamps jittered."""
    rng = random.Random(f"{seed}/{job.job_id}")
    end = job.end_ts or job.start_ts + 3600
    steps = int((end - job.start_ts) / interval_s)
    g = len(job.gpus)
    cols = {f: np.empty((steps, g)) for f in RAW_FIELDS}
    for s in range(steps):
        now = job.start_ts + (s + 1) * interval_s
        for r, values in enumerate(sample_job(job, now, rng, interval_s=interval_s)):
            for f in RAW_FIELDS:
                cols[f][s, r] = values[f]
    ts = np.repeat(job.start_ts + interval_s * np.arange(1, steps + 1), g)
    gpu = np.tile(np.arange(g), steps)
    nrng = np.random.default_rng(zlib.crc32(f"{seed}/{job.job_id}".encode()))
    ts = ts + nrng.uniform(-jitter_s, jitter_s, len(ts))
    keep = nrng.random(len(ts)) >= drop
    return JobData(job, ts[keep], gpu[keep], {f: v.reshape(-1)[keep] for f, v in cols.items()})


def meta_of(job: SimJob, running: bool = False) -> JobMeta:
    from gpufleet.agent.simulator import gpu_uuid

    return JobMeta(job_id=job.job_id, start_ts=job.start_ts, end_ts=job.end_ts, running=running,
                   gpu_uuids=[gpu_uuid(n, i) for n, i in job.gpus], gpu_nodes=[n for n, _ in job.gpus],
                   gpu_indexes=[i for _, i in job.gpus], model=H100)


def analyze_data(d: JobData, th: Thresholds | None = None) -> JobAnalysis:
    th = th or load_thresholds()
    feats = features_for(th, d.ts, d.gpu, d.cols, len(d.job.gpus))
    return analyze(meta_of(d.job), feats, histograms(d.cols), th=th,
                   first_ts=float(d.ts.min()), last_ts=float(d.ts.max()))

"""The ledger's invariants over the project's own jobs, through ``analyze`` (the product's pure
path): every profile of the demo's simulator (agent/simulator.py ``PROFILES``, the jobs
``gpufleet up`` runs) with hardware samples, the demo's progress stories (agent/sim_stories.py)
as the progress windows their processes report, and every scenario of the real-world library
(bench/realworld).

Subset, for a 2-core CI: demo jobs 20-30 minutes long at 1 Hz (the invariants do not depend on
length); scenarios with their first seed at a 10 s interval (the library's own bench scores every
seed and interval); events (XIDs) are not replayed here (the hw_fault counters are)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.agent.sim_stories import Story, story
from gpufleet.agent.simulator import PROFILES
from gpufleet.analysis.config import load_thresholds
from gpufleet.analysis.detectors import features_for
from gpufleet.analysis.features import histograms
from gpufleet.analysis.ledger import PRODUCTIVE, UNOBSERVED
from gpufleet.analysis.progress.model import Window
from gpufleet.analysis.report import JobAnalysis, JobMeta, analyze

from .test_waste_accounting import jobs as random_jobs

BENCH = Path(__file__).resolve().parents[2] / "bench"
for p in (BENCH, BENCH / "goodput"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

TH = load_thresholds()


def check(res: JobAnalysis) -> dict[str, Any]:
    """The invariants of one job's ledger; returns its category totals (GPU-hours)."""
    rep = res.report
    led = rep["ledger"]
    alloc = rep["allocated_gpu_hours"]
    cats = led["categories"]
    assert abs(sum(cats.values()) - alloc) <= 1e-3 * max(alloc, 1e-3) + 1e-3, (rep["job_id"], cats, alloc)
    assert abs(led["allocated_gpu_hours"] - alloc) <= 1e-3 * max(alloc, 1.0)
    assert led["goodput"] is None or 0.0 <= led["goodput"] <= 1.0
    assert rep["goodput_score"] == led["goodput"]
    assert led["coverage"] is None or 0.0 <= led["coverage"] <= 1.0
    # every surface's numbers derive from it: flags, waste by kind, the total. A flag's scope
    # for the bound is the GPUs it claims on (a straggler claims its peers' wait), else the job.
    per_gpu_alloc = alloc / max(rep["n_gpus"], 1)
    for fd in res.findings:
        n_scope = int((fd.claim > 0).any(axis=1).sum()) if fd.claim.size else rep["n_gpus"]
        assert 0.0 <= fd.wasted_gpu_hours <= per_gpu_alloc * n_scope + 1e-3, (fd.kind, fd.scope)
    for kind, w in rep["wasted_gpu_hours"].items():
        if kind not in ("hung",):  # (a progress hang shares the category with the hardware kind)
            assert abs(cats.get(kind, 0.0) - w) <= 1e-3, (kind, cats, w)
    waste = sum(v for k, v in cats.items() if k not in (PRODUCTIVE, UNOBSERVED))
    assert abs(rep["wasted_gpu_hours_total"] - waste) <= 1e-3
    by_gpu = led["by_gpu"]
    assert len(by_gpu) == rep["n_gpus"]
    assert abs(sum(sum(g["categories"].values()) for g in by_gpu) - alloc) <= 1e-3 * max(alloc, 1.0) + 1e-3
    return cats


def _fleet_adds_up(rows: list[tuple[str, str, dict[str, float]]]) -> None:
    fleet: dict[str, float] = {}
    by_user: dict[str, dict[str, float]] = {}
    by_account: dict[str, dict[str, float]] = {}
    for user, account, cats in rows:
        for k, v in cats.items():
            fleet[k] = fleet.get(k, 0.0) + v
            by_user.setdefault(user, {})[k] = by_user.setdefault(user, {}).get(k, 0.0) + v
            by_account.setdefault(account, {})[k] = by_account.setdefault(account, {}).get(k, 0.0) + v
    for groups in (by_user, by_account):
        for k, v in fleet.items():
            assert abs(sum(g.get(k, 0.0) for g in groups.values()) - v) <= 1e-6 * max(1.0, v)


def story_windows(st: Story, t0: float, end: float, ranks: int, uuids: list[str]) -> list[Window]:
    """The progress windows a story's ranks report (10 s windows, as the agent's relay folds
    them): train seconds are productive steps, the other phases spans; a process that dies
    stops reporting; its restart is a new pid resuming from ``first_step``."""
    out: list[Window] = []
    for rank in range(ranks):
        t = 0.0
        steps_done: dict[int, float] = {}
        started: set[int] = set()  # only a process's first window carries its start
        while t0 + t < end:
            p = st.process_at(t + 5)
            if p is None:
                t += 10
                continue
            pid = st.procs.index(p)
            prod, spans = 0.0, {}
            for s in range(10):
                ph = st.phase(t + s + 0.5)
                if ph == "train":
                    prod += 1.0
                elif ph != "down":
                    spans[ph] = spans.get(ph, 0.0) + 1.0
            done = steps_done.get(pid, 0.0)
            step = st.step_time(t, rank)
            n = int((done + prod) / step) - int(done / step)
            first = p.first_step + int(done / step)
            steps_done[pid] = done + prod
            out.append(Window(rank=rank, pid=100 + pid, start=t0 + t, end=t0 + t + 10, gpu=uuids[rank], steps=n,
                              first_step=first if n else None, last_step=first + n - 1 if n else None,
                              max_step=first + n - 1 if n else None, productive_s=prod, spans=spans,
                              process_start=None if pid in started else t0 + p.start))
            started.add(pid)
            t += 10
    return out


def test_every_demo_profile() -> None:
    from simjobs import analyze_data, generate, meta_of, plan_jobs

    rows = []
    for job in plan_jobs(range(1), min_minutes=20, max_minutes=30):
        d = generate(job)
        if job.profile.progress_flags:
            feats = features_for(TH, d.ts, d.gpu, d.cols, len(job.gpus))
            meta = meta_of(job)
            ws = story_windows(story(job.profile.name, job.seed), job.start_ts, job.end_ts or job.start_ts,
                               len(job.gpus), meta.gpu_uuids)
            res = analyze(meta, feats, histograms(d.cols), th=TH, first_ts=float(d.ts.min()),
                          last_ts=float(d.ts.max()), progress=ws)
            assert res.report["ledger"]["progress"]
        else:
            res = analyze_data(d, TH)
        rows.append((job.user, job.account, check(res)))
    assert len(rows) == len(PROFILES)
    _fleet_adds_up(rows)


def test_every_demo_profile_as_a_serving_replica() -> None:
    """Each demo job's telemetry and findings, and replica-minutes on most of its minutes (random
    splits, some naming its GPUs, some none, some a GPU it does not hold, some with nothing
    known): the same invariants, and a serving cause never holds more than the minutes gave it."""
    from simjobs import analyze_data, generate, meta_of, plan_jobs

    from gpufleet.analysis.ledger import ServingCell, categories

    rng = np.random.default_rng(39)
    causes = (PRODUCTIVE, *categories().serving, UNOBSERVED)
    rows = []
    for job in plan_jobs(range(1), min_minutes=20, max_minutes=30):
        d = generate(job)
        meta = meta_of(job)
        g = len(meta.gpu_uuids)
        cells = []
        for m in range(int(float(d.ts.min()) // 60), int(float(d.ts.max()) // 60) + 1):
            if rng.random() < 0.2:
                continue
            who = rng.integers(0, 3)
            uuids = tuple(meta.gpu_uuids) if who == 0 else () if who == 1 else ("GPU-not-this-job",)
            split = rng.dirichlet(np.ones(len(causes))) * 60.0 * g
            cells.append(ServingCell(m * 60, uuids, dict(zip(causes, split.tolist(), strict=True))))
        feats = features_for(TH, d.ts, d.gpu, d.cols, g)
        res = analyze(meta, feats, histograms(d.cols), th=TH, first_ts=float(d.ts.min()), last_ts=float(d.ts.max()),
                      serving=cells)
        assert res.report["ledger"]["serving"]
        cats = check(res)
        assert set(cats) & set(categories().serving)
        for k in categories().serving:  # a cause holds at most what the minutes gave it (a stop may take some)
            assert cats.get(k, 0.0) <= sum(c.seconds[k] for c in cells) / 3600 + 1e-3, k
        plain = check(analyze_data(d, TH))  # the same job without its minutes: same allocation
        assert abs(sum(cats.values()) - sum(plain.values())) <= 1e-3
        rows.append((job.user, job.account, cats))
    assert len(rows) == len(PROFILES)
    _fleet_adds_up(rows)


def test_restart_story_counts_the_lost_progress() -> None:
    from simjobs import generate, meta_of, plan_jobs

    job = next(j for j in plan_jobs(range(1), min_minutes=50, max_minutes=55)
               if j.profile.name == "restart_lost_progress")
    d = generate(job)
    meta = meta_of(job)
    st = story("restart_lost_progress", job.seed)
    ws = story_windows(st, job.start_ts, job.end_ts or job.start_ts, len(job.gpus), meta.gpu_uuids)
    res = analyze(meta, features_for(TH, d.ts, d.gpu, d.cols, len(job.gpus)), histograms(d.cols), th=TH,
                  progress=ws, first_ts=float(d.ts.min()), last_ts=float(d.ts.max()))
    cats = check(res)
    led = res.report["ledger"]
    assert cats.get("restart_lost", 0.0) > 0 and led["failures"] == 1 and led["mtbf_hours"] is not None
    # the score is no longer the hardware estimate beside an ETTR that disagrees: one number
    assert res.report["goodput_score"] == led["goodput"] < 0.9


def _scenario_names() -> list[str]:
    from realworld.library import REGISTRY

    return sorted(REGISTRY)


@pytest.mark.parametrize("name", _scenario_names())
def test_every_scenario_of_the_library(name: str) -> None:
    from realworld.feed import render_job
    from realworld.library import REGISTRY
    from realworld.model import instantiate

    sc = REGISTRY[name]
    rows = []
    for spec in instantiate(sc, sc.seeds[0]):
        rng = np.random.default_rng(1)
        rj = render_job(spec, base_ts=1_790_000_000.0, interval_s=10.0, rng=rng)
        ts = np.concatenate([r.ts for r in rj.gpus])
        gpu = np.concatenate([np.full(len(r.ts), i) for i, r in enumerate(rj.gpus)])
        fields = sorted({f for r in rj.gpus for f in r.cols})
        cols = {f: np.concatenate([r.cols.get(f, np.full(len(r.ts), np.nan)) for r in rj.gpus]) for f in fields}
        feats = features_for(TH, ts, gpu, cols, len(rj.gpus))
        meta = JobMeta(spec.job_id, rj.t0, rj.t0 + spec.duration_s, False, [s.uuid for s in spec.slots],
                       [s.node for s in spec.slots], [s.index for s in spec.slots], spec.slots[0].device.model
                       if hasattr(spec.slots[0].device, "model") else None)
        res = analyze(meta, feats, histograms(cols), th=TH)
        rows.append((str(spec.meta.get("user", "?")), str(spec.meta.get("account", "?")), check(res)))
    _fleet_adds_up(rows)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(random_jobs(), min_size=1, max_size=3), st.lists(st.sampled_from(["u1", "u2"]), min_size=3,
                                                                 max_size=3))
def test_random_telemetry_through_analyze(fleet: list[Any], users: list[str]) -> None:
    """Any telemetry (tests/analysis/test_waste_accounting.py's strategy: signals present or not,
    any interval, idle spells, bursts) through ``analyze``: the same invariants."""
    from .verdict_data import run

    rows = []
    for (g, minutes, interval, fn), user in zip(fleet, users, strict=False):
        rows.append((user, "acct", check(run(g, minutes, interval, fn))))
    _fleet_adds_up(rows)

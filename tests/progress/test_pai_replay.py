"""Real per-worker mini-batch times (Alibaba PAI, ../shared/data/pai-minibatch) replayed in the
client's datagram format through the relay's fold, on the trace's own clock (1 normalised unit
= 1 ms), then analysed: what the engine finds in each job (docs/progress.md, "Replays")."""

from __future__ import annotations

import csv
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from gpufleet import protocol
from gpufleet.analysis.progress.detect import slow_rank_timeline
from gpufleet.analysis.progress.flags import run_progress_pass
from gpufleet.analysis.progress.goodput import job_goodput
from gpufleet.analysis.progress.model import Window
from gpufleet.progress_fold import Folder
from gpufleet.protocol import AgentInfo, Batch, ProgressWindow
from gpufleet.storage.db import make_engine

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "pai-minibatch"
WALL0, MONO0 = 1_800_000_000.0, 100.0


def _per_worker(name: str) -> dict[int, list[tuple[int, int]]]:
    """worker -> [(iteration, normalised mini-batch time)] from one PAI trace; skips without ../shared."""
    path = DATA / name
    if not path.exists():
        pytest.skip(f"needs {path} (../shared is absent)")
    per: dict[int, list[tuple[int, int]]] = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            per[int(row["worker"])].append((int(row["time"]), int(row["batch_time_norm"])))
    return per


def replay(name: str) -> list[Window]:
    per = _per_worker(name)
    fold = Folder()
    windows: list[dict[str, Any]] = []
    for worker, its in sorted(per.items()):
        t = MONO0
        for it, norm in sorted(its):
            t += norm / 1000.0
            fold.feed({"pid": 1000 + worker, "wall0": WALL0, "mono0": MONO0, "now": t,
                       "id": {"job": name, "rank": worker, "host": f"pai-{worker // 4}", "gpu": str(worker % 4)},
                       "ev": [["s", t, it, 1024]]}, t)
    windows += fold.close_all(WALL0 + 10_000, MONO0 + 10_000)
    keys = set(Window.__dataclass_fields__) - {"start", "end", "node"}
    return [Window(start=w["start"], end=w["end"], **{k: w[k] for k in keys if k in w}) for w in windows]


def test_job_1_the_straggler_that_emerges_mid_run_is_worker_6() -> None:
    ws = replay("job_1_norm.csv")
    span = max(w.end for w in ws) - min(w.start for w in ws)
    hits = slow_rank_timeline(ws)
    ranks = {h["rank"] for h in hits}
    assert ranks == {6}, hits
    first = min(h["start"] for h in hits) - min(w.start for w in ws)
    assert 0.4 * span < first < 0.8 * span  # mid-run, not from the start
    assert max(h["ratio"] for h in hits) > 1.2
    g = job_goodput(ws)
    # Workers run unsynchronised in this trace: the fast ones finish first and sit idle until
    # the slowest one ends the job, which is what the job's ETTR shows.
    assert g is not None and g.ranks == 10 and g.ettr is not None and 0.8 < g.ettr < 1.0
    assert g.badput_s["idle"] + g.badput_s["unexplained"] == pytest.approx(g.allocated_s - g.productive_s, abs=1.0)


def test_job_2_stable_differences_between_workers_are_reported_by_rank() -> None:
    ws = replay("job_2_norm.csv")
    hits = slow_rank_timeline(ws)
    # Worker 5 runs ~12% above the median all along: below the 15% bar in most windows.
    assert len({h["start"] for h in hits}) < 0.3 * len({w.start for w in ws})


def test_job_3_several_stragglers_appear_late() -> None:
    ws = replay("job_3_norm.csv")
    t0 = min(w.start for w in ws)
    span = max(w.end for w in ws) - t0
    early: dict[int, list[float]] = defaultdict(list)
    late: dict[int, list[float]] = defaultdict(list)
    for w in ws:
        if w.step_time_p50_s is not None and w.steps >= 3:
            pos = (w.start - t0) / span
            (early if pos < 0.3 else late if pos > 0.67 else {}).setdefault(w.rank, []).append(w.step_time_p50_s)
    med = {r: (sorted(early[r])[len(early[r]) // 2], sorted(late[r])[len(late[r]) // 2]) for r in early if r in late}
    slowed = sorted(r for r, (a, b) in med.items() if b > 1.08 * a)
    assert len(slowed) >= 3, med
    hits = slow_rank_timeline(ws)
    assert {h["rank"] for h in hits} == {6, 7, 8, 9} <= set(slowed), hits  # several, all late
    assert min(h["start"] for h in hits) - t0 > 0.5 * span


def fold_expanded(name: str, job: str, wall0: float, until_s: float) -> list[tuple[int, ProgressWindow]]:
    """The trace as the client sends it, one datagram a second per worker: the release samples
    one iteration in ten, so each sampled time is replayed for the iterations up to the next
    sample (bench/realworld/progress_library.py does the same); windows closed as the relay
    closes them, up to ``until_s`` after the start; each with the second it closed."""
    per = _per_worker(name)
    steps: dict[int, list[tuple[float, int]]] = {}
    for worker, rows in per.items():
        rows.sort()
        t, out = 5.0, []
        for i, (it, norm) in enumerate(rows):
            for j in range(rows[i + 1][0] - it if i + 1 < len(rows) else 1):
                t += norm / 1000.0
                out.append((t, it + j))
        steps[worker] = out
    fold = Folder(expire_s=10.0)
    windows: list[tuple[int, ProgressWindow]] = []
    idx = dict.fromkeys(steps, 0)
    for sec in range(int(until_s) + 1):
        for worker, ss in steps.items():
            evs = []
            while idx[worker] < len(ss) and ss[idx[worker]][0] < sec:
                t, it = ss[idx[worker]]
                evs.append(["s", MONO0 + t, it, 1024])
                idx[worker] += 1
            fold.feed({"pid": 1000 + worker, "wall0": wall0, "mono0": MONO0, "now": MONO0 + sec,
                       "id": {"job": job, "rank": worker, "host": f"pai-{worker // 4}", "gpu": str(worker % 4)},
                       "ev": evs}, MONO0 + sec)
        if sec % 5 == 0:
            windows += [(sec, msgspec.convert(w, ProgressWindow)) for w in fold.close_due(wall0 + sec, MONO0 + sec)]
    return windows


def test_job_3_workers_6_to_9_are_flagged_and_job_2_is_not_through_the_collector(database_url: str,
                                                                                live_server) -> None:  # type: ignore[no-untyped-def]
    """Jobs 2 and 3 at 1 ms per unit, 30 minutes each, stored through the real collector; the
    progress pass run as the beat runs it, the flags read back from the API. Job 3's workers
    6-9 rise 20-25% over their own history late in the run, 10-30% above the peers' median:
    flagged (6 and 7 at the ratio tier or the change tier, 8 and 9 at the change tier); job 2's
    stable differences (worker 5 ~10% above all along) and job 3's workers 0-1 (~10% above all
    along) are not."""
    srv = live_server(database_url)
    engine = make_engine(database_url)
    try:
        until = 1800  # job 3's stragglers are 4-5 minutes in; every worker still running
        wall0 = (time.time() // 10) * 10 - until - 30
        folded = [fold_expanded(name, f"pai-{name[:5]}", wall0, until) for name in ("job_2_norm.csv", "job_3_norm.csv")]
        seq = 0
        for sec in range(60, until + 1, 60):  # the pass every minute, on the windows stored by then
            ws = [w for job in folded for t, w in job if sec - 60 < t <= sec]
            for i in range(0, len(ws), 400):
                seq += 1
                body, headers = protocol.encode(Batch(agent=AgentInfo(boot_id="pai", seq=seq, node="n1"),
                                                      progress=ws[i:i + 400]))
                r = httpx.post(srv.url + "/api/v1/ingest", content=body, headers=headers, timeout=60)
                assert r.status_code == 200, r.text
            if sec >= 1200:
                p = run_progress_pass(engine, wall0 + sec)
                assert p.errors == [], p
        flags = {}
        for job in ("pai-job_2", "pai-job_3"):
            j = httpx.get(f"{srv.url}/api/v1/jobs/{job}", timeout=30).json()
            flags[job] = {f["scope"]: f for f in j["flags"] if f["kind"] == "slow_rank"}
        assert flags["pai-job_2"] == {}
        assert sorted(flags["pai-job_3"]) == [f"progress:rank{r}" for r in (6, 7, 8, 9)]
        for f in flags["pai-job_3"].values():
            ev = f["evidence"]
            assert ev["ratio"] > 1.05 and ev["own_ratio"] > 1.1, ev
            assert f["start_ts"] > wall0 + 1300  # the onset, late in the run
    finally:
        engine.dispose()

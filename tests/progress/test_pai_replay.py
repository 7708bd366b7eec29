"""Real per-worker mini-batch times (Alibaba PAI, ../shared/data/pai-minibatch) replayed in the
client's datagram format through the relay's fold, on the trace's own clock (1 normalised unit
= 1 ms), then analysed: what the engine finds in each job (docs/progress.md, "Replays")."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from gpufleet.analysis.progress.detect import slow_rank_timeline
from gpufleet.analysis.progress.goodput import job_goodput
from gpufleet.analysis.progress.model import Window
from gpufleet.progress_fold import Folder

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "pai-minibatch"
WALL0, MONO0 = 1_800_000_000.0, 100.0


def replay(name: str) -> list[Window]:
    path = DATA / name
    if not path.exists():
        pytest.skip(f"needs {path} (../shared is absent)")
    per: dict[int, list[tuple[int, int]]] = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            per[int(row["worker"])].append((int(row["time"]), int(row["batch_time_norm"])))
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

"""The five progress kinds (``source = "progress"`` in the registry) become flags: each raised on
a job whose own progress shows it, none on a healthy job with periodic checkpoints and eval.

Realistic windows: training loops on an explicit clock (1 s heartbeats, 0.5 s steps, real
checkpoint/eval/init spans, processes killed and restarted from their last checkpoint) fed
through the relay's fold, then stored through the real collector (SQLite and PostgreSQL), the
periodic progress pass run, and the flags read back from the API and rendered for Slack."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import pytest

from gpufleet import protocol
from gpufleet.alerts.config import AlertConfig
from gpufleet.alerts.decide import Notification
from gpufleet.alerts.facts import FlagFact, JobFacts
from gpufleet.alerts.render import render_job
from gpufleet.analysis.progress.detect import ProgressThresholds, detect_all
from gpufleet.analysis.progress.flags import run_progress_pass
from gpufleet.analysis.progress.goodput import job_goodput
from gpufleet.analysis.progress.model import Window
from gpufleet.flagkinds import flag_kinds
from gpufleet.progress_fold import Folder
from gpufleet.protocol import AgentInfo, Batch, ProgressWindow
from gpufleet.storage.db import make_engine

PROGRESS_KINDS = sorted(k.name for k in flag_kinds().kinds if k.source == "progress")


@dataclass
class Proc:
    """One process of one rank: starts at ``t0`` (s after the job's start), spans ``init`` /
    ``compile`` / ``checkpoint_load`` first, then steps from ``first_step`` until ``t1``
    (killed: no clean exit) or the job's end, checkpointing and evaluating every N steps."""

    rank: int
    pid: int
    t0: float
    t1: float | None = None
    first_step: int = 1
    init_s: float = 20.0
    compile_s: float = 0.0
    load_s: float = 0.0
    step_s: float = 0.5
    slow_after: float | None = None  # from then on, steps take slow_step_s
    slow_step_s: float = 0.5
    ckpt_every: int = 600
    ckpt_s: float = 15.0
    eval_every: int = 900
    eval_s: float = 30.0
    host: str = ""
    gpu: str = ""
    events: list[tuple[float, list[Any]]] = field(default_factory=list)

    def plan(self, end: float, rng: random.Random) -> None:
        t = self.t0
        for kind, dur in (("init", self.init_s), ("compile", self.compile_s), ("checkpoint_load", self.load_s)):
            if dur > 0:
                self.events += [(t, ["b", t, kind]), (t + dur, ["e", t + dur, kind, dur])]
                t += dur
        stop = min(end, self.t1 if self.t1 is not None else end)
        step = self.first_step
        while True:
            st = self.slow_step_s if (self.slow_after is not None and t >= self.slow_after) else self.step_s
            t += st * rng.uniform(0.97, 1.03)
            if t >= stop:
                break
            self.events.append((t, ["s", t, step, 4096, 8]))
            for every, kind, dur in ((self.ckpt_every, "checkpoint_save", self.ckpt_s),
                                     (self.eval_every, "eval", self.eval_s)):
                if every and step % every == 0 and t + dur < stop:
                    self.events += [(t, ["b", t, kind]), (t + dur, ["e", t + dur, kind, dur])]
                    t += dur
            step += 1
        self.stop = stop


def fold(job: str, procs: list[Proc], duration_s: float, wall0: float) -> tuple[list[ProgressWindow], float]:
    """Every process's events as the client sends them (one datagram a second, heartbeats in
    between) through the relay's fold; returns the closed windows and the clock at the end."""
    rng = random.Random(job)
    for p in procs:
        p.plan(duration_s, rng)
    f = Folder(expire_s=10.0)
    out: list[dict[str, Any]] = []
    for sec in range(int(duration_s) + 1):
        for p in procs:
            if sec < p.t0 or sec > p.stop:
                continue
            evs = [e for t, e in p.events if sec <= t < sec + 1]
            ident = {"job": job, "rank": p.rank, "host": p.host or f"h{p.rank // 2}",
                     "gpu": p.gpu or str(p.rank % 2), "world": len({q.rank for q in procs})}
            f.feed({"pid": p.pid, "wall0": wall0 + p.t0, "mono0": p.t0, "id": ident, "now": float(sec),
                    "ev": evs}, float(sec))
        if sec % 5 == 0:
            out += f.close_due(wall0 + sec, float(sec))
    end = duration_s + 12.0
    out += f.close_due(wall0 + end, end)
    return [msgspec.convert(w, ProgressWindow) for w in out], wall0 + end


def scenarios(duration: float = 2400.0) -> dict[str, tuple[list[Proc], float]]:
    four = range(4)
    return {
        # LLM-style healthy run: checkpoint every 5 min (15 s), eval every 7.5 min (30 s).
        "healthy": ([Proc(r, 100 + r, 0.0) for r in four], duration),
        # The same, but every rank's step time goes from 0.5 s to 0.7 s after 25 minutes.
        "step_time_regression": ([Proc(r, 100 + r, 0.0, slow_after=1500.0, slow_step_s=0.7) for r in four],
                                 duration),
        # Rank 2 (host h1, GPU 0) steps 25% slower than its peers throughout.
        "slow_rank": ([Proc(r, 100 + r, 0.0, step_s=0.625 if r == 2 else 0.5) for r in four], duration),
        # Checkpoints every 10 min; killed twice, each time 8 minutes after the last checkpoint,
        # restarted a minute later from it (init + checkpoint_load again).
        "restart_lost_progress": ([p for r in four for p in (
            Proc(r, 100 + r, 0.0, t1=1100.0, ckpt_every=1200, ckpt_s=20.0, eval_every=0),
            Proc(r, 200 + r, 1160.0, t1=2250.0, first_step=1201, load_s=10.0, ckpt_every=1200, ckpt_s=20.0,
                 eval_every=0),
            Proc(r, 300 + r, 2310.0, first_step=2401, load_s=10.0, ckpt_every=1200, ckpt_s=20.0, eval_every=0),
        )], 3000.0),
        # A 20 s checkpoint every 100 s of training.
        "checkpoint_overhead": ([Proc(r, 100 + r, 0.0, ckpt_every=200, ckpt_s=20.0, eval_every=0) for r in four],
                                1800.0),
        # Two minutes of init and three of compile before 20 minutes of training.
        "startup_overhead": ([Proc(r, 100 + r, 0.0, init_s=120.0, compile_s=180.0) for r in four], 1500.0),
    }


def _windows(ws: list[ProgressWindow]) -> list[Window]:
    keys = set(Window.__dataclass_fields__) - {"start", "end", "node"}
    return [Window(start=w.start, end=w.end, **{k: getattr(w, k) for k in keys if hasattr(w, k)}) for w in ws]


def test_each_kind_on_its_pattern_and_none_on_a_healthy_job_pure() -> None:
    th = ProgressThresholds.load()
    reg = flag_kinds()
    for name, (procs, dur) in scenarios().items():
        ws, now = fold(name, procs, dur, 1_800_000_000.0)
        w = _windows(ws)
        g = job_goodput(w)
        assert g is not None
        found = detect_all(w, g, now, th)
        kinds = sorted({f.kind for f in found})
        assert kinds == ([] if name == "healthy" else [name]), (name, [(f.kind, f.evidence) for f in found])
        for f in found:
            undeclared = [k for k in f.evidence if reg.evidence_field(f.kind, k) is None]
            assert undeclared == [], f"{f.kind} writes undeclared evidence keys {undeclared}"
            assert f.ongoing and f.severity == reg.get(f.kind).severity
            assert 0.0 < f.wasted_rank_s <= g.allocated_s * g.ranks


def _post(url: str, ws: list[ProgressWindow], seq: int) -> None:
    for i in range(0, len(ws), 400):
        body, headers = protocol.encode(Batch(agent=AgentInfo(boot_id="pf", seq=seq * 1000 + i, node="n1"),
                                              progress=ws[i:i + 400]))
        r = httpx.post(url + "/api/v1/ingest", content=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text


def test_progress_flags_open_through_the_pass_and_resolve(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url)
    engine = make_engine(database_url)
    reg = flag_kinds()
    try:
        longest = max(d for _, d in scenarios().values())
        wall0 = (time.time() // 10) * 10 - longest - 60
        now = 0.0
        for seq, (name, (procs, dur)) in enumerate(scenarios().items()):
            # every job ends "now": its windows are the newest the collector has
            ws, end = fold(f"pf-{name}", procs, dur, wall0 + (longest - dur))
            now = max(now, end)
            _post(srv.url, ws, seq)
        p = run_progress_pass(engine, now)
        assert p.errors == [] and p.opened == 5, p
        flags = {}
        for name in scenarios():
            j = httpx.get(f"{srv.url}/api/v1/jobs/pf-{name}", timeout=30).json()
            mine = [f for f in j["flags"] if f["scope"].startswith("progress")]
            assert sorted(f["kind"] for f in mine) == ([] if name == "healthy" else [name]), (name, mine)
            flags.update({f["kind"]: f for f in mine})
        assert sorted(flags) == PROGRESS_KINDS
        for kind, f in flags.items():
            assert f["open"] and f["severity"] == reg.get(kind).severity
            assert "{" not in f["suggestion"] and "n/a" not in f["suggestion"], f["suggestion"]
            # No telemetry was analysed, so the job has no ledger: no flag books a GPU-second
            # (a flag's waste is its share of the ledger, tests/analysis/test_flag_waste_ledger.py).
            assert f["wasted_gpu_hours"] == 0.0
        slow = flags["slow_rank"]
        assert slow["scope"] == "progress:rank2"
        ev = slow["evidence"]
        assert ev["rank"] == 2 and ev["host"] == "h1" and ev["gpu"] == "0" and ev["node"] == "n1"
        assert ev["ratio"] == pytest.approx(1.25, abs=0.05)
        assert "rank 2 on host h1 (node n1, GPU 0)" in slow["suggestion"]
        rl = flags["restart_lost_progress"]["evidence"]
        assert rl["restarts"] == 2 and rl["failures"] == 2 and rl["checkpoint_cost_s"] == pytest.approx(20.0)
        assert rl["young_daly_interval_s"] == pytest.approx(
            math.sqrt(2 * rl["checkpoint_cost_s"] * rl["mtbf_s"]), rel=0.01)
        assert rl["lost_steps"] > 1000 and f"{rl['young_daly_interval_s']:,.0f} s" in \
            flags["restart_lost_progress"]["suggestion"]
        assert flags["step_time_regression"]["evidence"]["ratio"] == pytest.approx(1.4, abs=0.06)
        assert flags["checkpoint_overhead"]["evidence"]["share"] > 0.10
        assert flags["startup_overhead"]["evidence"]["compile_s"] == pytest.approx(180.0, abs=1.0)
        # Running the pass again changes nothing; once the jobs stop reporting, every flag resolves.
        again = run_progress_pass(engine, now + 1)
        assert again.opened == 0 and again.resolved == 0 and again.errors == []
        later = run_progress_pass(engine, now + 600)
        assert later.resolved == 5 and later.opened == 0, later
        after = httpx.get(f"{srv.url}/api/v1/jobs/pf-slow_rank", timeout=30).json()["flags"]
        assert [f["open"] for f in after if f["kind"] == "slow_rank"] == [False]
        # Slack renders them with the registry's titles and says where they came from.
        facts = tuple(FlagFact(kind=k, scope=f["scope"], severity=f["severity"],
                               wasted_gpu_hours=f["wasted_gpu_hours"], evidence=f["evidence"],
                               suggestion=f["suggestion"], start_ts=f["start_ts"], end_ts=f["end_ts"])
                      for k, f in flags.items())
        job = JobFacts(job_pk=1, cluster="default", job_id="pf", start_ts=now - 3000, n_gpus=4, flags=facts)
        n = Notification(event="firing", seq=1, key="k", webhook="", firing=tuple(flags), new=tuple(flags), resolved=())
        msg = render_job(AlertConfig(), job, n, now)
        text = str(msg)
        for kind in flags:
            assert reg.get(kind).title in text
        assert "rank 2" in text and "the job's progress" in text
    finally:
        engine.dispose()

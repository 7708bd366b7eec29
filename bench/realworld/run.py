"""Score the goodput engine on the real-world scenario library, through the product's path.

    .venv/bin/python bench/realworld/run.py                       # every scenario, its seeds, 1/10/30/60 s
    .venv/bin/python bench/realworld/run.py --quick               # one seed per scenario
    .venv/bin/python bench/realworld/run.py --scenario hung_collective --interval 1 --out /tmp/r.md

Per sampling interval: a fresh SQLite database at Alembic head; every scenario job rendered
at that interval and stored as protocol v1 batches through the collector's validation and
the storage write path (imported-history scenarios through the NDJSON import); the analysis
run once with ``now`` after the last sample (``gpufleet analyze``'s function); flags and
reports read back from the tables. Jobs with a deadline (hung within 15 min) are also
replayed truncated at the deadline into a second database and analyzed there, "live".
Prints a Markdown report (per-kind precision/recall, per interval, healthy jobs flagged,
accounting and confidence checks, every problem with its scenario and reason)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/ for `realworld`

import numpy as np

from realworld.feed import (
    RenderedJob,
    batches_for,
    import_ndjson,
    read_back,
    render_job,
    write_batches_checked,
)
from realworld.library import REGISTRY
from realworld.model import INTERVALS, JobSpec, instantiate
from realworld.reference import reference_kinds
from realworld.render import Rendered
from realworld.score import Outcome, Problem, fmt, markdown, score

BASE_TS = 1_790_000_000.0  # a fixed past epoch: runs are reproducible; the collector's age limit does not apply


def _fresh_db(workdir: Path, name: str) -> tuple[Any, str]:
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.migrate import upgrade

    path = workdir / f"{name}.db"
    if path.exists():
        path.unlink()
    url = f"sqlite:///{path}"
    upgrade(url)
    return make_engine(url), url


def _truncate(rj: RenderedJob, until_rel: float) -> RenderedJob:
    gpus = []
    for r in rj.gpus:
        m = r.ts < rj.t0 + until_rel
        gpus.append(Rendered(r.ts[m], {k: v[m] for k, v in r.cols.items()}))
    return RenderedJob(replace(rj.spec, duration_s=int(until_rel)), rj.t0, gpus)


def _store(engine: Any, rendered: list[RenderedJob], workdir: Path, tag: str) -> tuple[int, float]:
    """Store every job; returns (rows, newest sample ts)."""
    newest = 0.0
    rows = 0
    batch_jobs = [rj for rj in rendered if rj.spec.path == "batch"]
    nd_jobs = [rj for rj in rendered if rj.spec.path == "ndjson"]
    for rj in rendered:
        for r in rj.gpus:
            if r.ts.size:
                newest = max(newest, float(r.ts.max()))
                rows += int(r.ts.size)
    bs = batches_for(batch_jobs)
    write_batches_checked(engine, bs, now=newest + 1.0)
    import_ndjson(engine, nd_jobs, workdir / f"{tag}.ndjson")
    return rows, newest


@dataclass
class IntervalResult:
    outcomes: list[Outcome]  # what the engine raised, per job
    deadline_problems: list[Problem]
    deadline_checked: int
    timing: dict[str, float]
    reference: list[Outcome]  # what the GPU_UTIL rules conclude on the same samples


def run_interval(interval: int, names: list[str], seeds: list[int] | None, workdir: Path,
                 log: Any = None) -> IntervalResult:
    from gpufleet.analysis.runner import run_analysis

    t0 = time.perf_counter()
    engine, _ = _fresh_db(workdir, f"iv{interval}")
    live_engine = None
    labels: dict[str, tuple[str, int, JobSpec]] = {}
    rendered: list[RenderedJob] = []
    live: list[tuple[RenderedJob, str, float]] = []
    ref: dict[str, list[str]] = {}
    for name in names:
        sc = REGISTRY[name]
        if interval not in sc.intervals:
            continue
        for seed in (seeds if seeds is not None else sc.seeds):
            for spec in instantiate(sc, seed):
                if spec.job_id in labels:
                    raise RuntimeError(f"job id {spec.job_id} of {name}/{seed} collides with {labels[spec.job_id][:2]}")
                labels[spec.job_id] = (name, seed, spec)
                rng = np.random.default_rng([seed, interval, len(labels)])
                rj = render_job(spec, base_ts=BASE_TS, interval_s=interval, rng=rng)
                rendered.append(rj)
                ref[spec.job_id] = reference_kinds(rj)
                for kind, at in spec.expect(interval).deadline_s:
                    live.append((_truncate(rj, at), kind, at))
    t_gen = time.perf_counter()
    rows, newest = _store(engine, rendered, workdir, f"iv{interval}")
    del rendered
    t_store = time.perf_counter()
    summary = run_analysis(engine, now=newest + 3600.0)
    t_an = time.perf_counter()
    jobs, flags, reports = read_back(engine)
    outcomes = []
    reference = []
    for jid, (name, seed, spec) in labels.items():
        why = f"{REGISTRY[name].why} (this job: {spec.why})"
        outcomes.append(Outcome(name, seed, interval, jid, spec.expect(interval), why, flags.get(jid, []),
                                reports.get(jid)))
        if jid not in jobs:
            outcomes[-1].flags = []
        reference.append(Outcome(name, seed, interval, jid, spec.expect(interval), why,
                                 [{"kind": k, "severity": "reference", "evidence": {}} for k in ref[jid]]))
    engine.dispose()
    # Deadlines: the same jobs cut at the deadline, analyzed "now = deadline" in their own DB.
    dproblems: list[Problem] = []
    if live:
        live_engine, _ = _fresh_db(workdir, f"iv{interval}-live")
        for rj, kind, at in live:
            _, _newest_l = _store(live_engine, [rj], workdir, f"iv{interval}-live")
            run_analysis(live_engine, now=rj.t0 + at + 1.0)
            _, lflags, _ = read_back(live_engine)
            got = [f for f in lflags.get(rj.spec.job_id, []) if f["kind"] == kind]
            if not got or not any(bool(f.get("open")) for f in got):
                name, seed, spec = labels[rj.spec.job_id]
                seen = sorted({f["kind"] for f in lflags.get(rj.spec.job_id, [])})
                dproblems.append(Problem(name, seed, interval, rj.spec.job_id, "deadline",
                                         f"{kind} not open {at / 60:.0f} min after the job start "
                                         f"(15 min after the hang); raised: {seen}",
                                         REGISTRY[name].why))
        live_engine.dispose()
    t_end = time.perf_counter()
    timing = {"generate_s": t_gen - t0, "store_s": t_store - t_gen, "analyze_s": t_an - t_store,
              "deadline_s": t_end - t_an, "rows": rows, "jobs": len(labels), "analysis_errors": len(summary.errors)}
    if log:
        log(f"interval {interval:>2} s: {len(labels)} jobs, {rows} rows: generate {timing['generate_s']:.1f} s, "
            f"store {timing['store_s']:.1f} s, analyze {timing['analyze_s']:.1f} s, deadlines "
            f"{timing['deadline_s']:.1f} s"
            + (f"; analysis errors: {summary.errors[:3]}" if summary.errors else ""))
    return IntervalResult(outcomes, dproblems, len(live), timing, reference)


def scenario_table() -> str:
    """Markdown: every scenario with what it requires and allows and why."""
    rows = ["| scenario | requires | allows | intervals (s) | why |", "|---|---|---|---|---|"]
    for name in sorted(REGISTRY):
        sc = REGISTRY[name]
        req = ", ".join(f"`{k}`" for k in sorted(sc.requires)) or "nothing (healthy)"
        alw = ", ".join(f"`{k}`" for k in sorted(sc.allows)) or "-"
        rows.append(f"| `{name}` | {req} | {alw} | {', '.join(map(str, sc.intervals))} | {sc.why} |")
    return "\n".join(rows)


def _run_logged(iv: int, names: list[str], seeds: list[int] | None, work: Path) -> IntervalResult:
    return run_interval(iv, names, seeds, work, log=lambda m: print(m, file=sys.stderr, flush=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--interval", action="append", type=int, help="sampling interval(s) in s (default 1, 10, "
                                                                  "15, 30, 60 "
                    "as each scenario lists)")
    ap.add_argument("--scenario", action="append", help="only these scenarios (repeatable)")
    ap.add_argument("--seeds", type=int, default=None, help="first N seeds of every scenario (default: each "
                                                            "scenario's)")
    ap.add_argument("--quick", action="store_true", help="one seed per scenario")
    ap.add_argument("--workers", type=int, default=1, help="intervals analyzed in parallel processes (default 1)")
    ap.add_argument("--out", type=Path, help="write the Markdown report here too")
    ap.add_argument("--json", type=Path, help="write every outcome (labels, flags raised) as JSON here")
    ap.add_argument("--workdir", type=Path, help="keep the databases here (default: a temporary directory)")
    ap.add_argument("--list", action="store_true", help="print the scenario table (labels and reasons) and exit")
    args = ap.parse_args(argv)
    if args.list:
        print(scenario_table())
        return 0
    names = args.scenario or sorted(REGISTRY)
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {sorted(REGISTRY)}", file=sys.stderr)
        return 2
    intervals = args.interval or sorted({iv for n in names for iv in REGISTRY[n].intervals} | set(INTERVALS))
    seeds = [1] if args.quick else (list(range(1, args.seeds + 1)) if args.seeds else None)
    t0 = time.perf_counter()
    outcomes: list[Outcome] = []
    dprob: list[Problem] = []
    dchecked = 0
    timings = {}
    reference: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="gpufleet-realworld-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.workers > 1:  # intervals are independent databases: one process each
            with ProcessPoolExecutor(args.workers) as pool:
                results = list(pool.map(_run_logged, intervals, [names] * len(intervals),
                                        [seeds] * len(intervals), [work] * len(intervals)))
        else:
            results = [_run_logged(iv, names, seeds, work) for iv in intervals]
        for iv, res in zip(intervals, results, strict=True):
            outcomes += res.outcomes
            reference += res.reference
            dprob += res.deadline_problems
            dchecked += res.deadline_checked
            timings[iv] = res.timing
    wall = time.perf_counter() - t0
    md = markdown(outcomes, dprob, deadline_checked=dchecked)
    ref = score(reference)
    md += ("\n\nReference on the same samples (GPU_UTIL rules as jobstats / Job Defense Shield apply them; it "
           "cannot name the other kinds):\n\n| kind | recall | precision |\n|---|---:|---:|\n"
           + "\n".join(f"| `{k}` | {fmt(ks.recall)} | {fmt(ks.precision)} |" for k, ks in ref.kinds.items()
                       if ks.demanded or ks.raised)
           + f"\n\nReference healthy jobs flagged: {ref.healthy_flagged} of {ref.healthy_jobs}.")
    cmd = "bench/realworld/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    head = (f"Real-world scenario library: {len(names)} scenarios, {len(outcomes)} job-runs over intervals "
            f"{', '.join(f'{i} s' for i in intervals)}; {wall:.0f} s wall (`{cmd.strip()}`).\n")
    print(head)
    print(md)
    if args.out:
        args.out.write_text(head + "\n" + md + "\n")
    if args.json:
        args.json.write_text(json.dumps({"timings": timings, "outcomes": [
            {"scenario": o.scenario, "seed": o.seed, "interval": o.interval, "job_id": o.job_id,
             "required": sorted(o.expect.required), "allowed": sorted(o.expect.allowed),
             "any_of": [list(g) for g in o.expect.any_of], "raised": sorted(o.raised),
             "flags": [{k: f.get(k) for k in ("kind", "scope", "severity", "open", "wasted_gpu_hours", "confidence")}
                       for f in o.flags],
             "goodput_score": (o.report or {}).get("goodput_score")} for o in outcomes]}, indent=1, default=str))
    s = score(outcomes)
    return 0 if s.jobs else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""`gpufleet analyze`: run the goodput engine once over the database (due jobs, every job,
or the named ones) and print what it found. The same code `gpufleet up` runs every 30 s and
the Celery beat task runs every 60 s."""

from __future__ import annotations

import argparse
import json

from gpufleet.commands._db import add_database_args, database_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="run the goodput engine once: job reports and flags")
    add_database_args(p)
    p.add_argument("--job", action="append", default=[], metavar="JOB_ID",
                   help="analyze this job (scheduler job id; repeatable); default: every job that is due")
    p.add_argument("--cluster", default=None, help="cluster of --job (default: any)")
    p.add_argument("--all", action="store_true", help="analyze every job, due or not")
    p.add_argument("--now", type=float, default=None, help="pretend the time is this epoch second (replays)")
    p.add_argument("--json", action="store_true", help="print the summary (and reports of --job) as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from gpufleet.analysis.runner import run_analysis
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Cluster, Flag, Job, JobReport

    engine = make_engine(database_url(args))
    try:
        pks: list[int] | None = None
        with engine.connect() as conn:
            if args.job:
                q = select(Job.id).where(Job.job_id.in_(args.job))
                if args.cluster:
                    q = q.join(Cluster, Cluster.id == Job.cluster_id).where(Cluster.name == args.cluster)
                pks = list(conn.execute(q).scalars())
                if not pks:
                    print(f"gpufleet analyze: no job named {', '.join(args.job)}")
                    return 1
            elif args.all:
                pks = list(conn.execute(select(Job.id).order_by(Job.id)).scalars())
        summary = run_analysis(engine, now=args.now, job_pks=pks)
        out = summary.as_dict()
        with engine.connect() as conn:
            rows = []
            if pks:
                for pk in pks:
                    rep = conn.execute(select(Job.job_id, JobReport.report).join(JobReport, JobReport.job_pk == Job.id)
                                       .where(Job.id == pk)).first()
                    flags = conn.execute(select(Flag.kind, Flag.scope, Flag.severity, Flag.open, Flag.wasted_gpu_hours,
                                                Flag.suggestion).where(Flag.job_pk == pk)).all()
                    if rep:
                        rows.append({"job_id": rep[0], "report": rep[1],
                                     "flags": [dict(f._mapping) for f in flags]})
        if args.json:
            print(json.dumps({"summary": out, "jobs": rows}, indent=2, default=str))
            return 0
        print(f"analyzed {summary.jobs_analyzed}/{summary.jobs_due} jobs in {summary.duration_s:.2f} s: "
              f"{summary.reports_written} reports written, flags +{summary.flags_opened} opened, "
              f"{summary.flags_updated} updated, {summary.flags_resolved} resolved; {summary.jobs_closed} jobs ended")
        for r in rows:
            rep = r["report"]
            score = rep.get("goodput_score")
            # report version 2 holds a ratio 0..1 (version 1: 0..100); shown as % like everywhere
            shown = "n/a" if score is None else f"{score:.0%}" if rep.get("version", 1) >= 2 else f"{score:.0f}%"
            print(f"\njob {r['job_id']}: score {shown}, {rep.get('n_gpus')} GPUs, "
                  f"{rep.get('allocated_gpu_hours')} GPU-h allocated, {rep.get('wasted_gpu_hours_total')} wasted, "
                  f"MFU ~{rep.get('mfu', {}).get('estimate')}")
            for f in r["flags"]:
                state = "open" if f["open"] else "resolved"
                print(f"  [{f['severity']}] {f['kind']} {f['scope'] or '(job)'} ({state}, "
                      f"{f['wasted_gpu_hours']:.2f} GPU-h): {f['suggestion']}")
        for e in summary.errors:
            print(f"error: {e}")
        return 1 if summary.errors else 0
    finally:
        engine.dispose()

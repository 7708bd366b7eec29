"""`gpufleet alerts`: send a test message, check a rules file, evaluate once, manage silences,
inspect the outbox, list alerts."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from gpufleet.commands._db import add_database_args, database_url, settings_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("alerts", help="Slack alerts: test webhook, rules, silences, outbox",
                       description="Slack alerts for inefficient GPU jobs. Rules: --rules or $GPUFLEET_ALERT_RULES; "
                                   "webhook: $GPUFLEET_SLACK_WEBHOOK_URL or the rules file.")
    s = p.add_subparsers(dest="alerts_cmd", metavar="ACTION")

    t = s.add_parser("test", help="send a sample message to a webhook (no database needed)")
    t.add_argument("--webhook", help="Slack incoming webhook URL (default: the configured default webhook)")
    t.add_argument("--rules", help="rules file (for price, links, mentions)")
    t.add_argument("--timeout", type=float, default=10.0)
    t.add_argument("--print", action="store_true", help="print the payload instead of sending it")

    c = s.add_parser("check", help="validate a rules file and print the effective configuration")
    c.add_argument("--rules", help="rules file (default $GPUFLEET_ALERT_RULES)")

    e = s.add_parser("evaluate", help="evaluate alerts once and deliver what is due (in-process)")
    e.add_argument("--rules")
    e.add_argument("--dry-run", action="store_true", help="show what would be sent; change nothing")
    add_database_args(e)

    ls = s.add_parser("list", help="list alerts")
    ls.add_argument("--state", choices=["pending", "firing", "resolved"])
    add_database_args(ls)

    sil = s.add_parser("silence", help="manage silences")
    ss = sil.add_subparsers(dest="silence_cmd", metavar="ACTION")
    a = ss.add_parser("add", help="mute alerts matching ALL given matchers until expiry")
    a.add_argument("--job", help="scheduler job id")
    a.add_argument("--user")
    a.add_argument("--flag", help="flag kind, e.g. idle_gpu")
    a.add_argument("--cluster")
    a.add_argument("--expires", default="24h", help="duration: 30m, 4h, 7d (default 24h)")
    a.add_argument("--reason", required=True)
    a.add_argument("--by", default=None, help="who (default $USER)")
    add_database_args(a)
    sl = ss.add_parser("list", help="active silences")
    sl.add_argument("--all", action="store_true", help="include expired ones")
    add_database_args(sl)
    sx = ss.add_parser("expire", help="end a silence now")
    sx.add_argument("id", type=int)
    add_database_args(sx)

    o = s.add_parser("outbox", help="show queued/sent/failed notifications")
    o.add_argument("--state", choices=["pending", "sending", "sent", "failed"])
    o.add_argument("--retry-failed", action="store_true", help="put failed rows back in the queue (same keys)")
    add_database_args(o)
    p.set_defaults(func=run, _alerts_parser=p)


def _print(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        print(json.dumps(r, default=str, sort_keys=True))


def run(args: argparse.Namespace) -> int:
    from gpufleet.alerts.config import ConfigError, load_config

    cmd = getattr(args, "alerts_cmd", None)
    if cmd is None:
        args._alerts_parser.print_help()
        return 2
    try:
        if cmd == "test":
            return _test(args)
        if cmd == "check":
            cfg = load_config(args.rules)
            print(f"ok: {len(cfg.rules)} rule(s), {len(cfg.routes)} route(s), default webhook "
                  f"{'set' if cfg.default_webhook else 'NOT set'}, repeat every {cfg.repeat_interval_s:.0f}s, "
                  f"resolved messages {'on' if cfg.send_resolved else 'off'}, digest "
                  f"{'on' if cfg.digest.enabled else 'off'}")
            for r in cfg.rules:
                print(f"  rule {r.name}: {', '.join(r.flags)} >= {r.min_severity}, >= {r.min_gpus} GPU(s), "
                      f">= {r.min_duration_s:.0f}s, >= {r.min_wasted_gpu_hours} GPU-h")
            return 0
        if cmd == "silence" and getattr(args, "silence_cmd", None) is None:
            print("usage: gpufleet alerts silence {add,list,expire} ...", file=sys.stderr)
            return 2
        return _db_command(args, cmd)
    except ConfigError as e:
        print(f"gpufleet alerts: {e}", file=sys.stderr)
        return 2


def _test(args: argparse.Namespace) -> int:
    from gpufleet.alerts.config import load_config
    from gpufleet.alerts.render import render_sample
    from gpufleet.alerts.transport import classify, slack_post

    cfg = load_config(args.rules, webhook=args.webhook)
    payload = render_sample(cfg, time.time())
    if args.print:
        print(json.dumps(payload, indent=2))
        return 0
    if not cfg.default_webhook:
        print("gpufleet alerts test: give --webhook URL (or set GPUFLEET_SLACK_WEBHOOK_URL)", file=sys.stderr)
        return 2
    for attempt in range(1, 4):  # bounded: a test message is interactive
        r = slack_post(cfg.default_webhook, payload, args.timeout)
        out = classify(r, attempt, 3, 1.0, 5.0)
        if out.state == "sent":
            print(f"sent: HTTP {r.status} {r.body}")
            return 0
        if out.state == "failed":
            break
        print(f"attempt {attempt}: {r.error or f'HTTP {r.status} {r.body}'}; retrying in {out.delay_s:.1f}s",
              file=sys.stderr)
        time.sleep(min(out.delay_s, 30.0))
    print(f"gpufleet alerts test: not delivered: {r.error or f'HTTP {r.status} {r.body}'}", file=sys.stderr)
    return 1


def _db_command(args: argparse.Namespace, cmd: str) -> int:
    import os

    from gpufleet.alerts import silences as sil
    from gpufleet.alerts.config import parse_duration
    from gpufleet.alerts.runner import alert_config
    from gpufleet.storage.db import make_engine

    engine = make_engine(database_url(args))
    now = time.time()
    try:
        if cmd == "evaluate":
            settings = settings_from_args(args)
            if args.rules:
                settings = settings.replace(alerts={"rules": args.rules})
            cfg = alert_config(settings)
            if not cfg.enabled:
                print("alerts are disabled: set GPUFLEET_SLACK_WEBHOOK_URL or a rules file with a webhook",
                      file=sys.stderr)
                return 2
            if args.dry_run:
                return _dry_run(engine, cfg, now)
            from gpufleet.alerts.runner import evaluate_and_deliver

            print(json.dumps(evaluate_and_deliver(engine, cfg, now), sort_keys=True))
            return 0
        if cmd == "list":
            _print(sil.list_alerts(engine, args.state))
            return 0
        if cmd == "outbox":
            if args.retry_failed:
                print(f"requeued {sil.retry_failed(engine, now)} failed notification(s)")
            _print(sil.list_outbox(engine, args.state))
            return 0
        if cmd == "silence":
            sc = getattr(args, "silence_cmd", None)
            if sc == "add":
                new = sil.NewSilence(reason=args.reason, duration_s=parse_duration(args.expires, "--expires"),
                                     job=args.job, user=args.user, kind=args.flag, cluster=args.cluster)
                try:
                    row = sil.create_silence(engine, new, args.by or os.environ.get("USER", "cli"), now)
                except sil.SilenceError as e:
                    print(f"gpufleet alerts silence add: {e}", file=sys.stderr)
                    return 2
                _print([row])
                return 0
            if sc == "list":
                _print(sil.list_silences(engine, now, args.all))
                return 0
            if not sil.expire_silence(engine, args.id, now):
                print(f"no active silence {args.id}", file=sys.stderr)
                return 1
            print(f"silence {args.id} expired")
            return 0
    finally:
        engine.dispose()
    return 2


def _dry_run(engine: Any, cfg: Any, now: float) -> int:
    from gpufleet.alerts import store
    from gpufleet.alerts.decide import decide_job, faulty_nodes

    pks = store.candidate_job_pks(engine)
    jobs = store.load_jobs(engine, pks)
    alerts, groups = store.load_states(engine, pks)
    silences = store.active_silences(engine, now)
    bad = faulty_nodes(*store.load_faulty_node_inputs(engine))
    for pk in pks:
        if pk in jobs:
            d = decide_job(jobs[pk], cfg, alerts.get(pk, {}), groups.get(pk), silences, bad, now)
            n = d.notification
            print(json.dumps({"job": jobs[pk].job_id, "cluster": jobs[pk].cluster,
                              "event": n.event if n else None, "firing": list(n.firing) if n else [],
                              "changes": [(c.kind, c.state, c.suppressed_by) for c in d.changes]}))
    return 0

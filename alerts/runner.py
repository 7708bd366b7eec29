"""Entry points around the pure decisions: evaluate every candidate job once, and (for
``gpufleet up``, no Redis) evaluate and deliver in-process.

``gpufleet up``'s embedded loop calls ``evaluate_and_deliver_with(engine, settings)`` after each
analysis when alerts are configured (``settings.alerts.enabled``: a webhook or a rules file)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from sqlalchemy import Engine

from gpufleet.alerts import outbox, store
from gpufleet.alerts.config import AlertConfig, load_config
from gpufleet.alerts.decide import decide_job, faulty_nodes
from gpufleet.alerts.digest import enqueue_digest
from gpufleet.alerts.ratelimit import Limiter, MemoryLimiter
from gpufleet.alerts.transport import Transport, slack_post
from gpufleet.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class EvaluationResult:
    outbox_ids: list[int] = field(default_factory=list)
    jobs_seen: int = 0


def evaluate(engine: Engine, config: AlertConfig, now: float | None = None) -> EvaluationResult:
    """Decide for every job with open flags or live alerts; write decisions and outbox rows."""
    now = time.time() if now is None else now
    res = EvaluationResult()
    if not config.enabled:
        return res
    pks = store.candidate_job_pks(engine)
    jobs = store.load_jobs(engine, pks)
    alerts, groups = store.load_states(engine, pks)
    silences = store.active_silences(engine, now)
    hw, g2n = store.load_faulty_node_inputs(engine)
    bad = faulty_nodes(hw, g2n)
    for pk in pks:
        job = jobs.get(pk)
        if job is None:
            continue
        res.jobs_seen += 1
        d = decide_job(job, config, alerts.get(pk, {}), groups.get(pk), silences, bad, now)
        oid = store.apply_decision(engine, job, d, groups.get(pk), config, now)
        if oid is not None:
            res.outbox_ids.append(oid)
    res.outbox_ids.extend(enqueue_digest(engine, config, now))
    return res


_limiters: dict[tuple[float, int], MemoryLimiter] = {}


def memory_limiter(config: AlertConfig) -> MemoryLimiter:
    # One bucket set per process, shared by every call, so the pace holds across calls.
    key = (config.delivery.rate_per_s, config.delivery.burst)
    if key not in _limiters:
        _limiters[key] = MemoryLimiter(*key)
    return _limiters[key]


def evaluate_and_deliver(engine: Engine, config: AlertConfig | None = None, now: float | None = None, *,
                         limiter: Limiter | None = None, transport: Transport = slack_post,
                         deadline_s: float = 20.0) -> dict[str, int]:
    """Embedded mode: evaluate, then send what is due within ``deadline_s``; retries of failed
    posts wait in the outbox for a later call (each call is one sweep, never a long loop)."""
    config = config or load_config()
    if not config.enabled:
        return {}
    res = evaluate(engine, config, now)
    counts = outbox.deliver_due(engine, config, limiter or memory_limiter(config), transport=transport,
                                deadline_s=deadline_s)
    counts["queued"] = len(res.outbox_ids)
    return counts


def alert_config(settings: Settings) -> AlertConfig:
    """The alert config a server process runs with: the rules file and webhook from its
    settings, link bases (public URL, Grafana) filled in where the rules file leaves them empty."""
    a = settings.alerts
    return load_config(a.rules, webhook=a.slack_webhook_url).with_links(settings.base_url() if settings.http.public_url
                                                                          else "", settings.grafana.url)


def evaluate_and_deliver_with(engine: Engine, settings: Settings, now: float | None = None, *,
                              base_url: str = "") -> dict[str, int]:
    """``gpufleet up``'s hook. ``base_url`` is where this process serves (links when no public
    URL is set). A broken rules file is logged, not raised: the analysis loop must keep running."""
    from gpufleet.alerts.config import ConfigError

    try:
        config = alert_config(settings).with_links(base_url)
    except ConfigError as e:
        log.error("alerts disabled this pass: %s", e)
        return {}
    return evaluate_and_deliver(engine, config, now)


def evaluate_and_deliver_from_env(engine: Engine, now: float | None = None) -> dict[str, int]:
    """``evaluate_and_deliver_with`` on the environment's settings (tools and tests that have no
    Settings of their own)."""
    return evaluate_and_deliver_with(engine, Settings.from_env(), now)

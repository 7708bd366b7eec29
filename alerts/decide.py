"""Pure decisions: which flags alert, silences, inhibition, routing, and what a job's alert
group does now (fire, remind, resolve or nothing). No database, no clock, no network.

Semantics follow Alertmanager where it has one: group by job, repeat interval (4 h default),
inhibition (a node's ``hw_fault`` mutes the job alerts on that node), silences by matchers with
expiry, optional resolved notifications."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpufleet.alerts.config import SEVERITY_RANK, AlertConfig, Rule
from gpufleet.alerts.facts import AlertState, FlagFact, GroupState, JobFacts, SilenceFact


@dataclass(frozen=True)
class KindSummary:
    """All open flags of one kind on one job (one alert per (job, flag kind))."""

    kind: str
    severity: str
    scopes: tuple[str, ...]
    wasted_gpu_hours: float
    flags: tuple[FlagFact, ...]


@dataclass(frozen=True)
class AlertChange:
    kind: str
    state: str  # pending | firing | resolved
    suppressed_by: str | None
    severity: str
    scopes: tuple[str, ...]
    wasted_gpu_hours: float
    newly_fired: bool = False


@dataclass(frozen=True)
class Notification:
    event: str  # firing | reminder | resolved
    seq: int
    key: str
    webhook: str
    firing: tuple[str, ...]  # kinds shown as active
    new: tuple[str, ...]  # of those, fired for the first time now
    resolved: tuple[str, ...]  # kinds that stopped since the last message


@dataclass(frozen=True)
class JobDecision:
    job_pk: int
    changes: tuple[AlertChange, ...]
    notification: Notification | None
    group_state: str | None  # new alert_groups.state, None = leave alone / no group


def max_severity(sevs: Iterable[str]) -> str:
    return max(sevs, key=lambda s: SEVERITY_RANK.get(s, 0), default="info")


def summarize(flags: Iterable[FlagFact]) -> dict[str, KindSummary]:
    by: dict[str, list[FlagFact]] = {}
    for f in flags:
        if f.open:
            by.setdefault(f.kind, []).append(f)
    return {
        k: KindSummary(
            kind=k,
            severity=max_severity(f.severity for f in fs),
            scopes=tuple(sorted({f.scope for f in fs if f.scope})),
            wasted_gpu_hours=sum(f.wasted_gpu_hours for f in fs),
            flags=tuple(fs),
        )
        for k, fs in by.items()
    }


def rule_matches(rule: Rule, job: JobFacts, s: KindSummary, now: float) -> bool:
    if s.kind not in rule.flags:
        return False
    # Low-confidence verdicts (too few GPUs had the signals) are shown, never paged.
    if all(f.evidence.get("confidence") == "low" for f in s.flags):
        return False
    if SEVERITY_RANK.get(s.severity, 0) < SEVERITY_RANK[rule.min_severity]:
        return False
    if job.n_gpus < rule.min_gpus or job.runtime_s(now) < rule.min_duration_s:
        return False
    if s.wasted_gpu_hours < rule.min_wasted_gpu_hours:
        return False
    if rule.clusters and job.cluster not in rule.clusters:
        return False
    if rule.accounts and job.account not in rule.accounts:
        return False
    if rule.partitions and job.partition not in rule.partitions:
        return False
    return not (job.user and job.user in rule.exclude_users)


def alerting_kinds(job: JobFacts, config: AlertConfig, now: float) -> dict[str, KindSummary]:
    return {k: s for k, s in summarize(job.flags).items() if any(rule_matches(r, job, s, now) for r in config.rules)}


def silence_matches(s: SilenceFact, job: JobFacts, kind: str, now: float) -> bool:
    if s.expires_at <= now:
        return False
    if not any((s.job, s.user, s.kind, s.cluster)):
        return False  # an empty matcher would mute everything: refused at creation, ignored here
    return (
        (s.job is None or s.job == job.job_id)
        and (s.user is None or s.user == job.user)
        and (s.kind is None or s.kind == kind)
        and (s.cluster is None or s.cluster == job.cluster)
    )


def faulty_nodes(hw_fault_flags: Iterable[tuple[FlagFact, Sequence[str]]], gpu_to_node: Mapping[str, str]) -> set[str]:
    """Nodes named by open ``hw_fault`` flags. A flag's scope is a node, a GPU (mapped to its
    node) or "" (then the evidence's ``node``, else every node of that job)."""
    out: set[str] = set()
    for f, job_nodes in hw_fault_flags:
        if not f.open or f.kind != "hw_fault":
            continue
        if f.scope:
            out.add(gpu_to_node.get(f.scope, f.scope.split("/")[0]))
        elif isinstance(f.evidence.get("node"), str):
            out.add(f.evidence["node"])
        else:
            out.update(job_nodes)
    return out


def suppression(job: JobFacts, kind: str, silences: Sequence[SilenceFact], bad_nodes: set[str],
                now: float) -> str | None:
    for s in silences:
        if silence_matches(s, job, kind, now):
            return f"silence:{s.id}"
    if kind != "hw_fault":  # the fault itself still alerts: it is the cause
        hit = sorted(set(job.nodes) & bad_nodes)
        if hit:
            return f"inhibited:{hit[0]}"
    return None


def route_for(job: JobFacts, config: AlertConfig) -> str | None:
    for r in config.routes:
        if ((r.cluster is None or r.cluster == job.cluster) and (r.account is None or r.account == job.account)
                and (r.user is None or r.user == job.user)):
            return r.webhook
    return config.default_webhook


def idempotency_key(job: JobFacts, seq: int) -> str:
    # Derived from the job's message counter: two evaluators deciding the same thing derive
    # the same key, and the outbox's unique constraint keeps only one.
    return f"gpufleet:job:{job.job_pk}:{seq}"


def decide_job(job: JobFacts, config: AlertConfig, alerts: Mapping[str, AlertState], group: GroupState | None,
               silences: Sequence[SilenceFact], bad_nodes: set[str], now: float) -> JobDecision:
    matching = alerting_kinds(job, config, now)
    was_firing = {k for k, a in alerts.items() if a.state == "firing"}
    changes: list[AlertChange] = []
    firing: list[str] = []
    new: list[str] = []
    for kind, s in sorted(matching.items()):
        why = suppression(job, kind, silences, bad_nodes, now)
        if why:
            # Silenced or inhibited: remembered, never sent; fires later if the reason goes away.
            changes.append(AlertChange(kind, "pending", why, s.severity, s.scopes, s.wasted_gpu_hours))
            continue
        is_new = kind not in was_firing
        changes.append(AlertChange(kind, "firing", None, s.severity, s.scopes, s.wasted_gpu_hours, newly_fired=is_new))
        firing.append(kind)
        if is_new:
            new.append(kind)
    resolved = []
    for kind, a in sorted(alerts.items()):
        if a.state in ("firing", "pending") and kind not in matching:
            changes.append(AlertChange(kind, "resolved", None, "info", (), 0.0))
            if a.state == "firing":
                resolved.append(kind)
    # a firing alert that became silenced is "stopped" too, but not announced as resolved
    stopped = was_firing - set(firing)

    running = job.state == "running"
    event: str | None = None
    if new:
        event = "firing"
    elif firing and running and group is not None and now - group.last_notified_at >= config.repeat_interval_s:
        event = "reminder"
    elif not firing and resolved and config.send_resolved and running and group is not None:
        # Ended jobs resolve quietly: their flags closing says nothing about recovery.
        event = "resolved"

    group_state: str | None = None
    if firing:
        group_state = "firing"
    elif group is not None and (stopped or group.state == "firing"):
        group_state = "resolved"

    webhook = route_for(job, config)
    notification = None
    if event and webhook:
        seq = (group.notify_seq if group else 0) + 1
        notification = Notification(event, seq, idempotency_key(job, seq), webhook, tuple(firing), tuple(new),
                                    tuple(resolved))
    changed = tuple(c for c in changes if _differs(c, alerts.get(c.kind)))
    return JobDecision(job.job_pk, changed if notification is None else tuple(changes), notification, group_state)


def _differs(c: AlertChange, prev: AlertState | None) -> bool:
    # Unchanged firing rows are still rewritten (scopes and waste grow); the rest only on change.
    return prev is None or prev.state != c.state or prev.suppressed_by != c.suppressed_by or c.state == "firing"

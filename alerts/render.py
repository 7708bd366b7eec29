"""Block Kit messages: pure functions from facts to a webhook payload dict.

Every message carries a fallback ``text`` (the notification line on phones and in screen
readers), stays within Block Kit limits (``fit_limits``), and escapes user-controlled text."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from urllib.parse import quote

from gpufleet.alerts.config import SEVERITY_RANK, AlertConfig
from gpufleet.alerts.decide import KindSummary, Notification, max_severity, summarize
from gpufleet.alerts.escape import (
    MAX_BLOCKS,
    MAX_BUTTON_TEXT,
    MAX_CONTEXT_ELEMENTS,
    MAX_FALLBACK_TEXT,
    MAX_FIELD_TEXT,
    MAX_FIELDS,
    MAX_HEADER_TEXT,
    MAX_SECTION_TEXT,
    MAX_URL,
    code,
    esc,
    plain,
    truncate,
)
from gpufleet.alerts.facts import JobFacts
from gpufleet.analysis.ledger import PRODUCTIVE, UNOBSERVED, categories
from gpufleet.flagkinds import flag_kinds

SEVERITY_ICON = {"info": ":information_source:", "warning": ":warning:", "critical": ":rotating_light:"}
EVENT_TITLE = {"firing": "GPU job needs attention", "reminder": "Still wasting GPUs", "resolved": "Resolved"}
MAX_EVIDENCE_ITEMS = 8
MAX_FLAG_SECTIONS = 10


def fmt_duration(s: float) -> str:
    s = int(max(0, s))
    d, r = divmod(s, 86400)
    h, r = divmod(r, 3600)
    m = r // 60
    if d:
        return f"{d}d {h}h"
    if h:
        return f"{h}h {m}m"
    return f"{m}m"


def cost(config: AlertConfig, gpu_hours: float) -> str:
    if config.price_per_gpu_hour <= 0:
        return ""
    return f" (~{gpu_hours * config.price_per_gpu_hour:,.2f} {esc(config.currency)})"


def job_url(config: AlertConfig, job: JobFacts) -> str | None:
    if not config.base_url:
        return None
    path = config.job_path.format(job_pk=job.job_pk, cluster=quote(job.cluster, safe=""),
                                  job_id=quote(job.job_id, safe=""))
    return config.base_url.rstrip("/") + path


def grafana_url(config: AlertConfig, job: JobFacts, now: float) -> str | None:
    if not config.grafana_url:
        return None
    start = job.start_ts if job.start_ts is not None else now - 3600
    end = job.end_ts if job.end_ts is not None else now
    path = config.grafana_job_path.format(
        cluster=quote(job.cluster, safe=""), job_id=quote(job.job_id, safe=""), job_pk=job.job_pk,
        from_ms=int(start * 1000), to_ms=int(end * 1000))
    return config.grafana_url.rstrip("/") + path


def user_ref(config: AlertConfig, user: str | None) -> str:
    if not user:
        return "-"
    member = config.mentions.get(user)
    # Member ids come from the operator's config, not from job data; still only [A-Z0-9].
    if member and member.isalnum():
        return f"<@{member}> ({code(user, 64)})"
    return code(user, 64)


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": truncate(text, MAX_SECTION_TEXT)}}


def _context(*texts: str) -> dict[str, Any]:
    return {"type": "context",
            "elements": [{"type": "mrkdwn", "text": truncate(t, MAX_SECTION_TEXT)}
                         for t in texts[:MAX_CONTEXT_ELEMENTS]]}


def _evidence(kind: str, ev: dict[str, Any]) -> str:
    """Labels and units from the registry ("NVLink utilisation `89.9%`"), never raw keys."""
    items = []
    for k, v in list(ev.items())[:MAX_EVIDENCE_ITEMS]:
        label, text = flag_kinds().evidence_text(kind, str(k), v)
        items.append(f"{esc(truncate(label, 40))} {code(text, 80)}")
    more = len(ev) - MAX_EVIDENCE_ITEMS
    return ", ".join(items) + (f" (+{more} more)" if more > 0 else "")


PROGRESS_SCOPE = "progress"  # flags from the job's own progress (analysis/progress/flags.py)


def scope_text(scope: str) -> str:
    """A flag's scope for people: a node or GPU as code; the job's progress in words
    (``progress``, or ``progress:rank<N>`` for one rank)."""
    if scope == PROGRESS_SCOPE:
        return "the job's progress"
    if scope.startswith(PROGRESS_SCOPE + ":rank"):
        return f"rank {esc(truncate(scope.split(':rank', 1)[1], 12))} (the job's progress)"
    return code(scope, 60)


def flag_section(config: AlertConfig, s: KindSummary, is_new: bool) -> dict[str, Any]:
    title = flag_kinds().title(s.kind)
    scopes = f" on {', '.join(scope_text(x) for x in s.scopes[:6])}" if s.scopes else ""
    if len(s.scopes) > 6:
        scopes += f" +{len(s.scopes) - 6}"
    # Severity is not waste: a fault that claims no GPU-hours (a degraded NIC, an XID) says so
    # instead of "0.0 GPU-h wasted", which reads as "harmless"
    waste = (f"{s.wasted_gpu_hours:.1f} GPU-h wasted{cost(config, s.wasted_gpu_hours)}" if s.wasted_gpu_hours >= 0.05
             else f"{s.severity}, no GPU time of its own")
    lines = [f"{SEVERITY_ICON.get(s.severity, '')} *{esc(title)}*{' (new)' if is_new else ''}{scopes} — {waste}"]
    for f in s.flags[:3]:
        if f.evidence:
            lines.append(f"Evidence: {_evidence(f.kind, f.evidence)}")
    sugg = next((f.suggestion for f in s.flags if f.suggestion), "")
    if sugg:
        lines.append(f"_Suggestion:_ {esc(truncate(sugg, 1200))}")
    return _section("\n".join(lines))


def pct_text(v: Any) -> str:
    """A ratio 0..1 as a whole percentage, rounded half away from zero like the web pages
    (api/static/fmt.js); unknown reads "not known"."""
    if not isinstance(v, int | float):
        return "not known"
    # on the API number's decimal digits, shifted exactly (not v * 100 in binary): 0.1505 is 15%,
    # 0.125 is 13%, as fmt.js rounds them
    return f"{Decimal(repr(float(v))).scaleb(2).quantize(Decimal(1), rounding=ROUND_HALF_UP)}%"


def waste_by_cause(job: JobFacts, top: int = 3) -> str:
    """The ledger's largest badput categories, by the registry's / ledger's titles."""
    cats = (job.ledger or {}).get("categories") or {}
    titles = {c["name"]: c["title"] for c in categories().as_json()}
    bad = sorted(((k, float(v)) for k, v in cats.items() if k not in (PRODUCTIVE, UNOBSERVED) and v),
                 key=lambda kv: -kv[1])
    parts = [f"{esc(titles.get(k, k))} {v:.1f}" for k, v in bad[:top]]
    return ", ".join(parts) + (f" +{len(bad) - top} more" if len(bad) > top else "") if parts else "none"


def job_fields(config: AlertConfig, job: JobFacts, now: float) -> list[dict[str, Any]]:
    nodes = ", ".join(code(n, 60) for n in job.nodes[:8]) + (f" +{len(job.nodes) - 8}" if len(job.nodes) > 8 else "")
    models = ", ".join(sorted({esc(m) for m in job.gpu_models})) or "GPU"
    led = job.ledger or {}
    # One model (the GPU-time ledger, docs/goodput.md): goodput is productive over observed GPU
    # time, with the observed share of the allocation beside it; no separate hardware score.
    if led:
        goodput = (f"*Goodput*\n{pct_text(led.get('goodput'))} of observed GPU time · "
                   f"coverage {pct_text(led.get('coverage'))}")
    else:
        goodput = f"*Goodput*\n{pct_text(job.goodput_score)}"
    fields = [
        f"*Job*\n{code(job.job_id, 64)} {code(job.name or '-', 120)}",
        f"*User*\n{user_ref(config, job.user)}",
        f"*Cluster / account / partition*\n{code(job.cluster, 60)} / {code(job.account or '-', 60)} / "
        f"{code(job.partition or '-', 60)}",
        f"*GPUs / nodes*\n{job.n_gpus} x {models} on {nodes or '-'}",
        f"*Runtime*\n{fmt_duration(job.runtime_s(now))}{' (ended)' if job.state != 'running' else ''}",
        goodput,
        f"*Wasted*\n{job.wasted_gpu_hours_total:.1f} of {job.allocated_gpu_hours:.1f} GPU-h"
        f"{cost(config, job.wasted_gpu_hours_total)}",
    ]
    if led:
        fields.append(f"*Waste by cause (GPU-h)*\n{waste_by_cause(job)}")
    return [{"type": "mrkdwn", "text": truncate(f, MAX_FIELD_TEXT)} for f in fields[:MAX_FIELDS]]


def _buttons(config: AlertConfig, job: JobFacts, now: float) -> dict[str, Any] | None:
    els = []
    for label, url in (("Job page", job_url(config, job)), ("Grafana", grafana_url(config, job, now))):
        if url and len(url) <= MAX_URL:
            els.append({"type": "button", "text": {"type": "plain_text", "text": plain(label, MAX_BUTTON_TEXT)},
                        "url": url})
    return {"type": "actions", "elements": els} if els else None


def render_job(config: AlertConfig, job: JobFacts, n: Notification, now: float) -> dict[str, Any]:
    summaries = summarize(job.flags)
    # most severe first, then most wasteful (severity is not waste); the first MAX_FLAG_SECTIONS
    # get a section, the rest are named in one line, so a job with many kinds stays readable
    firing = sorted((summaries[k] for k in n.firing if k in summaries),
                    key=lambda x: (-SEVERITY_RANK.get(x.severity, 0), -x.wasted_gpu_hours))
    shown, rest = firing[:MAX_FLAG_SECTIONS], firing[MAX_FLAG_SECTIONS:]
    sev = max_severity(s.severity for s in firing) if firing else "info"
    icon = ":white_check_mark:" if n.event == "resolved" else SEVERITY_ICON.get(sev, "")
    head = f"{EVENT_TITLE[n.event]}: job {job.job_id} ({job.user or 'unknown user'})"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": plain(head, MAX_HEADER_TEXT), "emoji": True}},
        {"type": "section", "fields": job_fields(config, job, now)},
    ]
    if n.event == "resolved":
        blocks.append(_section(f"{icon} No longer flagged: "
                               + ", ".join(esc(flag_kinds().title(k)) for k in n.resolved)))
    for s in shown:
        blocks.append(flag_section(config, s, s.kind in n.new))
    if rest:
        blocks.append(_context(f"Also flagged ({len(rest)} more, on the job page): "
                               + ", ".join(f"{esc(flag_kinds().title(x.kind))} ({x.severity})" for x in rest)))
    if n.resolved and n.event != "resolved":
        gone = ", ".join(esc(flag_kinds().title(k)) for k in n.resolved)
        blocks.append(_context(f"Resolved since the last message: {gone}"))
    b = _buttons(config, job, now)
    if b:
        blocks.append(b)
    blocks.append(_context(f"Silence: `gpufleet alerts silence add --job {code(job.job_id, 64).strip('`')} "
                           f"--cluster {code(job.cluster, 60).strip('`')} --expires 24h --reason ...`",
                           f"id {esc(n.key)}"))
    kinds = ", ".join(flag_kinds().title(k) for k in ([x.kind for x in firing] or n.firing or n.resolved))
    text = (f"{EVENT_TITLE[n.event]}: job {esc(job.job_id)} of {esc(job.user or 'unknown user')} on "
            f"{esc(job.cluster)}: {esc(kinds)}; {job.wasted_gpu_hours_total:.1f} GPU-h wasted"
            f"{cost(config, job.wasted_gpu_hours_total)}")
    return fit_limits({"text": text, "blocks": blocks, "unfurl_links": False, "unfurl_media": False})


def fit_limits(payload: dict[str, Any]) -> dict[str, Any]:
    """Enforce Block Kit limits whatever came in: <= 50 blocks (the tail becomes a note),
    section text <= 3000, fields <= 10 x 2000, header <= 150, fallback text bounded."""
    blocks = list(payload.get("blocks") or [])
    if len(blocks) > MAX_BLOCKS:
        dropped = len(blocks) - (MAX_BLOCKS - 1)
        blocks = [*blocks[: MAX_BLOCKS - 1], _context(f"… {dropped} more block(s) not shown")]
    for b in blocks:
        t = b.get("text")
        if isinstance(t, dict) and "text" in t:
            lim = MAX_HEADER_TEXT if b["type"] == "header" else MAX_SECTION_TEXT
            t["text"] = truncate(t["text"], lim)
        if "fields" in b:
            b["fields"] = b["fields"][:MAX_FIELDS]
            for f in b["fields"]:
                f["text"] = truncate(f["text"], MAX_FIELD_TEXT)
        if b.get("type") == "context":
            b["elements"] = b["elements"][:MAX_CONTEXT_ELEMENTS]
    return {**payload, "blocks": blocks, "text": truncate(str(payload.get("text", "")), MAX_FALLBACK_TEXT)}


def sample_job(now: float) -> JobFacts:
    """A made-up job for ``gpufleet alerts test``."""
    from gpufleet.alerts.facts import FlagFact

    return JobFacts(
        job_pk=0, cluster="default", job_id="12345", user="alice", name="llama-finetune <test message>",
        account="nlp", partition="gpu", state="running", start_ts=now - 5 * 3600, n_gpus=8,
        nodes=("gpu-node-01",), gpu_models=("H100 80GB HBM3",), goodput_score=0.31, allocated_gpu_hours=40.0,
        wasted_gpu_hours_total=27.5,
        flags=(
            FlagFact("idle_gpu", "gpu-node-01/gpu6", "critical", 5.0, {"gpu_util_max": 0.0, "minutes": 300},
                     "GPUs 6-7 did nothing for 5 h: request 6 GPUs, or check the launcher's world size."),
            FlagFact("input_stall", "", "warning", 22.5, {"sm_active_mean": 0.18, "cpu_wait_share": 0.6},
                     "The data loader starves the GPUs: raise num_workers, pin memory, prefetch."),
        ),
    )


def render_sample(config: AlertConfig, now: float) -> dict[str, Any]:
    job = sample_job(now)
    n = Notification("firing", 1, "gpufleet:test", "", ("idle_gpu", "input_stall"), ("idle_gpu", "input_stall"), ())
    p = render_job(config, job, n, now)
    p["blocks"].insert(1, _section(":test_tube: *Test message from `gpufleet alerts test`*: if you see this, "
                                   "the webhook works."))
    p["text"] = "gpufleet test message: " + p["text"]
    return fit_limits(p)


def render_digest(config: AlertConfig, teams: Sequence[tuple[str, float, list[dict[str, Any]]]],
                  day: str) -> dict[str, Any]:
    """``teams``: (account, wasted GPU-h, top jobs as dicts job_id/user/name/wasted/score), worst first."""
    total = sum(w for _, w, _ in teams)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": plain(f"GPU waste digest {day}", MAX_HEADER_TEXT)}},
        _section(f"*{total:.1f} GPU-h* wasted{cost(config, total)} across {len(teams)} team(s) in the last "
                 f"{fmt_duration(config.digest.window_s)}."),
    ]
    for account, wasted, jobs in teams[: MAX_BLOCKS - 4]:
        lines = [f"*{esc(account or 'no account')}*: {wasted:.1f} GPU-h{cost(config, wasted)}"]
        for j in jobs:
            score = "" if j.get("score") is None else f", goodput {pct_text(j['score'])}"
            lines.append(f"• {code(j['job_id'], 64)} {code(j.get('name') or '-', 80)} "
                         f"{user_ref(config, j.get('user'))}: {j['wasted']:.1f} GPU-h{score}")
        blocks.append(_section("\n".join(lines)))
    text = f"GPU waste digest {day}: {total:.1f} GPU-h wasted{cost(config, total)}"
    return fit_limits({"text": text, "blocks": blocks, "unfurl_links": False, "unfurl_media": False})

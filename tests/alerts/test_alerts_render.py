"""Block Kit rendering: escaping of user-controlled text and Block Kit limits, for any input."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.alerts.config import FLAG_KINDS, AlertConfig
from gpufleet.alerts.decide import Notification
from gpufleet.alerts.escape import code, esc, truncate
from gpufleet.alerts.facts import FlagFact, JobFacts
from gpufleet.alerts.render import fit_limits, pct_text, render_digest, render_job, render_sample

NOW = 1_800_000_000.0
CFG = AlertConfig(default_webhook="http://x", base_url="https://fleet.example", grafana_url="https://grafana.example",
                  price_per_gpu_hour=2.5, mentions={"alice": "U012AB3CD"})
EVIL = "<!channel> <@U999> <https://evil.example|click me> @here &amp; `x` *b* \x00\x1b"


def all_mrkdwn(payload: dict[str, Any]) -> list[str]:
    out = [payload["text"]]
    for b in payload["blocks"]:
        if isinstance(b.get("text"), dict) and b["text"].get("type") == "mrkdwn":
            out.append(b["text"]["text"])
        for f in b.get("fields", []):
            out.append(f["text"])
        for e in b.get("elements", []):
            if e.get("type") == "mrkdwn":
                out.append(e["text"])
    return out


def assert_limits(p: dict[str, Any]) -> None:
    assert len(p["blocks"]) <= 50
    assert p["text"] and len(p["text"]) <= 3000
    for b in p["blocks"]:
        if b["type"] == "header":
            assert len(b["text"]["text"]) <= 150 and b["text"]["type"] == "plain_text"
        elif b["type"] == "section":
            if "text" in b:
                assert len(b["text"]["text"]) <= 3000
            assert len(b.get("fields", [])) <= 10
            assert all(len(f["text"]) <= 2000 for f in b.get("fields", []))
        elif b["type"] == "context":
            assert len(b["elements"]) <= 10


def job(name: str = "train", user: str = "alice", flags: tuple[FlagFact, ...] = (), **kw: Any) -> JobFacts:
    base: dict[str, Any] = dict(job_pk=7, cluster="prod", job_id="4242", user=user, name=name, account="nlp",
                                partition="gpu", start_ts=NOW - 7200, n_gpus=8, nodes=("node-a", "node-b"),
                                gpu_models=("H100",), goodput_score=0.42, allocated_gpu_hours=16,
                                wasted_gpu_hours_total=9.3,
                                flags=flags or (FlagFact("idle_gpu", "node-a", "critical", 4.0, {"sm": 0.0},
                                                         "Free it"),))
    base.update(kw)
    return JobFacts(**base)


def note(kinds: tuple[str, ...] = ("idle_gpu",), event: str = "firing") -> Notification:
    return Notification(event, 1, "gpufleet:job:7:1", "http://x", kinds, kinds, ())


def test_message_content() -> None:
    p = render_job(CFG, job(), note(), NOW)
    text = json.dumps(p)
    for want in ("4242", "<@U012AB3CD>", "8 x H100", "node-a", "2h 0m", "42%", "Idle GPUs", "Free it",
                 "9.3 of 16.0 GPU-h", "23.25 USD", "https://fleet.example/jobs/4242?cluster=prod", "https://grafana.example/d/",
                 "var-job=7", "gpufleet:job:7:1"):
        assert want in text, want
    assert p["unfurl_links"] is False
    assert_limits(p)


def test_injection_through_job_name_user_and_evidence_is_neutralised() -> None:
    f = FlagFact("input_stall", EVIL, "warning", 2.0, {EVIL: EVIL, "n": 3}, EVIL)
    p = render_job(CFG, job(name=EVIL, user=EVIL, account=EVIL, partition=EVIL, cluster=EVIL, job_id=EVIL,
                            nodes=(EVIL,), flags=(f,)), note(("input_stall",)), NOW)
    for t in all_mrkdwn(p):
        assert "<!channel>" not in t and "<@U999>" not in t and "<https://evil" not in t
        assert "@here" not in t.replace("@\u200bhere", "")
        # the only links and mentions left are ours
        for m in re.findall(r"<([^>]*)>", t):
            assert m.startswith(("https://fleet.example", "https://grafana.example", "@U012AB3CD")), m
    header = p["blocks"][0]["text"]
    assert header["type"] == "plain_text" and "\x00" not in header["text"]


def test_escape_primitives() -> None:
    assert esc("a<b>&c") == "a&lt;b&gt;&amp;c"
    assert esc("@channel hi") == "@\u200bchannel hi"
    assert code("x`y") == "`xˋy`"
    assert truncate("abc&amp;def", 6) == "abc…"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.text(max_size=5000),
    user=st.text(max_size=300),
    ev=st.dictionaries(st.text(max_size=50), st.one_of(st.text(max_size=2000), st.floats(allow_nan=True),
                                                       st.integers()), max_size=30),
    sugg=st.text(max_size=6000),
    n_scopes=st.integers(0, 40),
)
def test_limits_hold_for_any_input(name: str, user: str, ev: dict[str, Any], sugg: str, n_scopes: int) -> None:
    flags = tuple(FlagFact(k, f"node-{i}" if n_scopes else "", "warning", 1.5, ev, sugg)
                  for k in FLAG_KINDS for i in range(max(1, n_scopes)))
    p = render_job(CFG, job(name=name, user=user, flags=flags, nodes=tuple(f"n{i}" for i in range(n_scopes))),
                   note(FLAG_KINDS), NOW)
    assert_limits(p)
    assert len(json.dumps(p)) < 60_000  # 10 flag sections at most (the rest named in one line)
    for t in all_mrkdwn(p):
        assert "<!" not in t


def test_fit_limits_cuts_blocks_and_text() -> None:
    p = fit_limits({"text": "x" * 50_000, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "y" * 9000}}
                                                    for _ in range(80)]})
    assert_limits(p)
    assert "more block" in json.dumps(p["blocks"][-1])


def test_sample_and_digest_render_within_limits() -> None:
    assert_limits(render_sample(CFG, NOW))
    teams = [(f"team{i}<!here>", 100.0 - i, [{"job_id": str(j), "user": "alice", "name": EVIL, "wasted": 3.0,
                                                "score": 0.2} for j in range(5)]) for i in range(80)]
    p = render_digest(CFG, teams, "2027-01-15")
    assert_limits(p)
    assert all("<!here>" not in t for t in all_mrkdwn(p))


def test_engine_scores_show_as_percent_in_slack() -> None:
    """Scores the engine produced (ratios 0..1), not seeded ones, read 0-100% in the message
    and the digest; a perfect job is 100%, never "1"."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "goodput"))
    from simjobs import analyze_data, generate

    from gpufleet.agent.simulator import make_job

    def _fields(score: float) -> list[str]:
        p = render_job(CFG, job(goodput_score=score), note(), NOW)
        return [f["text"] for b in p["blocks"] for f in b.get("fields", [])]

    for profile in ("vision_train", "low_sm_activity"):
        res = analyze_data(generate(make_job(profile, f"r-{profile}", 2, NOW - 2700, 2700)))
        assert res.goodput_score is not None and 0.0 <= res.goodput_score <= 1.0
        want = pct_text(res.goodput_score)  # the pages' rounding rule (api/static/fmt.js)
        assert f"*Goodput*\n{want}" in _fields(res.goodput_score)
        digest = json.dumps(render_digest(CFG, [("nlp", 3.0, [{"job_id": "1", "user": "alice", "name": "x",
                                                                "wasted": 3.0, "score": res.goodput_score}])], "d"))
        assert f"goodput {want}" in digest
    assert "*Goodput*\n100%" in _fields(1.0)


def test_slack_reads_goodput_coverage_and_waste_by_cause_from_the_ledger() -> None:
    """One model: the message's goodput, coverage and waste by cause are the job's ledger summary
    (no hardware score beside a contradictory figure)."""
    led = {"goodput": 0.6245, "coverage": 0.8, "allocated_gpu_hours": 16.0, "wasted_gpu_hours": 4.5,
           "categories": {"productive": 8.0, "restart_lost": 3.0, "idle_gpu": 1.5, "unobserved": 3.5}}
    p = render_job(CFG, job(ledger=led, n_gpus=1, goodput_score=0.6245), note(), NOW)
    fields = [f["text"] for b in p["blocks"] for f in b.get("fields", [])]
    assert "*Goodput*\n62% of observed GPU time · coverage 80%" in fields
    by_cause = next(f for f in fields if f.startswith("*Waste by cause"))
    assert by_cause.index("3.0") < by_cause.index("1.5")
    assert "productive" not in by_cause and "unobserved" not in by_cause


def test_a_flag_claiming_no_waste_reads_by_severity() -> None:
    """A degraded NIC or a hardware fault books no GPU time of its own: the message says so and
    its severity, never "0.0 GPU-h wasted"."""
    j = job(flags=(FlagFact("network_degraded", "node-7", "critical", 0.0, {"nic": "mlx5_0/1"}, "drain the node"),))
    p = render_job(CFG, j, Notification("firing", 1, "k", "", ("network_degraded",), ("network_degraded",), ()), NOW)
    text = json.dumps(p)
    assert "0.0 GPU-h wasted" not in text and "critical, no GPU time of its own" in text


def test_sections_most_severe_first_and_at_most_ten() -> None:
    """Severity before waste in Slack too: a critical fault claiming nothing comes before a
    warning claiming much; past ten kinds the rest are named in one line."""
    flags = (FlagFact("idle_gpu", "", "warning", 9.0), FlagFact("hw_fault", "node-a", "critical", 0.0))
    p = render_job(CFG, job(flags=flags), note(("idle_gpu", "hw_fault")), NOW)
    text = json.dumps(p)
    assert text.index("Hardware fault") < text.index("Idle GPUs")
    many = tuple(FlagFact(k, "", "warning", 1.5) for k in FLAG_KINDS)
    p = render_job(CFG, job(flags=many), note(FLAG_KINDS), NOW)
    sections = [b for b in p["blocks"] if b["type"] == "section" and "fields" not in b]
    assert len(sections) == 10 and f"{len(FLAG_KINDS) - 10} more" in json.dumps(p)

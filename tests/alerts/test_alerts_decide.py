"""Pure decision functions and config loading: no database, no network."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.alerts.config import ConfigError, load_config, parse_config, parse_duration
from gpufleet.alerts.decide import decide_job, faulty_nodes, route_for, silence_matches, suppression
from gpufleet.alerts.digest import digest_due, group_digest
from gpufleet.alerts.facts import AlertState, FlagFact, GroupState, JobFacts, SilenceFact

NOW = 1_800_000_000.0
REPO = Path(__file__).resolve().parents[2]


def job(**kw: object) -> JobFacts:
    base: dict[str, object] = dict(job_pk=1, cluster="prod", job_id="42", user="alice", account="nlp", partition="gpu",
                                   start_ts=NOW - 7200, n_gpus=4, nodes=("n1",),
                                   flags=(FlagFact("idle_gpu", "", "warning", 5.0),))
    base.update(kw)
    return JobFacts(**base)  # type: ignore[arg-type]


CFG = parse_config({"slack": {"default_webhook": "http://default",
                              "routes": [{"match": {"cluster": "prod", "account": "cv"}, "webhook": "http://cv"},
                                         {"match": {"user": "bob"}, "webhook": "http://bob"}],
                              "mentions": {"alice": "U1"}}})


def test_routing_first_match_wins_then_default() -> None:
    assert route_for(job(account="cv"), CFG) == "http://cv"
    assert route_for(job(account="cv", cluster="dev"), CFG) == "http://default"
    assert route_for(job(user="bob"), CFG) == "http://bob"
    assert route_for(job(), CFG) == "http://default"


def test_rules_thresholds() -> None:
    cfg = parse_config({"slack": {"default_webhook": "http://h"},
                        "rules": [{"flags": ["idle_gpu"], "min_gpus": 2, "min_duration": "1h",
                                   "min_wasted_gpu_hours": 4, "min_severity": "warning", "exclude_users": ["root"]}]})
    fire = decide_job(job(), cfg, {}, None, [], set(), NOW)
    assert fire.notification is not None and fire.notification.event == "firing"
    for quiet in (job(n_gpus=1), job(start_ts=NOW - 1800), job(user="root"),
                  job(flags=(FlagFact("idle_gpu", "", "warning", 3.0),)),
                  job(flags=(FlagFact("idle_gpu", "", "info", 9.0),)),
                  job(flags=(FlagFact("throttled", "", "critical", 9.0),)),
                  job(flags=(FlagFact("idle_gpu", "", "critical", 9.0, open=False),))):
        assert decide_job(quiet, cfg, {}, None, [], set(), NOW).notification is None, quiet


def test_scopes_of_one_kind_add_up_to_one_alert() -> None:
    j = job(flags=(FlagFact("straggler", "n1", "warning", 0.6), FlagFact("straggler", "n2", "critical", 0.6)))
    d = decide_job(j, CFG, {}, None, [], set(), NOW)
    (ch,) = d.changes
    assert ch.kind == "straggler" and ch.scopes == ("n1", "n2") and ch.severity == "critical"
    assert ch.wasted_gpu_hours == pytest.approx(1.2)


def test_reminder_and_resolved_only_for_running_jobs() -> None:
    firing = {"idle_gpu": AlertState("idle_gpu", "firing", fired_at=NOW - 5 * 3600)}
    g = GroupState("firing", 1, NOW - 4 * 3600 - 1)
    d = decide_job(job(), CFG, firing, g, [], set(), NOW)
    assert d.notification and d.notification.event == "reminder" and d.notification.seq == 2
    assert decide_job(job(state="ended"), CFG, firing, g, [], set(), NOW).notification is None
    healed = job(flags=())
    d = decide_job(healed, CFG, firing, g, [], set(), NOW)
    assert d.notification and d.notification.event == "resolved" and d.group_state == "resolved"
    assert decide_job(job(flags=(), state="ended"), CFG, firing, g, [], set(), NOW).notification is None


def test_silence_matchers_are_anded_and_expire() -> None:
    j = job()
    assert silence_matches(SilenceFact(1, NOW + 1, user="alice", kind="idle_gpu"), j, "idle_gpu", NOW)
    assert not silence_matches(SilenceFact(1, NOW + 1, user="alice", kind="throttled"), j, "idle_gpu", NOW)
    assert not silence_matches(SilenceFact(1, NOW - 1, user="alice"), j, "idle_gpu", NOW)
    assert not silence_matches(SilenceFact(1, NOW + 1), j, "idle_gpu", NOW)  # empty never matches
    assert silence_matches(SilenceFact(1, NOW + 1, job="42", cluster="prod"), j, "idle_gpu", NOW)
    assert not silence_matches(SilenceFact(1, NOW + 1, job="42", cluster="dev"), j, "idle_gpu", NOW)


def test_inhibition_by_node_hw_fault() -> None:
    hw = [(FlagFact("hw_fault", "gpu-uuid-1", "critical"), ["nX"]), (FlagFact("hw_fault", "", "critical",
                                                                             evidence={"node": "nY"}), ["nY", "nZ"]),
          (FlagFact("hw_fault", "nW/3", "critical"), ["nW"])]
    bad = faulty_nodes(hw, {"gpu-uuid-1": "n1"})
    assert bad == {"n1", "nY", "nW"}
    assert suppression(job(), "idle_gpu", [], bad, NOW) == "inhibited:n1"
    assert suppression(job(), "hw_fault", [], bad, NOW) is None
    assert suppression(job(nodes=("n2",)), "idle_gpu", [], bad, NOW) is None


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    assert parse_duration("4h") == 14400 and parse_duration("90s") == 90 and parse_duration(30) == 30
    for doc, msg in (({"rules": [{"flags": ["nope"]}]}, "rules[0].flags"),
                     ({"rules": [{"min_severity": "loud"}]}, "min_severity"),
                     ({"lifecycle": {"repeat_interval": "soon"}}, "lifecycle.repeat_interval"),
                     ({"slack": {"routes": [{"webhook": "x"}]}}, "slack.routes[0].match"),
                     ({"delivery": {"burst": "many"}}, "delivery.burst"),
                     ({"colour": 1}, "unknown key")):
        with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("]", r"\]")):
            parse_config(doc)
    bad = tmp_path / "r.yaml"
    bad.write_text("rules: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_example_rules_file_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_SLACK_WEBHOOK_URL", "http://env-hook")
    cfg = load_config(REPO / "alerts" / "rules.example.yaml")
    assert cfg.enabled and cfg.default_webhook == "http://env-hook"
    assert cfg.repeat_interval_s == 4 * 3600 and cfg.price_per_gpu_hour > 0 and cfg.rules


def test_env_only_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_ALERT_RULES", raising=False)
    monkeypatch.delenv("GPUFLEET_SLACK_WEBHOOK_URL", raising=False)
    assert not load_config().enabled
    monkeypatch.setenv("GPUFLEET_SLACK_WEBHOOK_URL", "http://h")
    c = load_config()
    assert c.enabled and {r.name for r in c.rules} == {"waste", "hardware", "fabric", "critical", "hang", "slo_burn"}


@pytest.mark.parametrize("kind", ["collective_slow", "network_degraded", "link_errors", "straggler", "throttled",
                                  "slow_rank"])
def test_default_rules_page_on_severity_as_well_as_waste(kind: str) -> None:
    """Slow collectives, a degraded NIC, link errors, the straggler, throttling and a slow rank claim
    little or no waste of their own (the ledger books the lost time elsewhere): the default rules
    page on them all the same, while a zero-waste info flag stays quiet."""
    d = decide_job(job(flags=(FlagFact(kind, "n1", "warning", 0.0),)), CFG, {}, None, [], set(), NOW)
    assert d.notification is not None and d.notification.firing == (kind,)
    quiet = job(flags=(FlagFact(kind, "n1", "info", 0.0),))
    assert decide_job(quiet, CFG, {}, None, [], set(), NOW).notification is None
    young = job(start_ts=NOW - 120, flags=(FlagFact(kind, "n1", "warning", 0.0),))  # under the rule's 10 min
    assert decide_job(young, CFG, {}, None, [], set(), NOW).notification is None


def test_any_critical_flag_pages_at_once() -> None:
    j = job(start_ts=NOW - 60, flags=(FlagFact("idle_gpu", "", "critical", 0.0),))
    d = decide_job(j, CFG, {}, None, [], set(), NOW)
    assert d.notification is not None and d.notification.firing == ("idle_gpu",)


def test_digest_groups_by_team_and_route() -> None:
    cfg = parse_config({"slack": {"default_webhook": "http://d", "routes": [{"match": {"account": "cv"},
                                                                             "webhook": "http://cv"}]},
                        "digest": {"enabled": True, "top_n": 2, "hour_utc": 9}})
    rows = [(job(job_pk=i, job_id=str(i), account=a), w) for i, (a, w) in
            enumerate([("nlp", 5.0), ("nlp", 9.0), ("nlp", 1.5), ("ops", 30.0), ("cv", 4.0), ("nlp", 0.5)])]
    g = group_digest(rows, cfg)
    assert set(g) == {"http://d", "http://cv"}
    teams = g["http://d"]
    assert [t[0] for t in teams] == ["ops", "nlp"] and teams[1][1] == pytest.approx(15.5)
    assert [j["job_id"] for j in teams[1][2]] == ["1", "0"]  # top 2, worst first; 0.5 GPU-h below minimum
    assert digest_due(cfg, 1_800_000_000.0 - (1_800_000_000 % 86400) + 8 * 3600) is None
    assert digest_due(cfg, 1_800_000_000.0 - (1_800_000_000 % 86400) + 10 * 3600) is not None

"""The flag-kind registry is the one home of each kind: every kind has exactly one detector, in
the place its ``source`` names, its words live in one file, and no other product file names a
kind (so adding one needs only a registry entry, a detector module, its thresholds section and
its tests)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from simjobs import analyze_data, generate

from gpufleet.agent.simulator import PROFILES, make_job
from gpufleet.analysis.config import load_thresholds
from gpufleet.analysis.detectors import DETECTORS
from gpufleet.analysis.progress.detectors import PROGRESS_DETECTORS
from gpufleet.analysis.serving.config import load_raw as serving_thresholds
from gpufleet.analysis.serving.detectors import SERVING_DETECTORS
from gpufleet.flagkinds import FLAG_KINDS, SOURCES, flag_kinds, parse_flag_kinds

from .conftest import T0

REPO = Path(__file__).resolve().parents[2]
# Product code (tests, docs, bench and the simulator's ground-truth labels are not product).
# The agent never knows flag kinds (it sits before analysis), so it is not scanned.
PRODUCT = ("gpufleet", "collector", "storage", "analysis", "alerts", "api", "dashboards", "helm", "migrations")
SOURCE_SUFFIXES = {".py", ".js", ".toml", ".yaml", ".yml", ".json", ".html", ".css", ".tpl", ".md"}
# Every place a product file other than the registry, thresholds and the kind's own detector
# names a kind, and why it must. A new kind needs no entry here.
CROSS_REFERENCES = {
    "hw_fault": {"alerts/config.py": "the hardware rule alerts at once, whatever it wasted",
                 "alerts/decide.py": "a node's fault inhibits the job alerts on that node",
                 "alerts/store.py": "reads the open faults for that inhibition",
                 "analysis/ledger_categories.toml": "a fault that stops work claims the stopped time (ledger)"},
    "straggler": {"analysis/detectors/low_sm_activity.py": "a more specific cause it steps aside for"},
    "comm_bound": {"analysis/detectors/low_sm_activity.py": "a more specific cause it steps aside for"},
    "oversized_allocation": {"analysis/detectors/low_sm_activity.py": "a more specific cause it steps aside for"},
    "input_stall": {"analysis/detectors/low_sm_activity.py": "a more specific cause it steps aside for",
                    "alerts/render.py": "the sample message of `gpufleet alerts test`"},
    "memory_underuse": {"analysis/detectors/low_sm_activity.py": "a more specific cause it steps aside for"},
    "throttled": {"api/queries/nodes.py": "a homonym: the node page's throttled-minutes column, not the flag"},
    "idle_gpu": {"alerts/render.py": "the sample message of `gpufleet alerts test`",
                 "analysis/detectors/low_sm_activity.py": "a more specific cause it steps aside for"},
    "hung": {"analysis/detectors/low_sm_activity.py": "a more specific cause it steps aside for",
             "analysis/progress/detect.py": "the job's own progress gives a hang its second kind of evidence",
             "analysis/progress/goodput.py": "time lost to a hang is one cause of the progress goodput",
             "analysis/progress/model.py": "the progress goodput's causes include hangs",
             "alerts/config.py": "a critical hang pages at once, whatever it wasted (docs/progress.md)",
             "analysis/ledger_categories.toml": "a hang seen by progress or hardware lands in one ledger category",
             "analysis/ledger.py": "progress stall time folds into that one hung category"},
    "pipeline_imbalance": {"analysis/detectors/low_sm_activity.py": "a more specific cause it steps aside for",
                           "analysis/detectors/straggler.py": "a deviant without a hardware signature is one"},
}
CROSS_REFERENCES.setdefault("slo_missed", {})["alerts/config.py"] = "the default slo_burn rule pages it at once"
# A replica's GPU time not served within the SLO lands in its serving cause (docs/goodput.md).
for _k in ("slo_missed", "idle_replica", "overprovisioned_deployment"):
    CROSS_REFERENCES.setdefault(_k, {})["analysis/ledger_categories.toml"] = "a serving cause of the ledger"
# The default "fabric" alert rule pages these on severity, whatever waste they claim (docs/alerts.md).
for _k in ("collective_slow", "network_degraded", "link_errors", "straggler", "throttled", "slow_rank"):
    CROSS_REFERENCES.setdefault(_k, {})["alerts/config.py"] = "the default fabric rule pages it on severity"


def _product_files() -> list[tuple[str, str]]:
    """Product source files git tracks (a colleague's uncommitted work in the same tree is not
    judged until it is committed); every file under the product folders without git."""
    try:
        listed = subprocess.run(["git", "ls-files", "--", *PRODUCT], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.split()
        paths = [REPO / p for p in listed]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for top in PRODUCT for p in sorted((REPO / top).rglob("*"))]
    out = []
    for p in paths:
        rel = p.relative_to(REPO).as_posix()
        if p.is_file() and p.suffix in SOURCE_SUFFIXES and "__pycache__" not in rel:
            out.append((rel, p.read_text(errors="replace")))
    return out


# The detector list of each source (the registry's SOURCES names their folders).
DETECTORS_BY_SOURCE = {"hardware": DETECTORS, "progress": PROGRESS_DETECTORS, "serving": SERVING_DETECTORS}


def test_every_kind_has_one_detector_where_its_source_says_and_one_thresholds_section() -> None:
    assert sorted(DETECTORS_BY_SOURCE) == sorted(SOURCES)
    th = load_thresholds()
    for kind in flag_kinds().kinds:
        homes = [src for src, ds in DETECTORS_BY_SOURCE.items() for d in ds if d.kind == kind.name]
        assert homes == [kind.source], f"{kind.name}: source {kind.source!r}, detectors in {homes}"
        # ... and its module is the only one in any source's folder named for it
        modules = [src for src, folder in SOURCES.items() if (REPO / folder / f"{kind.name}.py").is_file()]
        assert modules == [kind.source], f"{kind.name}: detector modules under {modules}"
    for src, ds in DETECTORS_BY_SOURCE.items():
        for d in ds:
            assert d.kind in FLAG_KINDS, f"{src} detector {d.kind} has no registry entry"
            assert d.kind == d.config.SECTION
            # the serving kinds keep their thresholds beside them (analysis/serving/thresholds.toml)
            raw = serving_thresholds() if src == "serving" else th.raw
            assert d.kind in raw, f"{src} thresholds have no [{d.kind}] section"
        assert len({d.kind for d in ds}) == len(ds), f"{src}: a kind listed twice"


def test_titles_and_suggestions_live_in_one_file() -> None:
    files = _product_files()
    for k in flag_kinds().kinds:
        for text in (k.title, *k.suggestions):
            # Titles are short ("Straggler"): match them as quoted strings; suggestions anywhere.
            needle = re.compile(re.escape(f'"{text}"')) if text == k.title else re.compile(re.escape(text))
            where = [rel for rel, body in files if needle.search(body)]
            assert where == ["gpufleet/flagkinds.toml"], f"{k.name}: {text!r} found in {where}"


def test_no_other_product_file_names_a_kind() -> None:
    files = _product_files()
    for kind in FLAG_KINDS:
        folder = SOURCES[flag_kinds().get(kind).source]
        allowed = {"gpufleet/flagkinds.toml", "analysis/thresholds.toml", f"{folder}/__init__.py",
                   f"{folder}/{kind}.py", *CROSS_REFERENCES.get(kind, {})}
        # As a string literal: the way code names a kind (prose and examples may mention it).
        pat = re.compile(rf"[\"']{kind}[\"']")
        extra = [rel for rel, body in files if rel not in allowed and pat.search(body)]
        assert extra == [], (f"{kind} is named in {extra}: read it from the registry (gpufleet.flagkinds) or "
                             "list the reference in CROSS_REFERENCES with the reason")


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_evidence_key_is_declared(profile: str) -> None:
    size = {"straggler": 8, "hw_fault": 8, "comm_bound": 16, "multinode_dp": 16, "oversized_allocation": 4}
    res = analyze_data(generate(make_job(profile, f"ev-{profile}", size.get(profile, 2), T0 + 17.25, 42 * 60)))
    reg = flag_kinds()
    for f in res.findings:
        undeclared = [k for k in f.evidence if reg.evidence_field(f.kind, k) is None]
        assert undeclared == [], f"{f.kind} writes evidence keys the registry does not declare: {undeclared}"
        assert f.suggestion in reg.get(f.kind).suggestions


def _entry(**over: str) -> str:
    d = {"name": "x_kind", "source": "hardware", "scope": "job", "severity": "warning", "title": "X", "summary": "s",
         "suggestion": "do",
         "waste": "w", "docs": "docs/goodput.md#x_kind", **over}
    body = "\n".join(f'{k} = "{v}"' for k, v in d.items())
    return f'[[kind]]\n{body}\n[kind.evidence]\nv = {{ label = "v", unit = "ratio", meaning = "m" }}\n'


def test_registry_rejects_bad_entries_with_clear_errors() -> None:
    assert parse_flag_kinds(_entry()).names == ("x_kind",)
    for text, msg in ((_entry(scope="rack"), "scope 'rack'"), (_entry(severity="loud"), "severity 'loud'"),
                      (_entry(name="X-Kind"), "lower_snake_case"), (_entry() + _entry(), "defined twice"),
                      (_entry().replace('unit = "ratio"', 'unit = "furlongs"'), "unit 'furlongs'"),
                      (_entry().replace('waste = "w"\n', ""), "missing keys ['waste']"), ("", "no [[kind]]"),
                      (_entry(source="gossip"), "source 'gossip'"),
                      (_entry().replace('source = "hardware"\n', ""), "missing keys ['source']"),
                      (_entry(suggestion="do {nope}"), "placeholders ['nope']")):
        with pytest.raises(ValueError, match=re.escape(msg)):
            parse_flag_kinds(text)


def test_suggestion_placeholders_are_filled_from_the_evidence() -> None:
    k = parse_flag_kinds(_entry(suggestion="checkpoint every {v} s")).get("x_kind")
    assert k.suggestion_with({"v": 0.25}) == "checkpoint every 25.0% s"
    assert k.suggestion_with({}) == "checkpoint every n/a s"
    for kind in flag_kinds().kinds:  # the hardware kinds' suggestions are plain text
        if kind.source == "hardware":
            assert "{" not in kind.suggestion, kind.name


def test_unknown_kind_shows_its_name() -> None:
    assert flag_kinds().title("from_a_newer_version") == "from_a_newer_version"
    with pytest.raises(KeyError, match="known"):
        flag_kinds().get("from_a_newer_version")


def test_suggestion_templates_agree_in_number_and_drop_what_was_not_measured() -> None:
    """"{n:word|words}" agrees with the number; "[[A||B]]" falls back when A lacks a value, so a
    Slack message or page never reads "1 restarts" or "every n/a s"."""
    k = flag_kinds().get("restart_lost_progress")
    one = k.suggestion_with({"restarts": 1, "lost_steps": 3})
    assert one.startswith("1 restart redid 3 steps: no checkpoint save was seen") and "n/a" not in one
    full = k.suggestion_with({"restarts": 2, "lost_steps": 1, "restart_lost_s": 500, "share": 0.3,
                              "young_daly_interval_s": 900, "checkpoint_cost_s": 20, "mtbf_s": 3000,
                              "checkpoint_interval_s": 3600})
    assert full.startswith("2 restarts redid 1 step (500 s, 30.0% of the allocation): checkpoint about every 900 s")
    assert flag_kinds().evidence_text("link_errors", "judged_from", ["nic_counters"]) == ("judged from", "nic counters")

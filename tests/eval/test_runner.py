"""The runner works end to end (through batches, the NDJSON import, the analysis and the
tables) and its scoring arithmetic is right. These tests do not assert the engine's score."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from realworld.model import expect
from realworld.score import Outcome, markdown, score

_spec = importlib.util.spec_from_file_location("realworld_run", Path(__file__).resolve().parents[2] / "bench"
                                               / "realworld" / "run.py")
assert _spec and _spec.loader
runner = importlib.util.module_from_spec(_spec)
sys.modules["realworld_run"] = runner  # dataclasses look their module up there
_spec.loader.exec_module(runner)  # the runner script itself, as `python bench/realworld/run.py` runs it

SUBSET = ["hung_collective", "idle_allocation", "imported_inference_pods", "mig_slice_inference"]


def test_subset_end_to_end(tmp_path: Path):
    res = runner.run_interval(60, SUBSET, [1], tmp_path)
    outcomes, deadline_problems, deadline_checked, timing = (res.outcomes, res.deadline_problems,
                                                             res.deadline_checked, res.timing)
    # every job of the subset comes back, stored and analyzed: hung (1) + idle (1) + 12 pods + 2 MIG pods
    assert len(outcomes) == 16 and timing["rows"] > 0 and timing["analysis_errors"] == 0
    assert {o.scenario for o in outcomes} == set(SUBSET)
    assert all(o.report is not None for o in outcomes), "every job got a report through job_reports"
    assert all(isinstance(f["kind"], str) and "severity" in f for o in outcomes for f in o.flags)
    # the NDJSON path really carried the imported pods (source import), the batch path the rest
    assert sum(o.scenario == "imported_inference_pods" for o in outcomes) == 12
    assert deadline_checked == 1 and len(deadline_problems) <= 1
    md = markdown(outcomes, deadline_problems, deadline_checked=deadline_checked)
    assert "| kind | demanded | caught |" in md and "60 s" in md
    # the reference judged the same jobs: the idle allocation is idle by GPU_UTIL too
    ref = {o.scenario: o.raised for o in res.reference}
    assert len(res.reference) == 16 and ref["idle_allocation"] == {"idle_gpu"}
    assert (tmp_path / "iv60.db").exists() and (tmp_path / "iv60-live.db").exists()


def test_main_writes_markdown_and_json(tmp_path: Path):
    out, js = tmp_path / "r.md", tmp_path / "r.json"
    rc = runner.main(["--interval", "30", "--scenario", "idle_allocation", "--quick", "--out", str(out),
                      "--json", str(js), "--workdir", str(tmp_path / "w")])
    assert rc == 0
    assert "| kind | demanded |" in out.read_text() and "30 s" in out.read_text()
    assert '"scenario": "idle_allocation"' in js.read_text()


def _o(name: str, raised: list[str], e, report=None) -> Outcome:
    return Outcome(name, 1, 10, name, e, "why", [{"kind": k, "severity": "warning", "evidence": {}} for k in raised],
                   report)


def test_score_arithmetic():
    outs = [
        _o("tp", ["idle_gpu"], expect(["idle_gpu"])),
        _o("fn", [], expect(["idle_gpu"])),
        _o("fp", ["idle_gpu"], expect()),  # healthy job flagged
        _o("allowed", ["low_sm_activity"], expect(allowed=["low_sm_activity"])),  # healthy, allowed: not flagged
        _o("group-met", ["low_sm_activity"], expect(any_of=[["input_stall", "low_sm_activity"]])),
        _o("group-missed", [], expect(any_of=[["input_stall", "low_sm_activity"]])),
    ]
    s = score(outs)
    assert (s.kinds["idle_gpu"].demanded, s.kinds["idle_gpu"].hit) == (2, 1)
    assert (s.kinds["idle_gpu"].raised, s.kinds["idle_gpu"].correct) == (2, 1)
    # the group's head carries the demand; a member met it
    assert (s.kinds["input_stall"].demanded, s.kinds["input_stall"].hit) == (2, 1)
    assert s.kinds["low_sm_activity"].precision == 1.0
    assert (s.healthy_jobs, s.healthy_flagged) == (2, 1)
    whats = sorted(p.what for p in s.problems)
    assert whats == ["false idle_gpu", "missed idle_gpu", "missed input_stall"]


def test_accounting_and_confidence_checks():
    bad = _o("waste", ["idle_gpu"], expect(["idle_gpu"], low_confidence=True),
             {"allocated_gpu_hours": 4.7, "wasted_gpu_hours": 4.9, "goodput_score": 24.6, "report": {}})
    bad.flags[0]["confidence"] = "high"
    good = _o("ok", ["idle_gpu"], expect(["idle_gpu"], low_confidence=True),
              {"allocated_gpu_hours": 4.7, "wasted_gpu_hours": 4.7, "goodput_score": 0.0, "report": {}})
    good.flags[0]["evidence"] = {"confidence": "low"}
    s = score([bad, good])
    assert (s.accounting_checked, s.accounting_bad) == (2, 1)
    detail = next(p.detail for p in s.problems if p.what == "accounting")
    assert "4.900 > allocated 4.700" in detail and "outside 0..1" in detail
    assert (s.confidence_checked, s.confidence_bad, s.confidence_unreported) == (2, 1, 0)
    assert (s.coverage_notes_checked, s.coverage_notes_missing) == (2, 2)
    good.report["report"] = {"notes": ["profiling metrics missing on 1/1 GPUs: judged from gpu_util"]}
    assert score([good]).coverage_notes_missing == 0


def test_docs_scenario_table_is_current():
    """docs/evaluation.md's appendix is generated by `run.py --list`; regenerate it when a
    scenario or its labels change."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "evaluation.md").read_text()
    assert runner.scenario_table() in doc

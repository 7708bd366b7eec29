"""bench/serving/scenarios_heldout.py: the held-out serving library is well formed and its scenarios
run through the pipeline (no accuracy asserted here: the figures are in docs/evaluation.md)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "serving"))

import scenarios_heldout as lib

from gpufleet.flagkinds import flag_kinds


def test_labels_name_serving_kinds() -> None:
    kinds = {k.name for k in flag_kinds().kinds if k.source == "serving"}
    assert set(lib.KINDS) == kinds
    names = [s.name for s in lib.LIBRARY]
    assert len(names) == len(set(names))
    assert sum(s.healthy for s in lib.LIBRARY) >= 6
    for s in lib.LIBRARY:
        assert s.must | s.may <= kinds, s.name
        assert not s.must & s.may, s.name
        assert s.source and s.situation, s.name
        assert (s.cause is not None) == ("slo_missed" in s.must), s.name


def test_cheap_scenarios_run_and_report(capsys) -> None:  # type: ignore[no-untyped-def]
    rows = lib.evaluate(1, ["forgotten_replica_overnight", "diurnal_trough_one_replica"])
    assert [r.scenario.name for r in rows] == ["diurnal_trough_one_replica", "forgotten_replica_overnight"]
    lib.report(rows, 1)
    out = capsys.readouterr().out
    assert "| idle_replica |" in out and "healthy runs flagged:" in out
    t = lib.truth(lib.run(lib.LIBRARY[2], 0))
    assert t["requests"] and not t["slo_missed"]

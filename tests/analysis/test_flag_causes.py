"""The suggestion names the cause that was measured: the throttled flag tells a hot node to check
its cooling and a power-capped one to check its power limit (the clock-event reasons decide),
hw_fault names what the GPU reported, link_errors the counter that grew, network_degraded the
NIC evidence. Every cause a detector can pick has its own suggestion in the registry."""

from __future__ import annotations

import numpy as np
import pytest
from simjobs import analyze_data, generate

from gpufleet.agent.simulator import make_job
from gpufleet.analysis.collectives.detect import ErrorPort
from gpufleet.analysis.detectors import hw_fault, link_errors, network_degraded, throttled
from gpufleet.flagkinds import flag_kinds

from .conftest import T0


@pytest.mark.parametrize(("module", "causes"), [
    (throttled, {c for c, _ in throttled.CAUSES}),
    (hw_fault, set(hw_fault.CAUSE_ORDER) | set(hw_fault.CAUSE_XIDS.values()) | set(hw_fault.CAUSE_KEYS.values())),
    (link_errors, set(link_errors.CAUSE_OF_COUNTER.values())),
    (network_degraded, {c for _, c in network_degraded.CAUSES}),
])
def test_every_cause_a_detector_can_pick_has_its_own_suggestion(module, causes) -> None:
    spec = flag_kinds().get(module.KIND)
    by_cause = dict(spec.suggestion_by_cause)
    assert causes and causes <= set(by_cause), f"{module.KIND}: no suggestion for {causes - set(by_cause)}"
    assert len(set(by_cause.values())) == len(by_cause), "two causes share one text"
    assert spec.suggestion not in by_cause.values()
    assert flag_kinds().evidence_field(module.KIND, "cause") is not None  # labelled on every page


def test_throttle_cause_is_the_reason_set_most_often_with_hw_slowdown_deferring() -> None:
    assert throttled.measured_cause(np.array([0x40 | 0x8, 0x40 | 0x8, 0x4])) == ("thermal",
                                                                               ["hw_slowdown", "hw_thermal",
                                                                                "sw_power_cap"])
    assert throttled.measured_cause(np.array([0x4, 0x4, 0x20]))[0] == "power_cap"
    assert throttled.measured_cause(np.array([0x80 | 0x8]))[0] == "power_brake"
    # HW slowdown alone is its own cause; beside a thermal reason it is that reason's symptom
    assert throttled.measured_cause(np.array([0x8, 0x8]))[0] == "hw_slowdown"
    assert throttled.measured_cause(np.array([0x8, 0x8, 0x40 | 0x8]))[0] == "hw_slowdown"
    assert throttled.measured_cause(np.array([0.0, 0.0])) == (None, [])
    assert throttled.measured_cause(np.array([])) == (None, [])


@pytest.mark.parametrize(("bits", "cause"), [(0x40 | 0x8, "thermal"), (0x20, "thermal"), (0x4, "power_cap"),
                                             (0x80 | 0x8, "power_brake"), (0x8, "hw_slowdown")])
def test_throttled_job_gets_the_suggestion_for_its_measured_reasons(bits: int, cause: str) -> None:
    d = generate(make_job("throttled", "thr-cause", 2, T0 + 17.25, 42 * 60))
    reasons = d.cols["clock_event_reasons"]
    busy = reasons > 1  # the simulator reports 0x1 (idle) when idle; rewrite every throttled sample
    d.cols["clock_event_reasons"] = np.where(busy, float(bits), reasons)
    f = next(f for f in analyze_data(d).findings if f.kind == "throttled")
    spec = flag_kinds().get("throttled")
    assert f.evidence["cause"] == cause
    assert f.suggestion == dict(spec.suggestion_by_cause)[cause]
    assert set(f.evidence["throttle_reasons"]) == {n for b, n in throttled.REASONS.items() if bits & b}


def test_throttled_without_reason_bits_keeps_the_general_suggestion() -> None:
    spec = flag_kinds().get("throttled")
    assert spec.suggestion_for(None, None) == spec.suggestion
    assert spec.suggestion_for(None, "not_a_cause") == spec.suggestion
    assert spec.suggestion_with({"cause": "power_cap"}) == dict(spec.suggestion_by_cause)["power_cap"]


def test_hw_fault_names_the_most_serious_fault_of_the_node() -> None:
    assert hw_fault.cause_of([{"xid": 64, "row_remap_failure": 1}]) == "row_remap"
    assert hw_fault.cause_of([{"pcie_replays_new": 9}, {"xid": 79}]) == "fell_off_bus"
    assert hw_fault.cause_of([{"ecc_dbe_new": 2}]) == "memory_ecc"
    assert hw_fault.cause_of([{"xid": 999}]) is None
    d = generate(make_job("hw_fault", "hw-cause", 8, T0 + 17.25, 42 * 60))
    f = next(f for f in analyze_data(d).findings if f.kind == "hw_fault")
    assert f.suggestion == dict(flag_kinds().get("hw_fault").suggestion_by_cause)[f.evidence["cause"]]


def _port(**counters: float) -> ErrorPort:
    return ErrorPort("n1", "mlx5_0/1", sum(counters.values()), counters, 0.0, 1.0)


def test_link_errors_cause_is_link_down_first_then_the_counter_that_grew_most() -> None:
    assert link_errors.cause_of([_port(symbol_error=500, link_downed=1)]) == "link_down"
    assert link_errors.cause_of([_port(symbol_error=5), _port(packet_seq_err=40)]) == "roce_sequence"
    assert link_errors.cause_of([_port(excessive_buffer_overrun_errors=3)]) == "buffer_overrun"
    assert link_errors.cause_of([_port(unknown_counter=3)]) is None


def test_message_text_of_evidence_uses_labels_and_units() -> None:
    """Slack shows evidence through the registry (gpufleet.flagkinds.value_text), as the web does."""
    reg = flag_kinds()
    assert reg.evidence_text("comm_bound", "link_capacity_bytes_s", {"nvlink": 4.5e11, "ib": 5e10}) == (
        "link capacity", "nvlink 450 GB/s, ib 50 GB/s")
    assert reg.evidence_text("comm_bound", "nvlink_util", 0.899) == ("NVLink utilisation", "89.9%")
    assert reg.evidence_text("idle_gpu", "n_gpus", 4) == ("GPUs", "4")
    assert reg.evidence_text("idle_gpu", "n_gpus", 4.0) == ("GPUs", "4")
    assert reg.evidence_text("throttled", "sm_clock_mhz", 1415.258) == ("SM clock", "1,415 MHz")
    assert reg.evidence_text("throttled", "cause", "power_cap") == ("measured cause", "power cap")
    assert reg.evidence_text("hung", "power_w", None) == ("power", "not measured")
    assert reg.evidence_text("idle_gpu", "idle_fraction", 0.97) == ("idle fraction", "0.97")  # not in the registry
    assert reg.evidence_text("from_a_newer_version", "x_y", "z") == ("x y", "z")


def test_slack_evidence_line_has_labels_not_keys() -> None:
    from gpufleet.alerts.render import _evidence

    line = _evidence("comm_bound", {"nvlink_util": 0.899, "link_capacity_bytes_s": {"nvlink": 4.5e11}, "episodes": 2})
    assert line == "NVLink utilisation `89.9%`, link capacity `nvlink 450 GB/s`, episodes `2`"


def _nested_keys(v: object) -> set[str]:
    if isinstance(v, dict):
        return {str(k) for k in v} | {k for x in v.values() for k in _nested_keys(x)}
    if isinstance(v, list):
        return {k for x in v for k in _nested_keys(x)}
    return set()


def test_every_key_inside_evidence_lists_and_maps_has_a_label_and_unit() -> None:
    """The web shows keys inside lists of objects and maps through [item_evidence]; every one a
    detector can write is declared (the simulator's profiles, hw_fault's per-GPU keys, every
    NIC error counter link_errors reports, a stuck rank's detail)."""
    from gpufleet.agent.simulator import PROFILES
    from gpufleet.analysis.collectives.detect import ERROR_KEYS

    reg = flag_kinds()
    size = {"straggler": 8, "hw_fault": 8, "comm_bound": 16, "multinode_dp": 16, "oversized_allocation": 4}
    written: set[str] = set()
    for profile in sorted(PROFILES):
        res = analyze_data(generate(make_job(profile, f"items-{profile}", size.get(profile, 2), T0 + 17.25, 42 * 60)))
        for f in res.findings:
            written |= {k for v in f.evidence.values() for k in _nested_keys(v)}
    written |= {"gpu_uuid", "xid", *hw_fault.CAUSE_KEYS, *ERROR_KEYS, "nic", "errors", "counters"}
    written |= {"rank", "since_step_s", "last_step", "host", "gpu", "typical_step_s", "limit_s", "open_span",
                "open_span_s"}  # analysis/progress/detect.py detect_hung's per-rank detail
    assert {"gpu_uuid", "xid", "nvlink", "ib"} <= written  # the profiles did write nested keys
    missing = sorted(k for k in written if reg.item_field(k) is None)
    assert missing == [], f"keys inside evidence lists/maps without an [item_evidence] entry: {missing}"
    for e in reg.item_evidence:
        assert e.label and e.unit and e.meaning and "_" not in e.label, e

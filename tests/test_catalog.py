"""The metric catalog is valid data and covers what every part needs."""

from __future__ import annotations

import pytest

from gpufleet.catalog import CATALOG, parse_catalog

REQUIRED = [
    "gr_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active",
    "fp32_active", "fp16_active", "gpu_util", "mem_copy_util", "fb_used_bytes", "fb_total_bytes", "power_w",
    "energy_j", "temp_c", "sm_clock_mhz", "mem_clock_mhz", "clock_event_reasons", "pcie_tx_bytes_s",
    "pcie_rx_bytes_s", "nvlink_tx_bytes_s", "nvlink_rx_bytes_s", "ib_tx_bytes_s", "ib_rx_bytes_s",
    "xid_last", "ecc_dbe_volatile",
]


def test_required_fields_present() -> None:
    missing = [f for f in REQUIRED if f not in CATALOG]
    assert not missing


def test_ratios_are_zero_to_one() -> None:
    for f in CATALOG.fields:
        if f.unit == "ratio":
            assert (f.min, f.max) == (0.0, 1.0), f.name


def test_dcgm_names_old_and_new_resolve_to_one_field() -> None:
    by = CATALOG.by_dcgm_name()
    assert by["DCGM_FI_PROF_SM_ACTIVE"] is by["DCGM_FI_PROF_SM_UTIL_RATIO"] is CATALOG["sm_active"]
    assert by["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] is by["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]
    # Percent fields from dcgm-exporter are scaled to ratios.
    assert CATALOG["gpu_util"].dcgm_scale == pytest.approx(0.01)


def test_check_rejects_out_of_range_and_non_finite() -> None:
    f = CATALOG["sm_active"]
    assert f.check(0.5) is None
    assert "outside valid range" in (f.check(1.5) or "")
    assert "not a finite" in (f.check(float("nan")) or "")
    assert "expected a number" in (f.check("0.5") or "")
    assert "expected a number" in (f.check(True) or "")


def test_gpu_model_peak_lookup_prefers_specific_names() -> None:
    assert CATALOG.gpu_model("NVIDIA H100 PCIe").peak_tensor_tflops == 756.0  # type: ignore[union-attr]
    assert CATALOG.gpu_model("NVIDIA H100 80GB HBM3").peak_tensor_tflops == 989.0  # type: ignore[union-attr]
    assert CATALOG.gpu_model("NVIDIA A100-SXM4-80GB").peak_tensor_tflops == 312.0  # type: ignore[union-attr]
    assert CATALOG.gpu_model("Tesla K80") is None


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        ('[fields.x]\nunit="r"\nmin=0\nmax=1\ndtype="f16"\nrollup="mean"\ndescription="d"', "dtype"),
        ('[fields.x]\nunit="r"\nmin=0\nmax=1\ndtype="f4"\nrollup="median"\ndescription="d"', "rollup"),
        ('[fields.x]\nunit="r"\nmin=2\nmax=1\ndtype="f4"\nrollup="mean"\ndescription="d"', "min > max"),
        ('[fields.x]\nunit="r"\nmin=0\nmax=1\ndtype="f4"\nrollup="mean"', "description"),
        ('[fields.BadName]\nunit="r"\nmin=0\nmax=1\ndtype="f4"\nrollup="mean"\ndescription="d"', "snake_case"),
    ],
)
def test_bad_catalog_entries_are_named(snippet: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_catalog(snippet)


def test_catalog_override_from_environment(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gpufleet.catalog import CATALOG_PATH, load_catalog

    custom = tmp_path / "catalog.toml"
    custom.write_text(CATALOG_PATH.read_text().replace('description = "Board power draw."',
                                                        'description = "Board power (site override)."'))
    monkeypatch.setenv("GPUFLEET_CATALOG", str(custom))
    load_catalog.cache_clear()
    try:
        assert load_catalog()["power_w"].description == "Board power (site override)."
        monkeypatch.setenv("GPUFLEET_CATALOG", str(tmp_path / "missing.toml"))
        load_catalog.cache_clear()
        with pytest.raises(ValueError, match="cannot read the metric catalog"):
            load_catalog()
    finally:
        monkeypatch.delenv("GPUFLEET_CATALOG")
        load_catalog.cache_clear()

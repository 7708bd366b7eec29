"""The server processes' GC settings (gpufleet.gctune): applied by the uvicorn factory that
`gpufleet serve` runs in every worker, configurable, and refused when malformed."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gpufleet.gctune import DEFAULT_THRESHOLD, tune_gc_for_server


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_serve_factory_applies_the_settings(restore_gc, sqlite_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gpufleet.server import create_app_from_env

    monkeypatch.setenv("GPUFLEET_DATABASE_URL", sqlite_url)
    monkeypatch.delenv("GPUFLEET_GC_THRESHOLD", raising=False)
    gc.set_threshold(700, 10, 10)
    create_app_from_env()
    assert gc.get_threshold() == (DEFAULT_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0  # what existed at startup is out of the collector's way


def test_threshold_is_configurable_and_zero_keeps_defaults(restore_gc) -> None:  # type: ignore[no-untyped-def]
    assert tune_gc_for_server(1234) == (1234, 10, 10)
    gc.set_threshold(700, 10, 10)
    assert tune_gc_for_server(0) is None
    assert gc.get_threshold() == (700, 10, 10)


def test_threshold_comes_from_the_environment_through_settings(restore_gc, sqlite_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gpufleet.server import create_app_from_env

    monkeypatch.setenv("GPUFLEET_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("GPUFLEET_GC_THRESHOLD", "1234")
    create_app_from_env()
    assert gc.get_threshold() == (1234, 10, 10)


@pytest.mark.parametrize("raw", ["lots", "-5", "1.5"])
def test_malformed_threshold_is_refused(restore_gc, monkeypatch, raw) -> None:  # type: ignore[no-untyped-def]
    from gpufleet.settings import Settings, SettingsError

    monkeypatch.setenv("GPUFLEET_GC_THRESHOLD", raw)
    with pytest.raises(SettingsError, match="GPUFLEET_GC_THRESHOLD"):
        Settings.from_env()

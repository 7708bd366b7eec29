"""Garbage-collector settings for the long-running server processes (`gpufleet serve` workers,
`gpufleet up`).

Why: ingest allocates and frees many short-lived container objects per request (decoded
structs, lists, dicts); with CPython's default gen0 threshold of 700 a loaded collector worker
ran ~90 collections a second, ~10% of its time (measured with gc.callbacks under 1,000 `wrk`
connections; docs/benchmarks.md). Almost all of those objects die by reference counting, so
a high gen0 threshold leaves the cyclic collector little to do, and freezing what exists at
startup (modules, the app, caches) keeps the full collections that remain from rescanning it.
Reference cycles are still collected, only less often.

``GPUFLEET_GC_THRESHOLD`` (``settings.gc.threshold``): the gen0 threshold (default 50000);
0 keeps Python's defaults."""

from __future__ import annotations

import gc

from gpufleet.settings import GcSettings

DEFAULT_THRESHOLD: int = GcSettings.model_fields["threshold"].default


def tune_gc_for_server(threshold: int = DEFAULT_THRESHOLD) -> tuple[int, int, int] | None:
    """Apply the server's GC settings to this process; returns the thresholds set, or None
    when ``threshold`` is 0 (Python's defaults stay)."""
    if threshold < 0:
        raise ValueError(f"GC threshold {threshold} must not be negative")
    if threshold == 0:
        return None
    gc.freeze()
    # gen1 every 10 gen0 collections, gen2 every 10 gen1: full collections stay rare but happen.
    gc.set_threshold(threshold, 10, 10)
    return gc.get_threshold()

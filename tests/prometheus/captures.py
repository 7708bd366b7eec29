"""The real dcgm-exporter captures in ../shared/fixtures/dcgm-exporter as remote-write series,
what Prometheus sends after scraping them (its target labels added)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.collector.remote_write import wire
from tests.conftest import shared_fixture

DUMPS = ("datadog-integrations-metrics.txt", "h100-k8s-issue490.txt", "readme-k8s-example.txt")


def capture_text(name: str) -> str:
    return shared_fixture("dcgm-exporter", name).read_text()


def capture_series(name: str, **target: str) -> list[tuple[dict[str, str], float, str]]:
    """(labels with __name__ and ``target`` labels, value, metric type) per sample of a capture."""
    return exposition_series(capture_text(name), **target)


def exposition_series(text: str, **target: str) -> list[tuple[dict[str, str], float, str]]:
    """The same for any exposition text (what a scrape of it gives Prometheus)."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {"__name__": s.name, **s.labels, **target}
            out.append((labels, float(s.value), fam.type))
    return out


def body(series: list[tuple[dict[str, str], list[tuple[int, float]]]], metadata: list[tuple[str, int]] = ()) -> bytes:
    """An uncompressed WriteRequest of (labels, [(ts ms, value)])."""
    return wire.encode([(wire.encode_labels(lab.items()), samples) for lab, samples in series], metadata)

"""Serving series by Prometheus remote write give the same replica-minutes as the agent's scrape of
the same pages (collector/serving_remote_write.py), through the real wire encoding."""

from __future__ import annotations

from gpufleet.agent.sim_serving import EngineModel, Workload, simulate
from gpufleet.agent.sources.serving_scrape import ServingScraper, ServingTarget
from gpufleet.collector.remote_write.wire import decode, encode, encode_labels, labels_of
from gpufleet.collector.serving_remote_write import ServingRemoteWrite, replica_of
from gpufleet.serving_expo import parse_exposition

T0 = 1_700_000_040


def test_remote_write_matches_the_agent_scrape() -> None:
    res = simulate(EngineModel(), Workload(rate_rps=4, duration_s=180, seed=3), engine="vllm", drain=False)
    pages = [(T0 + t, page) for t, page in res.pages]
    # the agent's path
    it = iter(p for _, p in pages)
    scraper = ServingScraper(fetch=lambda url: next(it))
    scraper.set_targets([ServingTarget("chat", "ml/chat-5f7d8c9b6d-abcde", "vllm", "http://x/metrics")])
    for t, _ in pages:
        scraper.scrape(t)
    want = scraper.drain(T0 + 180, gpus_of=lambda j: ["GPU-1"])
    # the same pages as Prometheus would remote-write them (one body per scrape, pod labels added)
    rw = ServingRemoteWrite(grace_s=5.0)
    for t, page in pages:
        series = []
        for s in parse_exposition(page):
            labels = {"__name__": s.name, "namespace": "ml", "pod": "chat-5f7d8c9b6d-abcde", "job": "vllm",
                      "instance": "10.0.0.5:8000", **dict(s.labels)}
            series.append((encode_labels(sorted(labels.items())), [(int(t * 1000), s.value)]))
        # one scrape split over two bodies, as Prometheus's shards do
        half = len(series) // 2
        for part in (series[:half], series[half:]):
            req = decode(encode(part))
            assert rw.add([(labels_of(x.key), x.samples) for x in req.series]) == len(part)
    got = rw.drain_records(T0 + 180, gpus_of=lambda j: ["GPU-1"])
    assert rw.late_samples == 0
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert {k: v for k, v in g.items() if k != "deployment"} == {k: v for k, v in w.items() if k != "deployment"}
        assert g["deployment"] == "chat"


def test_series_identity() -> None:
    assert replica_of({"namespace": "ml", "pod": "chat-5f7d8c9b6d-abcde"}) == ("chat", "ml/chat-5f7d8c9b6d-abcde")
    assert replica_of({"instance": "h1:8000", "gpufleet_deployment": "d"}) == ("d", "h1:8000")
    assert replica_of({"job": "x"}) is None
    rw = ServingRemoteWrite()
    assert rw.add([({"__name__": "DCGM_FI_DEV_SM_CLOCK", "instance": "h"}, [(0, 1.0)])]) == 0
    assert rw.add([({"__name__": "vllm:num_requests_running", "instance": "h"}, [(0, float("nan"))])]) == 1
    assert rw.drain_records(1e9, lambda j: []) == []  # a staleness marker is no value

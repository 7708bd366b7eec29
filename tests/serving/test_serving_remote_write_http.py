"""Serving series through a live collector's POST /api/v1/write (remote write 1.0 and 2.0), on
SQLite and PostgreSQL: stored as the replica-minutes the agent's scrape of the same pages gives,
the replica's GPUs from the attribution the GPU series made (unknown: 0 GPUs and no uuids), a
minute stored once it is finished, the rest at shutdown; malformed serving series dropped and
counted while the body's GPU rows are stored; a body sent twice changes nothing."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from gpufleet.agent.sim_serving import EngineModel, Workload, simulate
from gpufleet.agent.sources.serving_scrape import ServingScraper, ServingTarget
from gpufleet.collector.remote_write import wire
from gpufleet.serving_expo import parse_exposition
from gpufleet.storage.db import make_engine
from gpufleet.storage.serving import read_minutes
from tests.prometheus.captures import body
from tests.prometheus.prompb import request_v2
from tests.prometheus.rwclient import post, stored

GPU = "GPU-5e1f0c2a-1111-2222-3333-444455556666"
POD = {"namespace": "ml", "pod": "chat-0", "job": "vllm", "instance": "10.0.0.5:8000", "gpufleet_deployment": "chat"}
BARE = {"job": "vllm", "instance": "10.0.0.9:8000", "gpufleet_deployment": "chat"}  # no pod: no job, GPUs unknown
V2_HEADERS = {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
              "Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "2.0.0"}


def _gpu_series(ts_ms: int) -> tuple[dict[str, str], list[tuple[int, float]]]:
    """A dcgm-exporter series of the pod's GPU: the attribution gives GPU to job ml/chat-0."""
    return ({"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "UUID": GPU, "modelName": "NVIDIA H100",
             "Hostname": "node-a", "namespace": "ml", "pod": "chat-0", "container": "vllm"}, [(ts_ms, 87.0)])


def _page_series(page: str, ts_ms: int, target: dict[str, str]) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
    return [({"__name__": s.name, **dict(s.labels), **target}, [(ts_ms, s.value)]) for s in parse_exposition(page)]


def _metrics(url: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in fam.samples:
            out[s.name, s.labels.get("outcome", s.labels.get("reason", s.labels.get("cache", "")))] = s.value
    return out


def _rows(url: str) -> dict[tuple[str, int], object]:
    e = make_engine(url)
    with e.connect() as c:
        rows = {(r.replica, r.minute): r for r in read_minutes(c, 0, 2**40)}
    e.dispose()
    return rows


@pytest.mark.parametrize("v2", [False, True], ids=["rw1", "rw2"])
def test_serving_minutes_stored_as_the_agent_scrape_gives_them(database_url, live_server, v2) -> None:
    srv = live_server(database_url)
    t0 = (int(time.time()) // 60 - 6) * 60 + 7  # recent, within the collector's age limits
    res = simulate(EngineModel(), Workload(rate_rps=4, duration_s=250, seed=5), engine="vllm", drain=False)
    pages = [(t0 + t, page) for t, page in res.pages]
    assert len(pages) >= 17  # 15 s scrapes over four minutes and more
    it = iter(p for _, p in pages)
    agent = ServingScraper(fetch=lambda url: next(it))
    agent.set_targets([ServingTarget("chat", "ml/chat-0", "vllm", "http://x/metrics")])
    for t, _ in pages:
        agent.scrape(t)
    want = {r["minute"]: r for r in agent.drain(pages[-1][0] + 3600, gpus_of=lambda j: [GPU])}

    sent = []
    for t, page in pages:
        ts = int(t * 1000)
        series = [_gpu_series(ts), *_page_series(page, ts, POD), *_page_series(page, ts, BARE)]
        half = len(series) // 2
        for part in (series[:half], series[half:]):  # one scrape cut over two bodies, as shards do
            raw = request_v2(part) if v2 else body(part)
            r = (httpx.post(srv.url + "/api/v1/write", content=wire.snappy(raw), headers=V2_HEADERS, timeout=30)
                 if v2 else post(srv.url, raw))
            assert r.status_code == 200, r.text
            if v2:  # every sample is held: the GPU row's value and the serving fold's
                assert int(r.headers["X-Prometheus-Remote-Write-Samples-Written"]) == sum(len(x) for _, x in part)
            sent.append(raw)
    assert stored(make_engine(database_url))  # the GPU rows, as ever

    # a minute is stored once a scrape past its end is folded: every one but the last two or so
    rows = _rows(database_url)
    last_scrape = pages[-1][0]
    finished = {m for m in want if m + 60 <= last_scrape - 20}
    assert finished and finished <= {m for (rep, m) in rows if rep == "ml/chat-0"}
    for m in finished:
        row = rows["ml/chat-0", m]
        assert row.measures == want[m]["measures"], m
        assert (row.deployment, row.engine, row.gpus, row.gpu_uuids, row.job_id, row.node) == \
            ("chat", "vllm", 1, [GPU], "ml/chat-0", "node-a")
        bare = rows["10.0.0.9:8000", m]
        assert bare.measures == want[m]["measures"]
        assert (bare.gpus, bare.gpu_uuids, bare.job_id) == (0, None, None)  # not attributed: unknown

    # a body sent again (Prometheus retries after a lost answer) changes nothing
    before = _rows(database_url)
    r = post(srv.url, sent[-1]) if not v2 else httpx.post(srv.url + "/api/v1/write", content=wire.snappy(sent[-1]),
                                                           headers=V2_HEADERS, timeout=30)
    assert r.status_code == 200
    assert {k: v.measures for k, v in _rows(database_url).items()} == {k: v.measures for k, v in before.items()}
    m = _metrics(srv.url)
    assert m["gpufleet_remote_write_serving_samples_total", "late"] > 0
    assert m["gpufleet_remote_write_serving_minutes_total", "stored"] == len(before)
    assert m["gpufleet_remote_write_serving_replicas", ""] == 2
    assert m["gpufleet_remote_write_cache_bytes", "serving"] > 0

    # shutdown stores what is held: every minute, the requests adding up to the engine's counter
    srv.stop()
    rows = _rows(database_url)
    assert {m for (rep, m) in rows if rep == "ml/chat-0"} == set(want)
    first, last = pages[0][0] - t0, pages[-1][0] - t0
    truth = sum(1 for q in res.finished() if first <= q.finished < last)  # per-request ground truth
    got = sum(r.measures.get("requests", 0.0) for (rep, _), r in rows.items() if rep == "ml/chat-0")
    assert got == truth > 0


def test_malformed_serving_series_are_dropped_and_counted_and_the_rest_stored(database_url, live_server) -> None:
    srv = live_server(database_url)
    ts = int(time.time() * 1000) - 30_000
    bad = [
        ({"__name__": "vllm:time_to_first_token_seconds_bucket", "le": "soon", **POD}, [(ts, 3.0)]),
        ({"__name__": "vllm:num_requests_running", "job": "vllm"}, [(ts, 1.0)]),  # names no replica
        ({"__name__": "vllm:num_requests_running", **POD, "pod": "x" * 300}, [(ts, 1.0)]),  # too long to store
        ({"__name__": "vllm:request_success_total", **POD}, [(ts, float("inf"))]),
        ({"__name__": "vllm:cache_config_info", **POD}, [(ts, 1.0)]),  # an engine series no measure reads
    ]
    good = [({"__name__": "vllm:num_requests_running", **POD}, [(ts, 3.0)]), _gpu_series(ts)]
    r = post(srv.url, body([*bad, *good]))
    assert r.status_code == 200, r.text
    assert r.json()["stored"] == 1  # the GPU row
    ignored = r.json()["ignored_series"]
    assert {k: ignored.get(k) for k in ("serving_bad_bucket", "serving_no_replica", "serving_bad_identity",
                                        "serving_metric_not_used")} == dict.fromkeys(
        ("serving_bad_bucket", "serving_no_replica", "serving_bad_identity", "serving_metric_not_used"), 1)
    assert len(stored(make_engine(database_url))) == 1
    m = _metrics(srv.url)
    assert m["gpufleet_remote_write_ignored_series_total", "serving_bad_bucket"] == 1
    assert m["gpufleet_remote_write_serving_samples_total", "not_finite"] == 1
    assert m["gpufleet_remote_write_serving_samples_total", "folded"] == 1
    srv.stop()  # the good series' minute (a gauge) is stored at shutdown
    rows = _rows(database_url)
    assert list(rows) == [("ml/chat-0", ts // 60_000 * 60)]
    assert rows["ml/chat-0", ts // 60_000 * 60].measures == {"running": 3.0}
    with make_engine(database_url).connect() as c:
        assert c.execute(text("select count(*) from serving_minutes")).scalar() == 1


def test_fuzzed_serving_labels_and_values_never_cost_a_5xx_or_the_gpu_rows(database_url, live_server) -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from tests.reliability.test_intake_fuzz import FUZZ, LABEL_VALUE, SAMPLE_VALUE

    srv = live_server(database_url)
    t0 = (int(time.time()) // 60 - 30) * 60
    step = iter(range(10**6))

    @FUZZ
    @given(ns=LABEL_VALUE, pod=LABEL_VALUE, deployment=LABEL_VALUE, le=LABEL_VALUE, value=SAMPLE_VALUE,
           counter=st.lists(SAMPLE_VALUE, min_size=3, max_size=3))
    def run(ns: str, pod: str, deployment: str, le: str, value: float, counter: list[float]) -> None:
        k = next(step)
        target = {"namespace": ns, "pod": pod, "gpufleet_deployment": deployment, "instance": f"h{k}:8000"}
        series = [_gpu_series((t0 + k) * 1000)]
        for i, c in enumerate(counter):  # three scrapes of one replica: its first minute is finished and written
            ts = (t0 + k + 65 * i) * 1000
            series += [({"__name__": "vllm:request_success_total", **target}, [(ts, c)]),
                       ({"__name__": "vllm:num_requests_running", **target}, [(ts, value)]),
                       ({"__name__": "vllm:e2e_request_latency_seconds_bucket", "le": le, **target}, [(ts, c)])]
        r = post(srv.url, body(series))
        assert r.status_code == 200, r.text

    run()
    m = _metrics(srv.url)
    assert m.get(("gpufleet_remote_write_serving_store_failures_total", ""), 0) == 0
    assert m.get(("gpufleet_remote_write_serving_unsaved_minutes", ""), 0) == 0
    assert m.get(("gpufleet_remote_write_serving_minutes_total", "stored"), 0) > 0
    assert len(stored(make_engine(database_url))) == next(step)  # every example's GPU row

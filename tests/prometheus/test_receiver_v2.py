"""Remote write 2.0 (io.prometheus.write.v2.Request) on a live collector, on SQLite and
PostgreSQL: the bodies are the protobuf library's encoding of the spec's schema (no 2.0 sender
runs here: Debian's Prometheus 2.42 predates it). The same rows as 1.0, stored once; the
X-Prometheus-Remote-Write-*-Written headers on every answer, their count checked against the
database; retries, a 1.0 body of the same samples after it, and broken bodies."""

from __future__ import annotations

import time

import httpx
import pytest

from gpufleet import dcgm
from gpufleet.collector.remote_write import wire
from gpufleet.storage.db import make_engine
from gpufleet.storage.raw_read import raw_records
from tests.prometheus.captures import DUMPS, body, capture_series
from tests.prometheus.prompb import request_v2
from tests.prometheus.rwclient import post, stored, stored_values

V2_HEADERS = {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
              "Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "2.0.0",
              "User-Agent": "gpufleet-test"}
WRITTEN = ("X-Prometheus-Remote-Write-Samples-Written", "X-Prometheus-Remote-Write-Histograms-Written",
           "X-Prometheus-Remote-Write-Exemplars-Written")


def _series(steps: int = 3) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
    t0 = int(time.time() * 1000) - 60_000
    out = []
    for name in DUMPS:
        for lab, v, _ in capture_series(name, instance=f"{name[:6]}:9400"):
            out.append((lab, [(t0 + k * 15_000, v) for k in range(steps)]))
    return out


def post_v2(url: str, raw: bytes, **headers: str) -> httpx.Response:
    return httpx.post(url + "/api/v1/write", content=wire.snappy(raw), headers={**V2_HEADERS, **headers},
                      timeout=30)


def _values_in_rows(url: str) -> int:
    e = make_engine(url)
    with e.connect() as c:
        n = sum(1 for r in raw_records(c) for k, v in r.items() if k not in ("ts", "gpu_pk", "job_pk")
                and v is not None)
    e.dispose()
    return n


def _gpu_fb_extras(series: list[tuple[dict[str, str], list[tuple[int, float]]]]) -> int:
    """Samples of framebuffer free/reserved series of identified GPUs: folded into the GPU's
    memory total, not a row's value, and held all the same."""
    return sum(len(s) for lab, s in series if lab["__name__"] in dcgm.FB_EXTRA and lab.get("UUID"))


def test_v2_stores_the_rows_v1_stores_once_with_written_headers_counted_from_the_database(database_url,
                                                                                         live_server) -> None:
    srv = live_server(database_url)
    e = make_engine(database_url)
    series = _series()
    raw = request_v2(series)
    r = post_v2(srv.url, raw)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["stored"] == 18 and got["duplicate_batches"] == 0  # six GPUs x three scrapes, as 1.0
    rows = stored(e)
    assert len(rows) == 18 and set(rows.values()) == {1}
    power = stored_values(e, "power_w")
    assert power[("GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", series[0][1][0][0] / 1000)] == pytest.approx(8.969)
    written = int(r.headers[WRITTEN[0]])
    assert written == _values_in_rows(database_url) + _gpu_fb_extras(series) == got["samples_written"]
    assert written < sum(len(s) for _, s in series)  # the placeholders and non-GPU series are not written
    assert r.headers[WRITTEN[1]] == "0" and r.headers[WRITTEN[2]] == "0"
    # Prometheus' retry after a lost answer: the same bytes, acknowledged, held, not doubled
    again = post_v2(srv.url, raw)
    assert again.status_code == 200 and again.json()["stored"] == 0
    assert again.json()["duplicate_batches"] == got["nodes"]
    assert again.headers[WRITTEN[0]] == str(written)
    # the same samples as 1.0 (a sender switching back): same series keys, no row stored twice
    one = post(srv.url, body(series))
    assert one.status_code == 200 and one.json()["stored"] == 0 and one.json()["rows_already_stored"] == 18
    assert WRITTEN[0] not in one.headers  # 1.0 answers carry no 2.0 headers
    assert stored(e) == rows
    # a later scrape, one sample per series, as a shard's steady state: the columnar path counts
    # what it holds the same way
    before = _values_in_rows(database_url)
    later = [(lab, [(s[-1][0] + 15_000, v)]) for lab, s in series for (_, v) in s[-1:]]
    nxt = post_v2(srv.url, request_v2(later))
    assert nxt.status_code == 200 and nxt.json()["columnar"] and nxt.json()["stored"] == 6, nxt.text
    assert int(nxt.headers[WRITTEN[0]]) == _values_in_rows(database_url) - before + _gpu_fb_extras(later) > 0
    e.dispose()


NVLINK_TX = "DCGM_FI_PROF_NVLINK_TX_BYTES"  # a counter without the _total suffix: only its type says so


def _gpu(n: int) -> dict[str, str]:
    return {"UUID": f"GPU-0000aaaa-0000-0000-0000-00000000000{n}", "gpu": "0", "Hostname": f"n{n}",
            "modelName": "NVIDIA H100 80GB HBM3"}


def _records_by_time(url: str) -> list[dict[str, object]]:
    e = make_engine(url)
    with e.connect() as c:
        recs = sorted(raw_records(c), key=lambda x: x["ts"])
    e.dispose()
    return recs


def test_v2_counters_become_rates_by_their_metadata_type(sqlite_url, live_server) -> None:
    srv = live_server(sqlite_url)
    t0 = int(time.time() * 1000) - 60_000
    gpu, name = _gpu(1), NVLINK_TX
    series = [({"__name__": name, **gpu}, [(t0, 1e9), (t0 + 10_000, 3e9)]),
              ({"__name__": "DCGM_FI_DEV_GPU_TEMP", **gpu}, [(t0, 40.0), (t0 + 10_000, 41.0)])]
    r = post_v2(srv.url, request_v2(series, {name: 1, "DCGM_FI_DEV_GPU_TEMP": 2}))
    assert r.status_code == 200, r.text
    recs = _records_by_time(sqlite_url)
    assert [x["temp_c"] for x in recs] == [40.0, 41.0]
    # (3e9 - 1e9) bytes over 10 s; the first sample only starts the rate
    assert recs[0].get("nvlink_tx_bytes_s") is None and recs[1]["nvlink_tx_bytes_s"] == pytest.approx(2e8)
    assert r.json()["dropped_samples"] == {"counter_first_sample": 1}


@pytest.mark.parametrize(("headers", "content", "status", "needle"), [
    ({}, wire.snappy(wire.encode([(wire.encode_labels([("UUID", "GPU-1")]), [(1, 2.0)])])), 400, "1.0 body"),
    ({}, wire.snappy(bytes([0x2A, 0x05, 0x0A, 0x09])), 400, "v2.Request"),
    ({}, b"\x05not snappy", 400, "snappy"),
    ({"Content-Encoding": "zstd"}, None, 415, "snappy"),
    ({"Authorization": "Bearer nope"}, None, 401, ""),
])
def test_v2_bodies_that_can_never_be_stored_answer_with_zero_written_and_store_nothing(
        sqlite_url, live_server, headers, content, status, needle) -> None:
    srv = live_server(sqlite_url, allow_anonymous=status != 401)
    h = {**V2_HEADERS, **headers}
    r = httpx.post(srv.url + "/api/v1/write", content=content or wire.snappy(request_v2(_series(1))), headers=h)
    assert r.status_code == status and needle in r.json()["detail"], r.text
    assert [r.headers.get(k) for k in WRITTEN] == ["0", "0", "0"]
    e = make_engine(sqlite_url)
    assert stored(e) == {}
    e.dispose()


def test_an_unknown_protobuf_message_is_415_naming_both_that_are_spoken(sqlite_url, live_server) -> None:
    srv = live_server(sqlite_url)
    v3 = "application/x-protobuf;proto=io.prometheus.write.v3.Request"
    r = post(srv.url, body(_series(1)), **{"Content-Type": v3})
    assert r.status_code == 415
    assert "prometheus.WriteRequest" in r.json()["detail"] and "io.prometheus.write.v2.Request" in r.json()["detail"]
    # 1.0 named explicitly is 1.0
    ok = post(srv.url, body(_series(1)), **{"Content-Type": "application/x-protobuf; proto=prometheus.WriteRequest"})
    assert ok.status_code == 200 and ok.json()["stored"] == 6
    # /metrics tells the versions apart (a fleet moving its senders to 2.0 watches this)
    t0 = int(time.time() * 1000) - 30_000
    v2 = post_v2(srv.url, request_v2([({"__name__": "DCGM_FI_DEV_GPU_TEMP", **_gpu(5)}, [(t0, 41.0)])], {}))
    assert v2.status_code == 200, v2.text
    text = httpx.get(srv.url + "/metrics").text
    assert 'gpufleet_remote_write_requests_total{status="415",version="unknown"} 1.0' in text
    assert 'gpufleet_remote_write_requests_total{status="200",version="1.0"} 1.0' in text
    assert 'gpufleet_remote_write_requests_total{status="200",version="2.0"} 1.0' in text


def test_a_steady_v2_stream_takes_the_columnar_path_and_its_types_apply_there(sqlite_url, live_server) -> None:
    # One sample per series per request, as a Prometheus shard sends: from the second request on
    # the series are known and the C pass's columns are converted whole. The NVLink counter is
    # untyped in the first request (stored as it reads) and typed COUNTER from the second: only
    # the columnar path's own reading of the types can make the third request's value a rate.
    srv = live_server(sqlite_url)
    t0 = int(time.time() * 1000) - 60_000
    gpu, name = _gpu(2), NVLINK_TX
    answers = []
    for k, (tx, types) in enumerate([(1e6, {}), (3e9, {name: 1}), (5e9, {name: 1})]):
        series = [({"__name__": name, **gpu}, [(t0 + k * 10_000, tx)]),
                  ({"__name__": "DCGM_FI_DEV_GPU_TEMP", **gpu}, [(t0 + k * 10_000, 40.0 + k)])]
        r = post_v2(srv.url, request_v2(series, {"DCGM_FI_DEV_GPU_TEMP": 2, **types}))
        assert r.status_code == 200, r.text
        answers.append(r.json())
    assert [a["columnar"] for a in answers] == [False, True, True]
    assert answers[1]["dropped_samples"] == {"counter_first_sample": 1} and answers[2]["dropped_samples"] == {}
    recs = _records_by_time(sqlite_url)
    assert [x["temp_c"] for x in recs] == [40.0, 41.0, 42.0]
    assert recs[0]["nvlink_tx_bytes_s"] == pytest.approx(1e6)  # untyped: stored as it read
    assert recs[1]["nvlink_tx_bytes_s"] is None  # typed COUNTER: the first sample only starts the rate
    assert recs[2]["nvlink_tx_bytes_s"] == pytest.approx(2e8)  # (5e9 - 3e9) bytes over 10 s

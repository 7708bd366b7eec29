"""POST /api/v1/write on a live collector, on SQLite and PostgreSQL: stored once, retries
acknowledged as duplicates, Prometheus' 2xx / 4xx / 5xx contract, tokens, /metrics."""

from __future__ import annotations

import time

import httpx
import pytest

from gpufleet.collector.remote_write import wire
from gpufleet.collector.remote_write.routes import c_extensions
from gpufleet.collector.writer import Overloaded
from gpufleet.storage import tokens
from gpufleet.storage.db import make_engine
from tests.prometheus.captures import DUMPS, body, capture_series
from tests.prometheus.rwclient import post, stored, stored_values

T0 = int(time.time() * 1000) - 60_000


@pytest.fixture(autouse=True)
def _fresh_t0() -> None:
    """T0 (ms) a minute before each test, not before the module's collection: in a long suite
    run a collection-time T0 is older than the collector's cutoffs (STALE_JOB_S ends the jobs)
    by the time a test posts it."""
    global T0
    T0 = int(time.time() * 1000) - 60_000


def _fleet(t0: int | None = None, steps: int = 3) -> bytes:
    t0 = T0 if t0 is None else t0
    series = []
    for name in DUMPS:
        for lab, v, _ in capture_series(name, instance=f"{name[:6]}:9400"):
            series.append((lab, [(t0 + k * 15_000, v) for k in range(steps)]))
    return body(series)


def _gpu_rows(raw: bytes) -> set[tuple[str, float]]:
    from gpufleet.collector.remote_write.mapping import RateState, SeriesMap, convert

    conv = convert(wire.decode(raw), SeriesMap(), RateState(), cluster="default", digest="x", now=time.time(),
                   max_age_s=None, max_future_s=300, max_rows=20_000)
    return {(g, t) for b in conv.batches for g, t in zip(b.samples["gpu"], b.samples["ts"], strict=True)}


def test_stored_once_and_a_retried_request_is_a_duplicate(database_url, live_server) -> None:
    srv = live_server(database_url)
    e = make_engine(database_url)
    raw = _fleet()
    expected = _gpu_rows(raw)
    assert len(expected) == 6 * 3  # six GPUs in the captures, three scrapes
    r = post(srv.url, raw)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["stored"] == 18 and got["duplicate_batches"] == 0
    assert got["ignored_series"]["no_gpu_identity"] > 0  # label-less placeholders in the datadog dump
    assert stored(e) == dict.fromkeys(expected, 1)
    again = post(srv.url, raw)  # Prometheus' retry after a lost answer: the very same bytes
    assert again.status_code == 200 and again.json()["stored"] == 0
    assert again.json()["duplicate_batches"] == got["nodes"]
    assert stored(e) == dict.fromkeys(expected, 1)
    power = stored_values(e, "power_w")
    assert power[("GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", T0 / 1000)] == pytest.approx(8.969)
    with e.connect() as c:
        from sqlalchemy import text

        job = c.execute(text("select source, namespace from jobs where job_id = 'default/dcgmproftester2'")).one()
        nodes = {n for (n,) in c.execute(text("select name from nodes"))}
    assert tuple(job) == ("kubernetes", "default")
    assert {"424773df46e0", "551bdf382151", "computeinstance-e00c1p6dpy98xytphp", "readme"} <= nodes
    e.dispose()


def _literal_snappy(raw: bytes) -> bytes:
    """``raw`` as a valid snappy block of literals only: other bytes than the compressor's for
    the same WriteRequest (what a proxy that re-compresses would send)."""
    out = bytearray()
    wire.put_varint(out, len(raw))
    for i in range(0, len(raw), 65536):
        chunk = raw[i:i + 65536]
        out += bytes([61 << 2]) + (len(chunk) - 1).to_bytes(2, "little") + chunk
    return bytes(out)


def test_the_key_is_the_compressed_bytes_and_a_recompressed_copy_stores_no_row_twice(database_url,
                                                                                   live_server) -> None:
    # The idempotency key hashes the body as received (a sender retries the very buffer it
    # sent). The same WriteRequest compressed differently is another request: not a duplicate
    # batch, but the write path's one sample per (GPU, ts) still stores none of its rows again.
    srv = live_server(database_url)
    e = make_engine(database_url)
    raw = _fleet()
    expected = _gpu_rows(raw)
    assert post(srv.url, raw).json()["stored"] == len(expected)
    other = _literal_snappy(raw)
    assert other != wire.snappy(raw) and wire.unsnappy(other, max_size=len(raw)) == raw
    h = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
    r = httpx.post(srv.url + "/api/v1/write", content=other, headers=h, timeout=30)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["duplicate_batches"] == 0 and got["stored"] == 0
    assert got["rows_already_stored"] == len(expected)
    assert stored(e) == dict.fromkeys(expected, 1)
    e.dispose()


def test_a_503_midway_then_the_retry_stores_every_row_exactly_once(database_url, live_server) -> None:
    srv = live_server(database_url)
    e = make_engine(database_url)
    raw = _fleet()
    coll = srv.app.state.collector
    real = coll.writer.submit
    calls = {"n": 0}

    def full_after_one(prep):  # the real queue, refusing from the second batch on: a full queue
        calls["n"] += 1
        if calls["n"] >= 2:
            raise Overloaded("write queue full (test)")
        return real(prep)

    coll.writer.submit = full_after_one
    r = post(srv.url, raw)
    assert r.status_code == 503 and r.headers["retry-after"]
    partial = stored(e)
    assert 0 < len(partial) < 18 and set(partial.values()) == {1}
    coll.writer.submit = real
    r = post(srv.url, raw)
    assert r.status_code == 200, r.text
    assert r.json()["duplicate_batches"] == 1  # the batch committed before the 503
    assert stored(e) == dict.fromkeys(_gpu_rows(raw), 1)
    e.dispose()


def test_tokens_cluster_scope_and_pinned_nodes(database_url, live_server) -> None:
    srv = live_server(database_url, allow_anonymous=False)
    e = make_engine(database_url)
    cluster_tok = tokens.create_token(e, "prom", "agent", cluster="prod")
    node_tok = tokens.create_token(e, "n1", "agent", cluster="prod", node="n1")
    viewer = tokens.create_token(e, "v", "viewer")
    raw = _fleet(steps=1)
    assert post(srv.url, raw).status_code == 401
    assert post(srv.url, raw, "gpf_wrong").status_code == 401
    assert post(srv.url, raw, viewer).status_code == 403
    r = post(srv.url, raw, node_tok)
    assert r.status_code == 403 and "cluster-scoped" in r.json()["detail"]
    assert httpx.post(srv.url + "/api/v1/write?cluster=other", content=wire.snappy(raw),
                      headers={"Authorization": f"Bearer {cluster_tok}", "Content-Encoding": "snappy",
                               "Content-Type": "application/x-protobuf"}).status_code == 403
    assert stored(e) == {}
    r = post(srv.url, raw, cluster_tok)
    assert r.status_code == 200 and r.json()["stored"] == 6
    from sqlalchemy import text

    with e.connect() as c:
        clusters = {n for (n,) in c.execute(text(
            "select distinct c.name from nodes n join clusters c on c.id = n.cluster_id"))}
    assert clusters == {"prod"}
    e.dispose()


@pytest.mark.parametrize(("headers", "content", "status", "needle"), [
    ({"Content-Encoding": "gzip"}, None, 415, "snappy"),
    ({"Content-Type": "application/json"}, None, 415, "x-protobuf"),
    # a 1.0 body labelled 2.0 (tests/prometheus/test_receiver_v2.py has 2.0 itself)
    ({"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"}, None, 400, "1.0 body"),
    ({"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v3.Request"}, None, 415, "v3"),
    ({}, b"\x05not snappy", 400, "snappy"),
    ({}, wire.snappy(b"\x0a\x09\x0a\x01"), 400, "protobuf"),
    ({}, bytes([0x80, 0x80, 0x80, 0x80, 0x10]), 413, "exceeds"),
])
def test_bodies_that_can_never_be_stored_are_4xx_and_store_nothing(sqlite_url, live_server, headers, content,
                                                                    status, needle) -> None:
    srv = live_server(sqlite_url)
    h = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", **headers}
    r = httpx.post(srv.url + "/api/v1/write", content=content or wire.snappy(_fleet(steps=1)), headers=h)
    assert r.status_code == status and needle in r.json()["detail"], r.text
    e = make_engine(sqlite_url)
    assert stored(e) == {}
    e.dispose()


def test_body_limit_is_413(sqlite_url, live_server) -> None:
    srv = live_server(sqlite_url, max_body_bytes=1000)
    r = post(srv.url, _fleet())
    assert r.status_code == 413


def test_metrics_count_requests_ignored_series_and_rows(sqlite_url, live_server) -> None:
    srv = live_server(sqlite_url)
    assert post(srv.url, _fleet(steps=2)).status_code == 200
    assert post(srv.url, b"\x0f").status_code == 400
    text = httpx.get(srv.url + "/metrics").text
    assert 'gpufleet_remote_write_requests_total{status="200",version="1.0"} 1.0' in text
    assert 'gpufleet_remote_write_requests_total{status="400",version="1.0"} 1.0' in text
    assert "gpufleet_remote_write_rows_total 12.0" in text
    assert 'gpufleet_remote_write_ignored_series_total{reason="no_gpu_identity"}' in text
    # which C passes the install has (the Docker image requires both; a pip install without a
    # compiler runs the Python paths): the server's answer is this venv's build
    for name, loaded in c_extensions().items():
        assert f'gpufleet_c_extension_loaded{{extension="{name}"}} {float(loaded)}' in text
    # the group writer: one commit for this request's batches here, its rows, an empty queue
    w = srv.app.state.collector.writer
    assert w.commits >= 1 and w.batches >= w.commits and w.rows == 12
    assert f"gpufleet_ingest_commits_total {float(w.commits)}" in text
    assert f"gpufleet_ingest_batches_total {float(w.batches)}" in text
    assert "gpufleet_ingest_rows_total 12.0" in text
    assert "gpufleet_ingest_queue_rows 0.0" in text and "gpufleet_ingest_queue_max_rows 400000.0" in text


def test_c_extension_gauge_says_when_the_python_path_runs(monkeypatch) -> None:
    from gpufleet.collector.export import encode

    monkeypatch.setattr(wire, "_NATIVE", None)
    assert c_extensions() == {"remote_write_decoder": False, "export_encoder": encode._NATIVE is not None}
    monkeypatch.setattr(encode, "_NATIVE", None)
    assert not any(c_extensions().values())


def test_analysis_lag_gauge_for_the_prometheus_rule(database_url, live_server) -> None:
    from gpufleet.analysis.runner import run_analysis

    srv = live_server(database_url)

    def lag() -> float:
        line = next(x for x in httpx.get(srv.url + "/metrics").text.splitlines()
                    if x.startswith("gpufleet_analysis_lag_seconds "))
        return float(line.split()[1])

    assert lag() == 0.0  # no jobs: nothing to lag behind
    # samples from a minute ago, taken now: the module's T0 is fixed at collection, and in a
    # long suite run it is older than STALE_JOB_S by this test, so the job would be ended
    # (not running: no lag) before the scrape (CI failed on exactly that)
    fresh = int(time.time() * 1000) - 60_000
    assert post(srv.url, _fleet(t0=fresh, steps=3)).status_code == 200
    assert lag() == pytest.approx(30.0)  # three scrapes 15 s apart, never analysed
    e = make_engine(database_url)
    assert not run_analysis(e).errors
    assert lag() == 0.0
    e.dispose()


def test_a_gpu_held_by_another_node_is_a_4xx_naming_it_and_the_other_nodes_are_stored(database_url,
                                                                                       live_server) -> None:
    from tests.collector.conftest import gpu_uuid, make_batch
    from tests.collector.test_ingest import post as post_batch

    srv = live_server(database_url)
    e = make_engine(database_url)
    taken = gpu_uuid("node-a", 0)
    assert post_batch(srv.url, make_batch("node-a", gpus=1, seconds=1, start=time.time() - 30)).status_code == 200
    before = stored(e)
    raw = body([({"__name__": "DCGM_FI_DEV_POWER_USAGE", "UUID": taken, "gpu": "0", "Hostname": "node-b"},
                 [(T0, 100.0)]),
                ({"__name__": "DCGM_FI_DEV_POWER_USAGE", "UUID": "GPU-free", "gpu": "0", "Hostname": "node-c"},
                 [(T0, 200.0)])])
    r = post(srv.url, raw)
    assert r.status_code == 409 and taken in r.json()["detail"] and "node-a" in r.json()["detail"], r.text
    got = stored(e)
    assert got - before == {("GPU-free", T0 / 1000): 1}  # node-c stored, node-b's row not
    text = httpx.get(srv.url + "/metrics").text
    assert 'gpufleet_remote_write_requests_total{status="409",version="1.0"} 1.0' in text  # counted once
    e.dispose()


def test_a_gpu_split_over_two_shards_stores_both_shards_fields(database_url, live_server) -> None:
    """A sender's shards carry one GPU's series in separate requests: the second shard's field
    of a row the first stored is stored too (one row, both fields); only a request bringing no
    new field is counted as rows already stored (docs/prometheus.md, Sharding)."""
    srv = live_server(database_url)
    e = make_engine(database_url)
    gpu = {"UUID": "GPU-split", "gpu": "0", "Hostname": "node-s"}
    first = post(srv.url, body([({"__name__": "DCGM_FI_DEV_POWER_USAGE", **gpu}, [(T0, 300.0)])]))
    second = post(srv.url, body([({"__name__": "DCGM_FI_DEV_GPU_UTIL", **gpu}, [(T0, 50.0)])]))
    assert first.status_code == second.status_code == 200
    assert first.json()["rows_already_stored"] == 0 and second.json()["rows_already_stored"] == 0
    assert second.json()["stored"] == 1
    assert stored(e) == {("GPU-split", T0 / 1000): 1}
    assert stored_values(e, "gpu_util") == {("GPU-split", T0 / 1000): 0.5}  # the second shard's field
    assert stored_values(e, "power_w") == {("GPU-split", T0 / 1000): 300}
    again = post(srv.url, body([({"__name__": "DCGM_FI_DEV_GPU_UTIL", **gpu}, [(T0, 70.0)])]))
    assert again.status_code == 200 and again.json()["rows_already_stored"] == 1  # nothing new: first wins
    assert stored_values(e, "gpu_util") == {("GPU-split", T0 / 1000): 0.5}
    assert "gpufleet_remote_write_rows_already_stored_total 1.0" in httpx.get(srv.url + "/metrics").text
    e.dispose()


def test_concurrent_requests_are_parsed_one_at_a_time_on_the_receivers_thread(database_url, live_server) -> None:
    """Requests in flight together (a sender's shards) are parsed on the receiver's one parse
    thread, never two at once (a thread pool ran them side by side, only to take turns on the
    GIL and the receiver's lock), and every row is stored once."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    srv = live_server(database_url)
    rec = srv.app.state.remote_write
    parse = rec._parse
    threads: set[str] = set()
    busy = [0, 0]  # parses running now, the most at once
    guard = threading.Lock()

    def watched(*args):  # the real _parse, recording where and how many at once it runs
        with guard:
            threads.add(threading.current_thread().name)
            busy[0] += 1
            busy[1] = max(busy)
        try:
            time.sleep(0.02)  # long enough that requests overlap here if they can
            return parse(*args)
        finally:
            with guard:
                busy[0] -= 1

    rec._parse = watched
    bodies = [body([({"__name__": "DCGM_FI_DEV_POWER_USAGE", "UUID": f"GPU-c{k}", "gpu": "0",
                      "Hostname": f"node-c{k}"}, [(T0, 300.0)])]) for k in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda raw: post(srv.url, raw), bodies))
    assert [r.status_code for r in answers] == [200] * 8
    assert busy[1] == 1 and len(threads) == 1 and threads.pop().startswith("gpufleet-rw-parse")
    e = make_engine(database_url)
    assert stored(e) == {(f"GPU-c{k}", T0 / 1000): 1 for k in range(8)}
    e.dispose()


def test_bodies_parsed_together_share_a_commit_and_the_count_returns_to_zero(database_url, live_server) -> None:
    """While bodies wait for the parse thread, the writer's group waits for them (the linger):
    8 bodies in flight at once, each parse 0.1 s, are committed in a few groups, where one
    commit each followed the parses before. Refused bodies leave the in-flight count too (a
    count that stayed up would make every later commit wait out the linger)."""
    from concurrent.futures import ThreadPoolExecutor

    srv = live_server(database_url)
    rec = srv.app.state.remote_write
    parse = rec._parse

    def slow(*args):
        time.sleep(0.1)
        return parse(*args)

    rec._parse = slow
    bodies = [body([({"__name__": "DCGM_FI_DEV_POWER_USAGE", "UUID": f"GPU-l{k}", "gpu": "0",
                      "Hostname": f"node-l{k}"}, [(T0, 300.0)])]) for k in range(8)]
    writer = rec.coll.writer
    before = writer.commits
    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda raw: post(srv.url, raw), [*bodies, b"\x0f", b"not snappy"]))
    assert [r.status_code for r in answers] == [200] * 8 + [400] * 2
    # 8 requests posted together: at most a straggler or two misses the first group (each
    # commit right after its parse would make 8)
    assert writer.commits - before <= 4, writer.commits - before
    assert rec._parsing == 0
    e = make_engine(database_url)
    assert stored(e) == {(f"GPU-l{k}", T0 / 1000): 1 for k in range(8)}
    e.dispose()


def test_a_body_without_the_framebuffer_series_keeps_the_gpus_memory_total(database_url, live_server) -> None:
    """A sender cuts a scrape into bodies anywhere: a body without a GPU's framebuffer series
    must not erase the memory total an earlier body gave (known series: the columnar path too)."""
    from sqlalchemy import text

    srv = live_server(database_url)
    e = make_engine(database_url)
    gpu = {"UUID": "GPU-mem", "gpu": "0", "Hostname": "node-m"}
    fb = body([({"__name__": "DCGM_FI_DEV_FB_USED", **gpu}, [(T0, 1000.0)]),
               ({"__name__": "DCGM_FI_DEV_FB_FREE", **gpu}, [(T0, 3000.0)])])
    assert post(srv.url, fb).status_code == 200
    for k in (1, 2):  # the second time its series are known
        util = body([({"__name__": "DCGM_FI_DEV_GPU_UTIL", **gpu}, [(T0 + k * 15_000, 50.0)])])
        r = post(srv.url, util)
        assert r.status_code == 200 and r.json()["columnar"] == (k == 2) and r.json()["stored"] == 1
        with e.connect() as c:
            total = c.execute(text("select memory_total_bytes from gpus where uuid = 'GPU-mem'")).scalar_one()
        assert total == 4000 * 2**20
    e.dispose()


def test_a_gpu_list_that_breaks_a_limit_is_refused_every_time_the_checked_lists_are_remembered() -> None:
    """The receiver checks each distinct (gpus, jobs) pair of lists once (check_gpus / check_jobs
    depend on the lists alone): a list that failed is checked, and refused, again."""
    from types import SimpleNamespace

    from gpufleet.collector.remote_write.receiver import Receiver
    from gpufleet.pod_jobs import DEFAULT_PATTERNS

    coll = SimpleNamespace(config=SimpleNamespace(max_age_s=None, max_future_s=300.0,
                                                  kubernetes_job_patterns=DEFAULT_PATTERNS),
                           settings=SimpleNamespace(http=SimpleNamespace(max_rows_per_batch=20_000)))
    rec = Receiver(coll)
    long_uuid = "GPU-" + "x" * 100  # gpus[].uuid: at most 96 characters
    for k in range(3):  # the third time the series are known: the columnar path
        raw = body([({"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": long_uuid, "gpu": "0", "Hostname": "bad"},
                     [(T0 + k, 40.0)]),
                    ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": "GPU-ok", "gpu": "0", "Hostname": "good"},
                     [(T0 + k, 41.0)])])
        conv = rec._parse(wire.snappy(raw), "default", 1 << 20)
        assert not isinstance(conv, tuple)
        assert conv.columnar == (k > 0)
        assert len(conv.rejected) == 1 and "node 'bad'" in conv.rejected[0][1] and "uuid" in conv.rejected[0][1]
        assert [p.batch.agent.node for p in conv.prepared] == ["good"]
    assert len(rec._dims_ok) == 1  # the good node's lists, remembered once


def test_the_servers_kubernetes_job_patterns_group_pods_arriving_by_remote_write(database_url, live_server) -> None:
    """GPUFLEET_KUBERNETES_JOB_PATTERNS on the server (the agent's variable): a StatefulSet's
    replicas on two nodes are one job with both GPUs, through real HTTP into the database."""
    from sqlalchemy import text

    srv = live_server(database_url, collector__kubernetes_job_patterns=(r"^(?P<job>vllm-.+)-\d+$",))
    e = make_engine(database_url)
    series = [({"__name__": "DCGM_FI_DEV_POWER_USAGE", "UUID": f"GPU-sts-{i}", "gpu": "0", "Hostname": f"node-{i}",
                "exported_pod": f"vllm-llama-{i}", "exported_namespace": "serve"}, [(T0, 300.0 + i)])
              for i in range(2)]
    r = post(srv.url, body(series))
    assert r.status_code == 200 and r.json()["stored"] == 2, r.text
    with e.connect() as c:
        jobs = sorted(c.execute(text("select job_id, name from jobs")).all())
        gpus = sorted(c.execute(text(
            "select g.uuid from allocations a join gpus g on g.id = a.gpu_pk join jobs j on j.id = a.job_pk"
            " where j.job_id = 'serve/vllm-llama'")).scalars())
    e.dispose()
    assert [tuple(j) for j in jobs] == [("serve/vllm-llama", "vllm-llama")]
    assert gpus == ["GPU-sts-0", "GPU-sts-1"]


def test_a_bad_pod_job_pattern_stops_the_server_naming_it(monkeypatch) -> None:
    from gpufleet.settings import Settings, SettingsError

    monkeypatch.setenv("GPUFLEET_KUBERNETES_JOB_PATTERNS", r"^(?P<job>a-.+)-\d+$, ^vllm-(\d+$")
    with pytest.raises(SettingsError, match=r"KUBERNETES_JOB_PATTERNS=.*pod job pattern '\^vllm-\(.*' is not a reg"):
        Settings.from_env()
    monkeypatch.setenv("GPUFLEET_KUBERNETES_JOB_PATTERNS", r"^(?P<job>a-.+)-\d+$, ^vllm-\d+$")
    with pytest.raises(SettingsError, match=r"has no \(\?P<job>\.\.\.\) group"):
        Settings.from_env()
    monkeypatch.setenv("GPUFLEET_KUBERNETES_JOB_PATTERNS", r" ^(?P<job>a-.+)-\d+$ , ^(?P<job>b-.+)-\d+$")
    assert Settings.from_env().collector.kubernetes_job_patterns == (r"^(?P<job>a-.+)-\d+$", r"^(?P<job>b-.+)-\d+$")
    monkeypatch.setenv("GPUFLEET_KUBERNETES_JOB_PATTERNS", "none")
    assert Settings.from_env().collector.kubernetes_job_patterns == ("none",)

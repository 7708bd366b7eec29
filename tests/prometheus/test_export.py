"""Remote-write export (collector/export): the encoding against the decoder, the bounded
persistent queue, and a live collector exporting to Debian's victoria-metrics and to
prometheus --web.enable-remote-write-receiver, read back with PromQL, through an outage of the
receiver (retried, nothing lost, nothing doubled) and a receiver that refuses (counted)."""

from __future__ import annotations

import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest

from gpufleet.catalog import CATALOG
from gpufleet.collector.export.encode import Encoder, RowSource
from gpufleet.collector.export.spool import Spool
from gpufleet.collector.remote_write import wire
from tests.collector.conftest import gpu_uuid, make_batch
from tests.collector.test_ingest import post
from tests.prometheus.procs import start_prometheus, start_victoria_metrics

NAMES = CATALOG.names


def _src(ts: list[float], vals: dict[str, list[float]]) -> RowSource:
    n = len(ts)
    m = np.full((len(NAMES), n), np.nan)
    for f, col in vals.items():
        m[NAMES.index(f)] = col
    return RowSource(cluster="c1", node="n1", ts=np.array(ts), gpu=["GPU-a"] * (n - 1) + ["GPU-b"],
                     job=["j1"] * (n - 1) + [None], vals=m, gpu_index={"GPU-a": 3, "GPU-b": 4},
                     job_user={"j1": "alice"})


def _decode(parts: list[bytes]) -> dict[tuple[tuple[str, str], ...], list[tuple[int, float]]]:
    req = wire.decode(b"".join(parts))
    return {tuple(sorted(wire.labels_of(s.key).items())): s.samples for s in req.series}


def test_encoding_decodes_to_the_rows_labels_and_no_nan() -> None:
    t0 = 1_790_000_000.25
    src = _src([t0, t0 + 1, t0 + 2], {"power_w": [100.0, math.nan, 300.0], "sm_active": [0.0, 0.5, 1.0]})
    parts, n = Encoder().series(src)
    got = _decode(parts)
    a = {"cluster": "c1", "node": "n1", "gpu": "3", "uuid": "GPU-a", "job": "j1", "user": "alice"}
    b = {"cluster": "c1", "node": "n1", "gpu": "4", "uuid": "GPU-b"}  # no job: no job/user label
    key = lambda name, lab: tuple(sorted({"__name__": name, **lab}.items()))  # noqa: E731
    ms = int(t0 * 1000)
    assert got == {key("gpufleet_power_w", a): [(ms, 100.0)],  # the NaN row is not a sample
                   key("gpufleet_sm_active", a): [(ms, 0.0), (ms + 1000, 0.5)],
                   key("gpufleet_power_w", b): [(ms + 2000, 300.0)],
                   key("gpufleet_sm_active", b): [(ms + 2000, 1.0)]}
    assert n == 5
    few, n2 = Encoder(fields=["power_w"], labels=["uuid", "job"]).series(src)
    assert set(_decode(few)) == {key("gpufleet_power_w", {"uuid": "GPU-a", "job": "j1"}),
                                 key("gpufleet_power_w", {"uuid": "GPU-b"})} and n2 == 2
    with pytest.raises(ValueError, match="not catalog fields"):
        Encoder(fields=["power"])
    with pytest.raises(ValueError, match="labels"):
        Encoder(labels=["pod"])


def test_a_nodes_batches_are_merged_into_one_series_per_gpu_and_field_in_time_order() -> None:
    from gpufleet.collector.columns import prepare
    from gpufleet.collector.export.exporter import merged_sources, source_of

    later, earlier = (prepare(make_batch("n1", seq=k, start=1_790_000_000.0 + 10 * (1 - k), gpus=2, seconds=3,
                                         fields=("power_w",))) for k in range(2))
    other = prepare(make_batch("n2", gpus=1, seconds=2, fields=("power_w",)))
    srcs = merged_sources([later, other, earlier])  # committed out of time order (a replayed spool)
    assert [(x.cluster, x.node, len(x.ts)) for x in srcs] == [("default", "n1", 12), ("default", "n2", 2)]
    enc = Encoder(fields=["power_w"])
    merged = _decode([p for x in srcs for p in enc.series(x)[0]])
    per_batch = [_decode(enc.series(source_of(b))[0]) for b in (later, other, earlier)]
    assert len(merged) == 3 and sum(len(d) for d in per_batch) == 5  # 2 + 1 + 2 series before
    for key, samples in merged.items():
        assert [t for t, _ in samples] == sorted(t for t, _ in samples), key
        assert sorted(samples) == sorted(x for d in per_batch for x in d.get(key, []))


def test_vectorised_samples_equal_the_plain_encoding_including_odd_timestamps() -> None:
    from gpufleet.collector.export.encode import samples_bytes

    rng = np.random.default_rng(1)
    for ts in (rng.integers(1 << 35, 1 << 42, 500), np.array([0, 5, -7, 1 << 50])):
        v = rng.normal(size=len(ts))
        plain = b"".join(wire.encode_sample(int(t), float(x)) for t, x in zip(ts, v, strict=True))
        assert samples_bytes(ts.astype(np.int64), v) == plain


def test_series_of_odd_timestamps_take_the_general_path_and_decode_the_same() -> None:
    """Timestamps outside 1971-2109 have varints of other lengths: the series are cut by the
    samples' real sizes, not 18 bytes each."""
    for t0 in (1.5, 1_790_000_000.0):
        src = _src([t0, t0 + 1, t0 + 2], {"power_w": [1.0, 2.0, 3.0], "sm_active": [0.5, math.nan, 0.25]})
        got = _decode(Encoder().series(src)[0])
        ms = round(t0 * 1000)
        assert sorted(v for x in got.values() for v in x) == sorted(
            [(ms, 1.0), (ms + 1000, 2.0), (ms + 2000, 3.0), (ms, 0.5), (ms + 2000, 0.25)])
        assert len(got) == 4  # (power_w, sm_active) x (GPU-a with j1, GPU-b without a job)


def test_bodies_decode_to_every_non_nan_value_of_every_row_with_its_labels_and_repeat_identically() -> None:
    """A per-sample reference built from the rows in plain Python against the vectorised
    encoder over several sources at once: one with a single job on every row (GPU-only
    grouping), one whose GPUs run different jobs or none, NaN holes (some series empty), a
    field subset; encoded twice (the second from the cached layouts) to the same bytes."""
    rng = np.random.default_rng(7)
    t0 = 1_790_000_000.0

    def src(node: str, gpus: int, seconds: int, jobs: list[str | None]) -> RowSource:
        gpu = [f"GPU-{node}-{g}" for _ in range(seconds) for g in range(gpus)]
        ts = np.array([t0 + s + 0.125 * g for s in range(seconds) for g in range(gpus)])
        vals = rng.normal(size=(len(NAMES), len(ts)))
        vals[rng.random(vals.shape) < 0.2] = np.nan
        vals[NAMES.index("power_w"), : 2 * gpus] = np.nan  # a series missing its first two rows
        return RowSource(cluster="c", node=node, ts=ts, gpu=gpu, job=[jobs[g] for _ in range(seconds) for g in
                                                                       range(gpus)], vals=vals,
                         gpu_index={f"GPU-{node}-{g}": g for g in range(gpus)}, job_user={"ja": "u1", "jb": None})

    srcs = [src("n1", 4, 6, ["ja"] * 4), src("n2", 3, 5, ["ja", "jb", None])]
    for fields in (None, ["power_w", "sm_active", "fb_used_bytes"]):
        enc = Encoder(fields)
        want: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
        for x in srcs:
            for r in range(len(x.ts)):
                u, j = x.gpu[r], x.job[r]
                lab = {"cluster": x.cluster, "node": x.node, "gpu": str(x.gpu_index[u]), "uuid": u}
                if j:
                    lab["job"] = j
                    if x.job_user[j]:
                        lab["user"] = x.job_user[j]
                for f in fields or NAMES:
                    v = float(x.vals[NAMES.index(f), r])
                    if not math.isnan(v):
                        key = tuple(sorted({"__name__": f"gpufleet_{f}", **lab}.items()))
                        want.setdefault(key, []).append((round(float(x.ts[r]) * 1000), v))
        body, n = enc.encode(srcs)
        got = _decode([body])
        assert got == {k: sorted(v) for k, v in want.items()}
        assert n == sum(len(v) for v in want.values())
        assert enc.encode(srcs) == (body, n)



def test_the_c_pass_writes_the_numpy_paths_bytes() -> None:
    """The optional C encoder (_encode_c.c) against the numpy path it replaces, byte for byte:
    several sources, one job or several or none per GPU, NaN holes and all-NaN series, a field
    subset, rows out of time order, and timestamps whose varints are not 6 bytes (before 1971,
    negative, after 2109: the numpy path's per-sample fallback)."""
    from gpufleet.collector.export.encode import _NATIVE

    if _NATIVE is None:
        import shutil
        import sysconfig

        # Where it can be built (a compiler and the Python headers), not built is a broken install,
        # not a skip: the benches and a user's collector would silently take the slow path.
        header = Path(sysconfig.get_paths()["include"]) / "Python.h"
        assert not (shutil.which("cc") and header.exists()), \
            "a C compiler is here but the export's C pass is not built: pip install -e . (or build_ext --inplace)"
        pytest.skip("no C compiler here: the numpy path encodes (same bytes)")
    rng = np.random.default_rng(11)

    def src(node: str, gpus: int, seconds: int, t0: float, jobs: list[str | None]) -> RowSource:
        order = rng.permutation(gpus * seconds)  # rows need not come in time order
        gpu = [f"GPU-{node}-{k % gpus}" for k in order]
        ts = np.array([t0 + (k // gpus) + 0.001 * (k % gpus) for k in order])
        vals = rng.normal(size=(len(NAMES), len(ts)))
        vals[rng.random(vals.shape) < 0.3] = np.nan
        vals[NAMES.index("power_w")] = np.nan  # a field with no sample at all
        return RowSource(cluster="c", node=node, ts=ts, gpu=gpu, job=[jobs[k % gpus] for k in order], vals=vals,
                         gpu_index={f"GPU-{node}-{g}": g for g in range(gpus)}, job_user={"ja": "u1", "jb": None})

    for t0 in (1_790_000_000.0, 1.5, -3.25, 5e9):
        srcs = [src("n1", 4, 7, t0, ["ja"] * 4), src("n2", 3, 5, t0, ["ja", "jb", None]), src("n3", 1, 1, t0, [None])]
        for fields in (None, ["power_w", "sm_active", "fb_used_bytes"], ["power_w"]):
            c, ref = Encoder(fields), Encoder(fields, native=False)
            assert c.native and not ref.native
            for some in (srcs, srcs[1:2], srcs[2:]):
                assert c.encode(some) == ref.encode(some), (t0, fields, len(some))
    with pytest.raises(IndexError):  # the C pass checks what it indexes
        _NATIVE.encode(np.zeros((2, 3)), 3, np.array([0, 2]), np.zeros(1, np.int64), np.array([0, 1]),
                       np.zeros(1, np.int64), [[b"", b""]])
    with pytest.raises(IndexError):
        _NATIVE.encode(np.zeros((2, 3)), 3, np.array([0, 1]), np.array([3]), np.array([0, 1]),
                       np.zeros(1, np.int64), [[b"", b""]])


def test_queue_is_bounded_drops_oldest_counts_and_survives_a_restart(tmp_path: Path) -> None:
    q = Spool(tmp_path, max_bytes=1000)
    for i in range(5):
        q.put(bytes([i]) * 300, samples=10 + i)
    assert q.depth == (3, 900, 12 + 13 + 14) and q.dropped_samples == 10 + 11
    second = Spool(tmp_path, max_bytes=1000)  # another process: its own directory
    assert second.dir != q.dir and second.depth == (0, 0, 0)
    second.close()
    q.close()
    again = Spool(tmp_path, max_bytes=1000)  # the restarted first process adopts its queue
    assert again.dir == q.dir and again.depth == (3, 900, 39)
    item = again.oldest(0)
    assert item is not None and item.path.read_bytes() == bytes([2]) * 300
    again.done(item)
    assert again.depth[0] == 2
    again.put(b"x", 1)
    assert again.oldest(0).path.read_bytes() == bytes([3]) * 300  # order kept across the restart
    again.close()


def _metrics(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name.startswith("gpufleet_export"):
                key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
                out[key] = s.value
    return out


def _wait(cond, timeout: float = 120.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _count(prom, promql: str) -> float:  # type: ignore[no-untyped-def]
    res = prom.query(promql)
    return float(res[0]["value"][1]) if res else 0.0



def test_bodies_at_the_queues_head_are_held_until_sent_or_failed_and_kept_at_a_clean_stop(tmp_path: Path) -> None:
    """The exporter's hand-off (hold=True): the sender is about to post them, so bodies it
    posts at once are never written (at most hold_max held, and never behind a written one);
    when a post fails they are written to their places before the bodies behind them, and
    those still unsent at close are written, so a restarted process sends them in order."""
    q = Spool(tmp_path, max_bytes=10_000, hold_max=2)
    for k in range(4):
        q.put(bytes([65 + k]) * 100, k + 1, hold=True)
    assert q.depth == (4, 400, 10) and len(list(q.dir.glob("*.rw"))) == 2  # two held, two written
    first = q.oldest(0)
    assert first is not None and not first.path.exists() and q.body(first) == b"A" * 100
    q.done(first)  # sent: nothing to delete
    q.put(b"E" * 100, 5, hold=True)  # behind written bodies: written
    assert len(list(q.dir.glob("*.rw"))) == 3
    for want in b"BCDE":
        item = q.oldest(0)
        assert item is not None and q.body(item) == bytes([want]) * 100
        q.done(item)
    assert q.depth == (0, 0, 0) and not list(q.dir.glob("*.rw"))
    q.put(b"F" * 100, 6, hold=True)
    q.put(b"G" * 100, 7, hold=True)
    q.persist()  # a post failed: both on disk, in order, before what comes next
    q.put(b"H" * 100, 8, hold=True)
    assert sorted(p.read_bytes()[:1] for p in q.dir.glob("*.rw")) == [b"F", b"G", b"H"]
    item = q.oldest(0)
    assert item is not None and q.body(item) == b"F" * 100
    q.done(item)
    q.close()
    again = Spool(tmp_path, max_bytes=10_000)
    assert again.depth == (2, 200, 15)
    for want in b"GH":
        item = again.oldest(0)
        assert item is not None and again.body(item) == bytes([want]) * 100
        again.done(item)
    again.put(b"I" * 100, 9, hold=True)
    again.close()  # a clean stop with a held body unsent: written, sent after a restart
    third = Spool(tmp_path, max_bytes=10_000)
    item = third.oldest(0)
    assert third.depth == (1, 100, 9) and item is not None and third.body(item) == b"I" * 100
    third.close()
    full = Spool(tmp_path / "full", max_bytes=150)
    full.put(b"f" * 100, 6, hold=True)
    full.put(b"g" * 100, 7, hold=True)  # the bound drops the held head: counted, no file for it
    assert full.depth == (1, 100, 7) and full.dropped_samples == 6 and not list(full.dir.glob("*.rw"))
    full.close()

@pytest.mark.slow
def test_export_to_victoria_metrics_through_an_outage_and_a_collector_restart(database_url, live_server, tmp_path,
                                                                               monkeypatch) -> None:
    vm_dir = tmp_path / "vmdata"
    vm = start_victoria_metrics(vm_dir)
    monkeypatch.setenv("GPUFLEET_EXPORT_URL", vm.url + "/api/v1/write")
    monkeypatch.setenv("GPUFLEET_EXPORT_QUEUE_DIR", str(tmp_path / "queue"))
    monkeypatch.setenv("GPUFLEET_EXPORT_FIELDS", "power_w,sm_active,tensor_active")
    monkeypatch.setenv("GPUFLEET_EXPORT_MIN_BACKOFF_S", "0.1")
    monkeypatch.setenv("GPUFLEET_EXPORT_MAX_BACKOFF_S", "0.5")
    srv = live_server(database_url)
    start = time.time() - 600
    b1 = make_batch("node-1", gpus=4, seconds=10, start=start, job="job-1", user="alice")
    assert post(srv.url, b1).status_code == 200
    _wait(lambda: _count(vm, "sum(count_over_time(gpufleet_power_w[1h]))") == 40, what="first rows in VM")
    res = vm.query(f'gpufleet_power_w{{uuid="{gpu_uuid("node-1", 2)}"}}[1h]')
    (series,) = res
    assert series["metric"] == {"__name__": "gpufleet_power_w", "cluster": "default", "node": "node-1", "gpu": "2",
                                "uuid": gpu_uuid("node-1", 2), "job": "job-1", "user": "alice"}
    sent = [float(v) for _, v in series["values"]]
    col = b1.samples["power_w"]
    want = [col[i] for i, g in enumerate(b1.samples["gpu"]) if g == gpu_uuid("node-1", 2)]
    assert sent == pytest.approx(want)
    assert _count(vm, "count(count_over_time(gpufleet_sm_clock_mhz[1h]))") == 0  # not in GPUFLEET_EXPORT_FIELDS

    vm.stop()  # the receiver is down: ingest carries on, the queue holds the rows
    b2 = make_batch("node-2", gpus=4, seconds=10, start=start + 10, job="job-2", seq=0)
    assert post(srv.url, b2).status_code == 200  # the outage never reaches the ingest path: stored, answered
    _wait(lambda: _metrics(srv.url).get("gpufleet_export_send_failures_total", 0) > 0, what="failed sends")
    m = _metrics(srv.url)
    assert m["gpufleet_export_queue_samples"] == 3 * 40 and m["gpufleet_export_lag_seconds"] > 0
    srv.stop()  # and the collector restarts meanwhile: the queue is on disk, the new process adopts it
    from gpufleet.server import serving_app
    from tests.conftest import LiveServer, free_port, make_settings

    srv = LiveServer(serving_app(make_settings(database_url, allow_anonymous=True)), free_port()).start()
    assert _metrics(srv.url)["gpufleet_export_queue_samples"] == 3 * 40
    vm = start_victoria_metrics(vm_dir, port=int(vm.url.rsplit(":", 1)[1]))  # same data, same port
    try:
        _wait(lambda: _metrics(srv.url)["gpufleet_export_queue_bodies"] == 0, what="the queue to drain")
        _wait(lambda: _count(vm, "sum(count_over_time(gpufleet_power_w[1h]))") == 80, what="all rows in VM")
        time.sleep(1.5)  # anything sent twice would show up by now
        assert _count(vm, "sum(count_over_time({__name__=~\"gpufleet_.*\"}[1h]))") == 3 * 80  # nothing doubled
        assert _count(vm, 'count(count_over_time(gpufleet_tensor_active{node="node-2", job="job-2"}[1h]))') == 4
        m = _metrics(srv.url)
        assert m["gpufleet_export_samples_sent_total"] == 3 * 40  # this process sent what the last one queued
        assert not any(k.startswith("gpufleet_export_dropped") and v for k, v in m.items())
    finally:
        vm.stop()
        srv.stop()


def test_export_to_prometheus_remote_write_receiver(sqlite_url, live_server, tmp_path, monkeypatch) -> None:
    prom = start_prometheus(tmp_path, "global: {scrape_interval: 1m}\n", "--web.enable-remote-write-receiver")
    monkeypatch.setenv("GPUFLEET_EXPORT_URL", prom.url + "/api/v1/write")
    monkeypatch.setenv("GPUFLEET_EXPORT_QUEUE_DIR", str(tmp_path / "queue"))
    monkeypatch.setenv("GPUFLEET_EXPORT_LABELS", "cluster,node,uuid,job")
    try:
        srv = live_server(sqlite_url)
        b = make_batch("node-p", gpus=2, seconds=5, start=time.time() - 30, job="job-p")
        assert post(srv.url, b).status_code == 200
        _wait(lambda: _count(prom, "count(gpufleet_sm_active)") == 2, what="series in Prometheus")
        assert _count(prom, "sum(count_over_time(gpufleet_power_w[5m]))") == 10
        (s,) = prom.query(f'gpufleet_power_w{{uuid="{gpu_uuid("node-p", 0)}"}}')
        assert set(s["metric"]) == {"__name__", "cluster", "node", "uuid", "job"}  # gpu and user left out
    finally:
        prom.stop()


def _answering(status: int, text: bytes = b"") -> tuple[ThreadingHTTPServer, list[int]]:
    """A remote-write receiver that answers every POST with ``status``; the list counts them."""
    hits: list[int] = []

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            hits.append(1)
            self.send_response(status)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *a: object) -> None:
            pass

    rx = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=rx.serve_forever, daemon=True).start()
    return rx, hits


def test_a_receiver_refusing_for_good_is_counted_not_retried_forever(sqlite_url, live_server, tmp_path,
                                                                     monkeypatch) -> None:
    rx, hits = _answering(400, b"out of bounds")
    monkeypatch.setenv("GPUFLEET_EXPORT_URL", f"http://127.0.0.1:{rx.server_address[1]}/api/v1/write")
    monkeypatch.setenv("GPUFLEET_EXPORT_QUEUE_DIR", str(tmp_path / "queue"))
    monkeypatch.setenv("GPUFLEET_EXPORT_FIELDS", "power_w")
    try:
        srv = live_server(sqlite_url)
        assert post(srv.url, make_batch("node-r", gpus=2, seconds=3, start=time.time() - 30)).status_code == 200
        _wait(lambda: _metrics(srv.url).get("gpufleet_export_dropped_samples_total{reason=rejected}") == 6,
              what="the refusal counted")
        time.sleep(1)
        assert len(hits) == 1 and _metrics(srv.url)["gpufleet_export_queue_bodies"] == 0
    finally:
        rx.shutdown()
        rx.server_close()


def test_a_receiver_that_keeps_failing_fills_the_queue_drops_counted_ingest_acknowledged(sqlite_url, live_server,
                                                                                         tmp_path, monkeypatch) -> None:
    """Never slowing ingest: while the receiver answers 503 (retryable) the bodies wait in the
    bounded queue; once it is full the oldest are dropped and counted, every sample is either
    queued or counted, and every ingest request is still acknowledged."""
    rx, hits = _answering(503)
    for k, v in {"URL": f"http://127.0.0.1:{rx.server_address[1]}/api/v1/write", "QUEUE_DIR": str(tmp_path / "q"),
                 "FIELDS": "power_w", "QUEUE_BYTES": "1000", "FLUSH_S": "0.05", "MIN_BACKOFF_S": "0.05",
                 "MAX_BACKOFF_S": "0.2"}.items():
        monkeypatch.setenv(f"GPUFLEET_EXPORT_{k}", v)
    try:
        srv = live_server(sqlite_url)
        start = time.time() - 600

        def accounted() -> float:
            m = _metrics(srv.url)
            return m.get("gpufleet_export_dropped_samples_total{reason=queue_full}", 0) + m[
                "gpufleet_export_queue_samples"]

        for phase in range(2):  # two phases: at least two bodies, so the bound must drop one
            for i in range(10):  # each 200 means stored (the ingest ack), whatever the export is doing
                b = make_batch(f"node-{phase}-{i}", gpus=2, seconds=3, start=start)
                assert post(srv.url, b).status_code == 200
            _wait(lambda n=60 * (phase + 1): accounted() == n, what="every sample queued or counted as dropped")
        m = _metrics(srv.url)
        assert m["gpufleet_export_dropped_samples_total{reason=queue_full}"] > 0
        assert m["gpufleet_export_queue_max_bytes"] == 1000 and m["gpufleet_export_queue_bodies"] >= 1
        assert m["gpufleet_export_queue_bytes"] <= 1000 or m["gpufleet_export_queue_bodies"] == 1  # bar the newest
        assert m["gpufleet_export_samples_sent_total"] == 0
        _wait(lambda: _metrics(srv.url)["gpufleet_export_send_failures_total"] >= 2, what="retries")
        assert len(hits) >= 2  # the oldest queued body is retried, not given up
    finally:
        rx.shutdown()
        rx.server_close()


def test_rows_already_stored_are_not_exported_again(sqlite_url, live_server, tmp_path, monkeypatch) -> None:
    """A replay under another batch key (or a re-sent remote-write body) stores nothing new, so
    it exports nothing: the receiver got those rows when they were first stored. A batch that
    is half copies exports its new half only."""
    rx, _hits = _answering(204)
    monkeypatch.setenv("GPUFLEET_EXPORT_URL", f"http://127.0.0.1:{rx.server_address[1]}/api/v1/write")
    monkeypatch.setenv("GPUFLEET_EXPORT_QUEUE_DIR", str(tmp_path / "queue"))
    monkeypatch.setenv("GPUFLEET_EXPORT_FIELDS", "power_w")
    try:
        srv = live_server(sqlite_url)
        start = time.time() - 60
        first = make_batch("node-x", gpus=2, seconds=5, start=start, boot_id="boot-a")
        assert post(srv.url, first).status_code == 200
        _wait(lambda: _metrics(srv.url).get("gpufleet_export_samples_sent_total", 0) == 10, what="first rows sent")
        replay = make_batch("node-x", gpus=2, seconds=5, start=start, boot_id="boot-b")  # same rows, new key
        assert post(srv.url, replay).json() == {"stored": 0, "duplicate": False}
        half = make_batch("node-x", gpus=2, seconds=10, start=start, boot_id="boot-c")  # 5 s stored, 5 s new
        assert post(srv.url, half).json()["stored"] == 10
        _wait(lambda: _metrics(srv.url).get("gpufleet_export_samples_sent_total", 0) >= 20, what="new half sent")
        time.sleep(1.5)  # a re-export of the copies would have been sent by now
        m = _metrics(srv.url)
        assert m["gpufleet_export_samples_sent_total"] == 20 and m["gpufleet_export_queue_samples"] == 0
    finally:
        rx.shutdown()

"""NCCL Inspector's Prometheus mode through remote write (collector/remote_write/mapping.py,
gpufleet/nccl_fold.py): the three series of a label set are one record, a snapshot scraped again
and again counts each ``coll_sn`` once, records become the job's collectives in the API, a
retried request stores nothing twice; and end to end with a real Prometheus scraping an endpoint
that serves the Inspector's textfile as it is rewritten dump after dump."""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import text

from gpufleet.collector.remote_write import wire
from gpufleet.collector.remote_write.mapping import RateState, SeriesMap, SnapshotState, convert
from gpufleet.storage import tokens
from gpufleet.storage.db import make_engine
from tests.conftest import LiveServer, make_settings
from tests.nccl.fabric_model import Fabric, TrainingJob, prom_text
from tests.prometheus.captures import body, exposition_series
from tests.prometheus.procs import FakeExporter, settled, start_prometheus
from tests.prometheus.rwclient import post

NODE = "gpu-00"
JOB = "4242"


def _snapshots(job: TrainingJob, dumps: int) -> list[list[dict]]:
    """What the Inspector's textfile on NODE holds after each of its first ``dumps`` dumps: the
    newest record of every (communicator, rank)."""
    latest: dict[tuple[str, int], dict] = {}
    out: list[list[dict]] = []
    last_dump = None
    for rank, rec in job.records():
        if job.node_of(rank) != NODE:
            continue
        dump = rec["metadata"]["dump_timestamp_us"]
        if last_dump is not None and dump != last_dump:
            out.append(list(latest.values()))
            if len(out) == dumps:
                break
        last_dump = dump
        latest[(rec["header"]["id"], rec["header"]["rank"])] = rec
    return out


def _job() -> TrainingJob:
    return TrainingJob(JOB, Fabric(nodes=[NODE, "gpu-01"]), time.time() - 600, 120.0)


def _textfile(recs: list[dict]) -> str:
    return prom_text(recs, JOB, {r: r for r in range(8)})  # communicator rank r runs on GPU r of the node


def _dcgm(g: int) -> dict[str, str]:
    return {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": f"GPU-{NODE}-{g}", "gpu": str(g), "Hostname": NODE}


def _scrapes(snaps: list[list[dict]], t0: int, per_snapshot: int = 2, dcgm: bool = True) -> bytes:
    """A remote-write body: each snapshot scraped ``per_snapshot`` times 1 s apart (target labels
    as node-exporter's textfile collector gets them), with the node's DCGM series beside."""
    series: list[tuple[dict[str, str], list[tuple[int, float]]]] = []
    t = t0
    for recs in snaps:
        for _ in range(per_snapshot):
            for lab, v, _kind in exposition_series(_textfile(recs), instance=f"{NODE}:9100", job="node"):
                series.append((lab, [(t, v)]))
            if dcgm:
                series.extend((_dcgm(g), [(t, 50.0)]) for g in range(8))
            t += 1000
    return body(series)


def _distinct(snaps: list[list[dict]]) -> set[tuple[str, int, int]]:
    return {(r["header"]["id"], r["header"]["rank"], r["coll_perf"]["coll_sn"]) for recs in snaps for r in recs}


def _conv(raw: bytes, snapshots: SnapshotState, now: float):
    return convert(wire.decode(raw), SeriesMap(), RateState(), cluster="c1", digest="d", now=now,
                   max_age_s=86400.0, max_future_s=300.0, max_rows=20_000, snapshots=snapshots)


def test_snapshots_fold_into_collectives_each_coll_sn_once_with_job_and_gpu() -> None:
    job = _job()
    snaps = _snapshots(job, 4)
    now = time.time()
    t0 = int(now * 1000) - 60_000
    state = SnapshotState()
    conv = _conv(_scrapes(snaps[:3], t0), state, now)
    (b,) = conv.batches
    want = _distinct(snaps[:3])
    assert conv.nccl_records == len(want) and sum(c.count for c in b.collectives) == len(want)
    label_sets = sum(len(recs) for recs in snaps[:3]) * 2
    assert conv.dropped["nccl_snapshot_already_counted"] == label_sets - len(want)
    assert {c.job_id for c in b.collectives} == {JOB} and [j.job_id for j in b.jobs] == [JOB]
    assert b.jobs[0].source == "slurm"
    for c in b.collectives:  # the GPU from gpu_device_id="GPU<r>" and the DCGM series' index -> UUID
        assert c.gpu_uuid == f"GPU-{NODE}-{c.rank}"
        assert c.window_s == 10.0 and c.ts % 10 == 0
    # one scrape of one snapshot: one record per (communicator, rank), its values as the aggregate's
    (one,) = _conv(_scrapes(snaps[:1], t0, per_snapshot=1), SnapshotState(), now).batches
    recs = {(r["header"]["id"], r["header"]["rank"]): r["coll_perf"] for r in snaps[0]}
    assert sorted((c.comm, c.rank) for c in one.collectives) == sorted(recs)
    assert {c.count for c in one.collectives} == {1}
    for c in one.collectives:
        perf = recs[(c.comm, c.rank)]
        assert (c.exec_us_p50, c.coll) == (perf["coll_exec_time_us"], perf["coll"])
        assert c.busbw_gbs_p50 == pytest.approx(perf["coll_busbw_gbs"])
    # a retry (nothing committed: the first attempt got a 503) folds exactly the same
    again = _conv(_scrapes(snaps[:3], t0), state, now)
    assert again.batches[0].collectives == b.collectives
    state.commit(conv.snapshot_updates, conv.gpu_updates)
    # the next request scrapes the last snapshot again (nothing new) and then the next dump; its
    # body has no DCGM series, the GPUs are still named from the earlier request
    nxt = _conv(_scrapes(snaps[2:4], t0 + 10_000, dcgm=False), state, now)
    (b2,) = nxt.batches
    assert sum(c.count for c in b2.collectives) == len(_distinct(snaps[:4]) - want) > 0
    assert {c.gpu_uuid for c in b2.collectives} <= {g.uuid for g in b2.gpus}
    assert all(c.gpu_uuid == f"GPU-{NODE}-{c.rank}" for c in b2.collectives)


def test_records_without_coll_sn_count_each_change_once_and_incomplete_ones_are_counted() -> None:
    lab = ('version="v5.1",slurm_job_id="77",node="n9",gpu="GPU3",comm_name="c1",n_nodes="4",nranks="32",'
           'collective="ReduceScatter",message_size="134-135MB",algo_proto="RING_SIMPLE"')

    def snapshot(exec_us: float, bw: float) -> str:
        return (f"nccl_bus_bandwidth_gbs{{{lab}}} {bw}\nnccl_collective_exec_time_microseconds{{{lab}}} {exec_us}\n"
                f'nccl_bus_bandwidth_gbs{{{lab.replace("c1", "c2")}}} 3.0\n')  # c2: no exec time, not a record
    now = time.time()
    t0 = int(now * 1000) - 60_000
    series = []
    for k, (ex, bw) in enumerate([(100.0, 40.0), (100.0, 40.0), (200.0, 20.0)]):
        series += [(lab, [(t0 + 1000 * k, v)]) for lab, v, _ in exposition_series(snapshot(ex, bw), instance="x:9100")]
    conv = _conv(body(series), SnapshotState(), now)
    (b,) = conv.batches
    assert b.agent.node == "n9" and sum(c.count for c in b.collectives) == 2  # 100/40 once, 200/20 once
    assert {c.rank for c in b.collectives} == {3} and {c.job_id for c in b.collectives} == {"77"}
    assert conv.dropped["nccl_not_a_record"] == 3 and conv.dropped["nccl_snapshot_already_counted"] == 1
    assert b.samples == {} and b.collectives[0].gpu_uuid is None  # no DCGM series named GPU 3: unknown


def _api_collectives(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(f"{url}/api/v1/jobs/{JOB}/collectives", params={"cluster": "default"}, headers=headers,
                  timeout=30)
    assert r.status_code == 200, r.text
    return sum(s["count"] for s in r.json()["series"])


def _stored_collectives(engine) -> int:
    with engine.connect() as c:
        return int(c.execute(text("select coalesce(sum(count), 0) from collective_windows")).scalar())


def test_stored_through_http_and_a_retry_stores_nothing_twice(database_url, live_server) -> None:
    srv = live_server(database_url)
    e = make_engine(database_url)
    snaps = _snapshots(_job(), 4)
    t0 = int(time.time() * 1000) - 60_000
    raw = _scrapes(snaps[:3], t0)
    r = post(srv.url, raw)
    assert r.status_code == 200, r.text
    want = len(_distinct(snaps[:3]))
    assert r.json()["nccl_records"] == want and _stored_collectives(e) == want
    assert r.json()["collectives_stored"] == r.json()["collectives"] > 0
    assert _api_collectives(srv.url) == want
    again = post(srv.url, raw)  # Prometheus' retry after a lost answer: the very same bytes
    assert again.status_code == 200 and again.json()["duplicate_batches"] == 1
    assert again.json()["collectives_stored"] == 0
    # the same snapshots scraped again later (new timestamps, new bytes): nothing new to count
    later = post(srv.url, _scrapes(snaps[2:3], t0 + 20_000))
    assert later.status_code == 200 and later.json()["nccl_records"] == 0
    assert _stored_collectives(e) == want and _api_collectives(srv.url) == want
    metrics = httpx.get(srv.url + "/metrics", timeout=30).text
    assert f"gpufleet_remote_write_collectives_total {float(r.json()['collectives'])}" in metrics
    with e.connect() as c:
        gpus = {u for (u,) in c.execute(text(
            "select g.uuid from collective_windows w join gpus g on g.id = w.gpu_pk"))}
        jobs = {(j, s) for j, s in c.execute(text(
            "select j.job_id, j.source from collective_windows w join jobs j on j.id = w.job_pk"))}
    assert gpus == {f"GPU-{NODE}-{g}" for g in range(8)} and jobs == {(JOB, "slurm")}
    e.dispose()


def _inspector_page(snaps: list[list[dict]]):  # type: ignore[no-untyped-def]
    """node-exporter's textfile collector on NODE: the Inspector's textfile as the dump thread
    rewrites it (the next dump every other scrape), and the node's dcgm-exporter series."""
    dcgm = "".join(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{NODE}-{g}",Hostname="{NODE}"}} 50\n'
                   for g in range(8))
    return lambda k: _textfile(snaps[min(k // 2, len(snaps) - 1)]) + dcgm


@pytest.mark.slow
def test_real_prometheus_forwards_inspector_series_stored_once_per_collective(database_url, tmp_path) -> None:
    e = make_engine(database_url)
    token = tokens.create_token(e, "prometheus", "agent", cluster="default")
    from gpufleet.server import serving_app

    srv = LiveServer(serving_app(make_settings(database_url, allow_anonymous=False))).start()
    snaps = _snapshots(_job(), 8)
    ep = FakeExporter("", page=_inspector_page(snaps))
    prom = start_prometheus(tmp_path, f"""
global: {{scrape_interval: 1s, scrape_timeout: 900ms}}
scrape_configs:
  - job_name: node
    static_configs: [{{targets: ['127.0.0.1:{ep.port}']}}]
remote_write:
  - url: {srv.url}/api/v1/write
    authorization: {{credentials: {token}}}
    write_relabel_configs:
      - {{source_labels: [__name__], regex: 'DCGM_.*|nccl_.*', action: keep}}
    queue_config: {{batch_send_deadline: 200ms, min_backoff: 50ms, max_backoff: 500ms,
                    min_shards: 1, max_shards: 1, max_samples_per_send: 100, capacity: 500}}
""")
    try:
        deadline = time.time() + 60
        while ep.scrapes < 2 * len(snaps) + 2 and time.time() < deadline:
            time.sleep(0.2)
        ep.stop()
        # what Prometheus holds: every (communicator, rank, coll_sn) it scraped at least once, once
        # its TSDB stops changing (the last scrapes fail: no new samples from there)
        held = settled(lambda: {
            (s["metric"]["comm_id"], int(s["metric"]["rank"]), int(s["metric"]["coll_sn"]))
            for s in prom.query("count_over_time(nccl_collective_exec_time_microseconds[10m])")}, quiet_s=2.0)
        assert held and held <= _distinct(snaps)
        got = 0
        deadline = time.time() + 20
        while time.time() < deadline:
            got = _stored_collectives(e)
            if got >= len(held):
                break
            time.sleep(0.3)
        time.sleep(1.0)  # anything still in flight would show as doubled
        assert _stored_collectives(e) == len(held), "each collective Prometheus scraped, stored once"
        assert _api_collectives(srv.url, tokens.create_token(e, "dashboard", "viewer")) == len(held)
        with e.connect() as c:
            unattributed = c.execute(text("select count(*) from collective_windows where job_pk is null")).scalar()
        assert unattributed == 0
    finally:
        prom.stop()
        srv.stop()
        ep.stop()
        e.dispose()

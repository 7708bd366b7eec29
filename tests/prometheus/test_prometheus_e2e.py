"""End to end with a real Prometheus (Debian's 2.42): it scrapes three fake dcgm-exporters
serving the real captures (values and timestamps moving) and remote-writes to a live gpufleet,
which is restarted mid-stream. Prometheus' WAL-backed queue retries; afterwards every
(GPU, timestamp) Prometheus holds is stored exactly once, with every field's value, attributed
to its pod, Slurm job or relabelled job, and analysed.

Prometheus sends through four shards with small requests: a series goes to the shard its hash
picks, so one GPU's fields at one timestamp arrive in several requests (docs/prometheus.md,
"Sharding"), and each field must still be stored."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from sqlalchemy import text

from gpufleet import dcgm
from gpufleet.storage import tokens
from gpufleet.storage.db import make_engine
from tests.conftest import LiveServer, free_port, make_settings
from tests.prometheus.captures import capture_text
from tests.prometheus.procs import FakeExporter, settled, start_prometheus
from tests.prometheus.rwclient import stored, stored_values

pytestmark = pytest.mark.slow
SLURM_GPU = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"


def _hpc_job(labels: str) -> str:
    # dcgm-exporter's --hpc-job-mapping-dir adds hpc_job to the GPUs a Slurm job holds
    return labels.replace("{", '{hpc_job="4242",', 1) if SLURM_GPU in labels else labels


def _config(targets: list[int], relabelled: int, url: str, token: str) -> str:
    t = ", ".join(f"'127.0.0.1:{p}'" for p in targets)
    return f"""
global: {{scrape_interval: 1s, scrape_timeout: 900ms}}
scrape_configs:
  - job_name: dcgm
    static_configs: [{{targets: [{t}]}}]
  - job_name: dcgm-relabelled
    static_configs: [{{targets: ['127.0.0.1:{relabelled}']}}]
    metric_relabel_configs:
      - {{target_label: gpufleet_job, replacement: train-llm}}
      - {{target_label: gpufleet_node, replacement: gpu-n3}}
remote_write:
  - url: {url}/api/v1/write
    authorization: {{credentials: {token}}}
    write_relabel_configs:
      - {{source_labels: [__name__], regex: 'DCGM_.*', action: keep}}
    queue_config: {{batch_send_deadline: 200ms, min_backoff: 50ms, max_backoff: 500ms,
                    min_shards: 4, max_shards: 4, max_samples_per_send: 200, capacity: 1000}}
    metadata_config: {{send: true, send_interval: 2s}}
"""


# Fields stored as the series' value times dcgm_scale (counters become rates, so not these).
GAUGE_ROLLUPS = ("mean", "max")


def _expected(prom) -> tuple[set[tuple[str, float]], dict[str, dict[tuple[str, float], float]]]:
    """(GPU, ts) pairs of every GPU series Prometheus stored, and each gauge field's readings
    (catalog units), from its TSDB."""
    rows: set[tuple[str, float]] = set()
    gauges: dict[str, dict[tuple[str, float], float]] = {}
    for s in prom.query('{__name__=~"DCGM_.*"}[10m]'):
        m = s["metric"]
        f = dcgm.field_for(m["__name__"])
        ident = dcgm.gpu_identity(m)
        if f is None or ident is None:
            continue
        for ts, v in s["values"]:
            if v == "NaN":
                continue
            rows.add((ident.uuid, float(ts)))
            if f.rollup in GAUGE_ROLLUPS:
                gauges.setdefault(f.name, {})[(ident.uuid, float(ts))] = float(v) * f.dcgm_scale
    return rows, gauges


def _own_metrics(prom) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(prom.url + "/metrics", timeout=10).text):
        for smp in fam.samples:
            out[smp.name] = out.get(smp.name, 0.0) + smp.value
    return out


def test_prometheus_remote_write_through_a_restart_loses_and_doubles_nothing(database_url, tmp_path) -> None:
    e = make_engine(database_url)
    token = tokens.create_token(e, "prometheus", "agent", cluster="lab")
    settings = make_settings(database_url, allow_anonymous=False)
    port = free_port()

    def serve() -> LiveServer:
        from gpufleet.server import serving_app

        return LiveServer(serving_app(settings), port).start()

    exporters = [FakeExporter(capture_text("datadog-integrations-metrics.txt"), _hpc_job),
                 FakeExporter(capture_text("h100-k8s-issue490.txt")),
                 FakeExporter(capture_text("readme-k8s-example.txt"))]
    srv = serve()
    prom = start_prometheus(tmp_path, _config([x.port for x in exporters[:2]], exporters[2].port, srv.url, token))
    try:
        deadline = time.time() + 60  # a bound for a loaded machine; the loop leaves at the first 20 rows
        while len(stored(e)) < 20 and time.time() < deadline:
            time.sleep(0.2)
        before = stored(e)
        assert before, f"nothing arrived: {prom.log.read_text()[-2000:]}"
        srv.stop()  # gpufleet restarts; Prometheus keeps scraping into its WAL and retries
        time.sleep(3)
        srv = serve()
        time.sleep(4)
        for x in exporters:
            x.stop()
        # the last scrapes fail: once its TSDB stops changing Prometheus holds no new GPU samples
        expected, gauges = settled(lambda: _expected(prom), quiet_s=2.0)
        got: Counter[tuple[str, float]] = Counter()
        deadline = time.time() + 60  # Prometheus' retry backoff after the restart, on a loaded machine
        while time.time() < deadline:
            got = stored(e)
            if set(got) >= expected:
                break
            time.sleep(0.3)
        missing = expected - set(got)
        assert not missing, f"{len(missing)} of {len(expected)} rows never arrived: {sorted(missing)[:5]}"
        assert set(got) == expected, "stored rows Prometheus does not have"
        doubled = {k: n for k, n in got.items() if n > 1}
        assert not doubled, f"rows stored twice: {list(doubled.items())[:5]}"
        # the restart really happened while samples were flowing: rows from both sides of it
        assert len(before) < len(expected) and max(t for _, t in before) < max(t for _, t in expected)
        assert "power_w" in gauges and len(gauges) >= 5, sorted(gauges)
        with e.connect() as c:  # the premise: the shards did split rows (supplement blocks: n = 0)
            assert c.execute(text("select count(*) from gpu_sample_blocks where n = 0")).scalar_one() > 0
        for name, want in gauges.items():  # every field of every row, whichever request brought it
            have = {k: v for k, v in stored_values(e, name).items() if v is not None}
            assert have == pytest.approx(want), f"{name}: {len(set(want) - set(have))} readings missing"
        own = _own_metrics(prom)
        assert own["prometheus_remote_storage_samples_failed_total"] == 0  # no 4xx: nothing dropped
        assert own["prometheus_remote_storage_samples_retried_total"] > 0  # the restart was retried through
    finally:
        prom.stop()
        srv.stop()
        for x in exporters:
            x.stop()

    with e.connect() as c:
        jobs = {r.job_id: r for r in c.execute(text(
            "select j.job_id, j.source, j.namespace, c.name as cluster from jobs j"
            " join clusters c on c.id = j.cluster_id"))}
        nodes = {n for (n,) in c.execute(text("select name from nodes"))}
    assert set(jobs) == {"4242", "default/dcgmproftester2", "ray-llm/ray-1111111", "train-llm"}
    assert jobs["4242"].source == "slurm" and jobs["default/dcgmproftester2"].source == "kubernetes"
    assert {j.cluster for j in jobs.values()} == {"lab"}
    assert {"424773df46e0", "computeinstance-e00c1p6dpy98xytphp", "gpu-n3"} <= nodes

    from gpufleet.analysis.runner import run_analysis

    summary = run_analysis(e)
    assert not summary.errors, summary.errors
    with e.connect() as c:
        reported = {j for (j,) in c.execute(text(
            "select j.job_id from job_reports r join jobs j on j.id = r.job_pk"))}
    assert reported == set(jobs)
    e.dispose()

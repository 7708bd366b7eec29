"""End to end: Debian's real Prometheus scrapes the serving simulator (agent/sim_serving.py, vLLM's
format) over HTTP and remote-writes, through two shards, to a live gpufleet (token, SQLite and
PostgreSQL); the replica-minutes gpufleet stores hold exactly the requests the simulated engine
finished between the first and the last page Prometheus kept, counted request by request from
the simulator's ground truth."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.sim_serving import EngineModel, Workload, simulate
from gpufleet.server import serving_app
from gpufleet.storage import tokens
from gpufleet.storage.db import make_engine
from gpufleet.storage.serving import read_minutes
from tests.conftest import LiveServer, make_settings
from tests.prometheus.procs import FakeExporter, settled, start_prometheus

pytestmark = pytest.mark.slow


def _config(exporter: int, url: str, token: str) -> str:
    return f"""
global: {{scrape_interval: 1s, scrape_timeout: 900ms}}
scrape_configs:
  - job_name: vllm
    static_configs: [{{targets: ['127.0.0.1:{exporter}'], labels: {{namespace: ml, pod: chat-7d9f8b6c5-x2x9q}}}}]
    relabel_configs:  # what a pod's annotation gpufleet.io/deployment gives under Kubernetes discovery
      - {{target_label: gpufleet_deployment, replacement: chat}}
remote_write:
  - url: {url}/api/v1/write
    authorization: {{credentials: {token}}}
    queue_config: {{batch_send_deadline: 200ms, min_backoff: 50ms, max_backoff: 500ms,
                    min_shards: 2, max_shards: 2, max_samples_per_send: 100}}
"""


def _pending(prom) -> float:
    """Prometheus's own count of samples waiting to be remote-written."""
    text = httpx.get(prom.url + "/metrics", timeout=10).text
    return sum(smp.value for fam in text_string_to_metric_families(text) for smp in fam.samples
               if smp.name == "prometheus_remote_storage_samples_pending")


def _sent_all(prom) -> bool:
    if _pending(prom):
        return False
    time.sleep(3)
    return _pending(prom) == 0


def test_prometheus_scrapes_the_simulator_and_gpufleet_stores_its_requests(database_url, tmp_path: Path) -> None:
    res = simulate(EngineModel(), Workload(rate_rps=6, duration_s=60, seed=11), engine="vllm", scrape_s=1.0,
                   drain=False)
    # each page says which one it is: the truth is taken between the pages Prometheus kept
    pages = [p + f'sim_page_index{{source="test"}} {k}\n' for k, (_, p) in enumerate(res.pages)]
    exporter = FakeExporter("", page=lambda k: pages[min(k, len(pages) - 1)])
    e = make_engine(database_url)
    token = tokens.create_token(e, "prometheus", "agent", cluster="lab")
    srv = LiveServer(serving_app(make_settings(database_url, allow_anonymous=False))).start()
    prom = start_prometheus(tmp_path, _config(exporter.port, srv.url, token))
    try:
        deadline = time.monotonic() + 180  # a bound for a loaded machine; leaves at the 15th scrape
        while exporter.scrapes < 15 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert exporter.scrapes >= 15, f"Prometheus did not scrape: {prom.log.read_text()[-2000:]}"
        exporter.stop()  # the engine goes away: staleness markers, then nothing more
        kept = settled(lambda: [(v["value"] if "value" in v else v["values"]) for v in
                                prom.query('sim_page_index[10m]')], quiet_s=4.0, timeout_s=120)
        assert kept, "Prometheus kept no page"
        # what Prometheus kept has been sent once nothing is pending, twice 3 s apart (each shard sends
        # in order; the series that go on, `up` and the scrape's own, come after the engine's last)
        deadline = time.monotonic() + 120
        while not _sent_all(prom):
            assert time.monotonic() < deadline, "Prometheus did not send everything"
            time.sleep(0.5)
    finally:
        prom.stop()
        exporter.stop()
        srv.stop()  # gpufleet stores the minutes it holds (the last ones are not finished by a later scrape)
    values = [int(float(v)) for _, v in kept[0]]
    first, last = res.pages[min(values)][0], res.pages[max(values)][0]
    truth = sum(1 for r in res.finished() if first <= r.finished < last)
    with e.connect() as c:
        rows = read_minutes(c, 0, 2**40)
    e.dispose()
    assert rows, "no serving minute stored"
    assert {(r.cluster, r.deployment, r.replica, r.engine) for r in rows} == \
        {("lab", "chat", "ml/chat-7d9f8b6c5-x2x9q", "vllm")}
    assert all(r.gpus == 0 and r.gpu_uuids is None for r in rows)  # no GPU series: the GPUs are unknown
    assert sum(r.measures.get("requests", 0.0) for r in rows) == truth > 0
    ttft = sum(r.measures["ttft"]["c"][-1] for r in rows if "ttft" in r.measures)
    assert ttft == sum(1 for r in res.requests if r.first_token is not None and first <= r.first_token < last)

"""A real Prometheus (Debian's) scrapes a simulated vLLM replica over HTTP and remote-writes to a
receiver that hands each body to collector/serving_remote_write.py; the replica-minutes it folds
hold exactly the requests and tokens the engine's counters moved by between the first and the last
page Prometheus scraped, and the TTFT buckets likewise (a shard-split scrape, staleness markers and
Prometheus's own labels included)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpufleet.agent.sim_serving import EngineModel, Workload, simulate
from gpufleet.collector.remote_write.wire import decode, labels_of, unsnappy
from gpufleet.collector.serving_remote_write import ServingRemoteWrite
from gpufleet.serving_expo import Hist, parse_exposition, snapshot
from tests.prometheus.procs import FakeExporter, settled, start_prometheus

pytestmark = pytest.mark.slow


class Receiver:
    def __init__(self) -> None:
        self.rw = ServingRemoteWrite(grace_s=2.0)
        self.lock = threading.Lock()
        self.bodies = 0  # bodies that carried serving series
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = unsnappy(self.rfile.read(int(self.headers["Content-Length"])), max_size=64 << 20)
                req = decode(raw)
                with outer.lock:
                    if outer.rw.add([(labels_of(s.key), s.samples) for s in req.series]):
                        outer.bodies += 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/write"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_prometheus_remote_write_to_serving_minutes(tmp_path: Path) -> None:
    res = simulate(EngineModel(), Workload(rate_rps=6, duration_s=40, seed=4), engine="vllm", scrape_s=1.0,
                   drain=False)
    pages = [p for _, p in res.pages]
    exporter = FakeExporter("", page=lambda k: pages[min(k, len(pages) - 1)])
    rcv = Receiver()
    config = f"""
global: {{scrape_interval: 1s, scrape_timeout: 900ms}}
scrape_configs:
  - job_name: vllm
    static_configs: [{{targets: ['127.0.0.1:{exporter.port}'], labels: {{namespace: ml, pod: chat-0}}}}]
remote_write:
  - url: {rcv.url}
    queue_config: {{batch_send_deadline: 200ms, min_shards: 2, max_shards: 2, max_samples_per_send: 100}}
"""
    prom = start_prometheus(tmp_path, config)
    try:
        deadline = time.monotonic() + 120
        while exporter.scrapes < 12 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert exporter.scrapes >= 12, "Prometheus did not scrape"
        # the engine goes away: Prometheus writes staleness markers (NaN), then no more serving series
        exporter.stop()
        served = min(exporter.scrapes, len(pages))
        settled(lambda: rcv.bodies, quiet_s=4.0)
    finally:
        prom.stop()
        exporter.stop()
        rcv.server.shutdown()
    with rcv.lock:
        recs = rcv.rw.drain_records(time.time() + 3600, gpus_of=lambda job: ["GPU-x"])
    assert recs and {r["replica"] for r in recs} == {"ml/chat-0"} and {r["deployment"] for r in recs} == {"chat-0"}
    first = snapshot(parse_exposition(pages[0]), "vllm")
    last = snapshot(parse_exposition(pages[served - 1]), "vllm")
    for measure in ("requests", "generation_tokens", "prompt_tokens"):
        got = sum(r["measures"].get(measure, 0.0) for r in recs)
        assert got == pytest.approx(float(last[measure]) - float(first[measure])), measure  # type: ignore[arg-type]
    ttft_last, ttft_first = last["ttft"], first["ttft"]
    assert isinstance(ttft_last, Hist) and isinstance(ttft_first, Hist)
    got_count = sum(r["measures"]["ttft"]["c"][-1] for r in recs if "ttft" in r["measures"])
    assert got_count == ttft_last.count - ttft_first.count
    assert rcv.rw.late_samples == 0

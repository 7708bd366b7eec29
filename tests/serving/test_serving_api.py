"""Serving intake and API end to end on a real server (SQLite and PostgreSQL): simulated vLLM
replicas' pages folded into minutes, POSTed to /api/v1/serving/minutes, read back through
/api/v1/deployments with the attainment the analysis computes from the same minutes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gpufleet.agent.sim_serving import EngineModel, Workload, simulate
from gpufleet.analysis.serving.measures import ServingMinute, summarize
from gpufleet.analysis.serving.slo import PRESETS
from gpufleet.serving_expo import measures_from_json, measures_to_json, minutes_of, parse_exposition, snapshot

T0 = int(time.time() // 60 * 60) - 20 * 60  # the simulated run's minutes start 20 minutes ago
MODEL = EngineModel(step_base_s=0.012, prefill_s_per_token=0.0001, decode_s_per_seq=0.0003, max_num_seqs=64,
                    kv_capacity_tokens=40_000)


def replica_records(seed: int, replica: str) -> list[dict[str, Any]]:
    res = simulate(MODEL, Workload(rate_rps=3.0, duration_s=300, seed=seed), engine="vllm", drain=False)
    scrapes = [(T0 + t, snapshot(parse_exposition(page), "vllm")) for t, page in res.pages]
    return [{"deployment": "llama-8b-chat", "replica": replica, "minute": m, "engine": "vllm", "gpus": 1,
             "gpu_uuids": [f"GPU-{replica}"], "job_id": f"default/{replica}", "measures": measures_to_json(snap)}
            for m, snap in minutes_of(scrapes).items() if m < T0 + 300]


@pytest.fixture
def server(database_url: str, live_server: Callable[..., Any]) -> str:
    return str(live_server(database_url).url)


def test_intake_and_deployments(server: str) -> None:
    recs = replica_records(1, "chat-0") + replica_records(2, "chat-1")
    bad = {"deployment": "llama-8b-chat", "replica": "chat-9", "minute": T0 + 7, "engine": "vllm", "gpus": 1,
           "measures": {"requests": 3}}
    half_bad = {**recs[0], "replica": "chat-2", "measures": {**recs[0]["measures"], "kv_usage": 7.0}}
    body = {"cluster": "default", "node": "n1", "minutes": [*recs, bad, half_bad],
            "deployments": {"llama-8b-chat": {"gpufleet.io/slo-preset": "mlperf-llama3.1-8b-interactive"}}}
    with httpx.Client(base_url=server, timeout=60) as c:
        r = c.post("/api/v1/serving/minutes", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["stored"] == len(recs) + 1
        refused = {x["index"]: x for x in out["refused"]}
        assert "minute" in refused[len(recs)]["why"][0] and not refused[len(recs)]["stored"]
        assert "kv_usage" in refused[len(recs) + 1]["why"][0] and refused[len(recs) + 1]["stored"]
        # nothing storable: 422 naming the record; not JSON: 400
        r = c.post("/api/v1/serving/minutes", json={"cluster": "default", "node": "n1", "minutes": [bad]})
        assert r.status_code == 422 and r.json()["refused"][0]["index"] == 0
        assert c.post("/api/v1/serving/minutes", content=b"{nope").status_code == 400
        # a retried batch replaces, never doubles
        assert c.post("/api/v1/serving/minutes", json={"cluster": "default", "node": "n1",
                                                         "minutes": recs}).json()["stored"] == len(recs)

        q = {"start": str(T0), "end": str(T0 + 300)}
        listing = c.get("/api/v1/deployments", params=q).json()
        (dep,) = listing["data"]
        assert dep["name"] == "llama-8b-chat" and dep["cluster"] == "default" and dep["engine"] == "vllm"
        assert dep["slo"]["source"] == "mlperf-llama3.1-8b-interactive"
        # the API's attainment is the analysis of the same minutes (chat-2 stored without its bad gauge)
        ms = [ServingMinute("llama-8b-chat", x["replica"], x["minute"], 1, "vllm",
                            measures_from_json(x["measures"])[0]) for x in [*recs, half_bad]]
        want = summarize("llama-8b-chat", ms, PRESETS["mlperf-llama3.1-8b-interactive"])
        assert dep["ttft_attainment"] == pytest.approx(want.ttft_attainment)
        assert dep["tpot_attainment"] == pytest.approx(want.tpot_attainment)
        assert dep["requests"] == want.requests
        assert dep["replicas"] == 3  # chat-0, chat-1 and the half-bad chat-2

        one = c.get("/api/v1/deployments/llama-8b-chat", params=q).json()
        assert len(one["series"]) == 5 and {"ttft_attainment", "ttft_p99", "kv_usage"} <= set(one["series"][0])
        reps = {x["replica"]: x for x in one["replicas"]}
        assert reps["chat-0"]["gpu_uuids"] == ["GPU-chat-0"] and reps["chat-0"]["job_id"] == "default/chat-0"
        assert isinstance(one["findings"], list)
        assert c.get("/api/v1/deployments/nope", params=q).status_code == 404
        assert c.get("/api/v1/deployments", params={"start": "-30d"}).status_code == 400

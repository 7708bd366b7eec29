"""Remote-write series -> protocol v1 batches (collector/remote_write/mapping.py) on the real
dcgm-exporter captures: the same values the agent's own scraper reads from the same text."""

from __future__ import annotations

import math
import struct

import pytest

from gpufleet import dcgm
from gpufleet.agent.sources.dcgm_exporter import parse_exposition
from gpufleet.collector.remote_write import wire
from gpufleet.collector.remote_write.mapping import RateState, SeriesMap, convert
from gpufleet.protocol import Batch
from tests.prometheus.captures import DUMPS, body, capture_series, capture_text

T0 = 1_790_000_000_000  # ms
NOW = T0 / 1000 + 1
STALE = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]  # Prometheus' staleness marker


def _convert(raw: bytes, rates: RateState | None = None, digest: str = "d", **kw: object):
    kw.setdefault("max_age_s", 86400.0)
    return convert(wire.decode(raw), SeriesMap(), rates or RateState(), cluster="c1", digest=digest, now=NOW,
                   max_future_s=300.0, max_rows=20_000, **kw)


def _rows(b: Batch) -> dict[tuple[str, float], dict[str, object]]:
    s = b.samples
    names = [k for k in s if k not in ("ts", "gpu", "job")]
    return {(s["gpu"][i], s["ts"][i]): {n: s[n][i] for n in names if s[n][i] is not None}
            for i in range(len(s["ts"]))}


@pytest.mark.parametrize("name", DUMPS)
def test_captures_give_the_values_the_agents_scraper_reads(name: str) -> None:
    series = capture_series(name, instance="10.0.0.7:9400", job="dcgm")
    conv = _convert(body([(lab, [(T0, v)]) for lab, v, _ in series]))
    agent = parse_exposition(capture_text(name))
    got: dict[str, dict[str, object]] = {}
    for b in conv.batches:
        for (uuid, ts), row in _rows(b).items():
            assert ts == T0 / 1000
            got[uuid] = row
    assert set(got) == set(agent)
    for uuid, g in agent.items():
        assert got[uuid] == pytest.approx(g.values), uuid  # gauges; the captures' counters are not rate fields
    not_gpu = [lab for lab, _, _ in series
               if (dcgm.field_for(lab["__name__"]) is None and lab["__name__"] not in dcgm.FB_EXTRA)
               or not lab.get("UUID")]
    assert conv.series == len(series) and sum(conv.ignored.values()) == len(not_gpu)
    assert conv.ignored["no_gpu_identity"] > 0 or name != "datadog-integrations-metrics.txt"


def test_node_gpu_model_memory_and_pod_come_from_the_labels() -> None:
    series = capture_series("datadog-integrations-metrics.txt", instance="10.0.0.7:9400")
    conv = _convert(body([(lab, [(T0, v)]) for lab, v, _ in series]))
    by_node = {b.agent.node: b for b in conv.batches}
    assert sorted(by_node) == ["424773df46e0", "551bdf382151", "ip-11111"]  # its Hostname labels
    b = by_node["424773df46e0"]
    assert b.agent.cluster == "c1" and [g.uuid for g in b.gpus] == ["GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"]
    t4 = {g.uuid: g for g in b.gpus}["GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"]
    assert t4.model == "Tesla T4" and t4.index == 0 and t4.memory_total_bytes == 15109 * 2**20
    h100 = _convert(body([(lab, [(T0, v)]) for lab, v, _ in capture_series("h100-k8s-issue490.txt")]))
    (b,) = h100.batches
    jobs = dict(zip(b.samples["gpu"], b.samples["job"], strict=True))
    assert jobs == {"GPU-8b2281de-6d3c-22ed-0ec8-d3b864870b8b": "default/dcgmproftester2",
                    "GPU-15338f3e-5fd9-962d-921a-979b820520f0": None}
    (job,) = b.jobs
    assert job.source == "kubernetes" and job.namespace == "default" and job.labels["container"] == "dcgmproftester2"
    # readme capture has no Hostname: the scrape target's instance (host part) names the node
    (b,) = _convert(body([(lab, [(T0, v)]) for lab, v, _ in
                          capture_series("readme-k8s-example.txt", instance="gpu-n3:9400")])).batches
    assert b.agent.node == "gpu-n3" and "job" not in b.samples  # pod="" is no attribution


GPU = {"UUID": "GPU-aaaa", "gpu": "0", "Hostname": "n1", "modelName": "NVIDIA H100 80GB HBM3"}


def _one(labels: dict[str, str], value: float = 0.5, name: str = "DCGM_FI_PROF_SM_ACTIVE"):
    return ({"__name__": name, **GPU, **labels}, [(T0, value)])


def test_attribution_order_explicit_relabel_then_slurm_then_exported_pod() -> None:
    conv = _convert(body([
        _one({"gpufleet_job": "train-7", "hpc_job": "99", "gpufleet_user": "alice", "UUID": "GPU-1"}),
        _one({"hpc_job": "4242", "UUID": "GPU-2"}),
        # a ServiceMonitor scrape: the exporter pod's own pod/namespace, the workload's as exported_*
        _one({"pod": "dcgm-exporter-x1", "namespace": "gpu-operator", "exported_pod": "llm-0",
              "exported_namespace": "team-a", "exported_container": "trainer", "UUID": "GPU-3"}),
        _one({"GPU_I_ID": "9", "GPU_I_PROFILE": "1g.10gb", "UUID": "GPU-4"}),
    ]))
    (b,) = conv.batches
    jobs = {j.job_id: j for j in b.jobs}
    assert dict(zip(b.samples["gpu"], b.samples["job"], strict=True)) == {
        "GPU-1": "train-7", "GPU-2": "4242", "GPU-3": "team-a/llm-0", "MIG-4-gi9": None}
    assert jobs["train-7"].user == "alice" and jobs["train-7"].source == "slurm"
    assert jobs["4242"].source == "slurm"
    assert jobs["team-a/llm-0"].labels == {"pod": "llm-0", "container": "trainer"}
    mig = {g.uuid: g for g in b.gpus}["MIG-4-gi9"]
    assert mig.parent_uuid == "GPU-4" and mig.mig_profile == "1g.10gb"



def test_a_pytorchjobs_pods_arrive_as_one_job_by_remote_write() -> None:
    conv = _convert(body([
        _one({"exported_pod": f"bert-worker-{i}", "exported_namespace": "team-a", "UUID": f"GPU-{i}"})
        for i in range(3)]))
    (b,) = conv.batches
    assert set(b.samples["job"]) == {"team-a/bert"}
    assert [j.job_id for j in b.jobs] == ["team-a/bert"]

def test_the_servers_pod_job_patterns_group_what_the_defaults_keep_apart_and_none_splits() -> None:
    """Setting ``kubernetes_job_patterns`` on the server: a StatefulSet's replicas (not grouped
    by default) become one job with a pattern for them; ``none`` keeps a PyTorchJob's pods apart."""
    from gpufleet.pod_jobs import PodJobs

    sts = body([_one({"exported_pod": f"vllm-llama-{i}", "exported_namespace": "serve", "UUID": f"GPU-{i}"})
                for i in range(2)])
    default = _convert(sts)
    assert {j.job_id for b in default.batches for j in b.jobs} == {"serve/vllm-llama-0", "serve/vllm-llama-1"}
    grouped = convert(wire.decode(sts), SeriesMap(pod_jobs=PodJobs([r"^(?P<job>vllm-.+)-\d+$"])), RateState(),
                      cluster="c1", digest="d", now=NOW, max_age_s=86400.0, max_future_s=300.0, max_rows=20_000)
    (b,) = grouped.batches
    assert set(b.samples["job"]) == {"serve/vllm-llama"} and [j.job_id for j in b.jobs] == ["serve/vllm-llama"]
    pytorch = body([_one({"exported_pod": f"bert-worker-{i}", "exported_namespace": "team-a", "UUID": f"GPU-{i}"})
                    for i in range(2)])
    apart = convert(wire.decode(pytorch), SeriesMap(pod_jobs=PodJobs(["none"])), RateState(), cluster="c1",
                    digest="d", now=NOW, max_age_s=86400.0, max_future_s=300.0, max_rows=20_000)
    assert {j.job_id for b in apart.batches for j in b.jobs} == {"team-a/bert-worker-0", "team-a/bert-worker-1"}


def test_samples_that_are_no_reading_are_counted_never_stored() -> None:
    conv = _convert(body([
        _one({}, STALE),
        _one({}, math.nan, "DCGM_FI_DEV_GPU_UTIL"),
        _one({}, 250.0, "DCGM_FI_DEV_GPU_UTIL"),  # 250 % is outside the catalog's 0..1
        _one({}, 1.0, "DCGM_FI_DEV_FAN_SPEED"),  # not a catalog field
        _one({}, 1.0, "node_cpu_seconds_total"),
        _one({}, 5.0, "nccl_p2p_bandwidth_gbs"),  # an Inspector metric the fold does not use
        ({"__name__": "DCGM_FI_DEV_POWER_USAGE", "gpu": "0"}, [(T0, 70.0)]),  # no UUID
        ({"__name__": "DCGM_FI_DEV_POWER_USAGE", "UUID": "GPU-z"}, [(T0, 70.0)]),  # no node label at all
        ({"__name__": "DCGM_FI_DEV_POWER_USAGE", **GPU}, [(T0 - 2 * 86400_000, 70.0), (T0 + 3600_000, 70.0)]),
    ]))
    assert conv.batches == []
    assert conv.dropped == {"nan_or_stale": 2, "outside_catalog_range": 1, "too_old": 1, "in_future": 1}
    assert conv.ignored == {"not_gpu_metric": 2, "nccl_metric_not_used": 1, "no_gpu_identity": 1,
                            "no_node": 1}


def test_one_row_per_gpu_and_timestamp_with_the_fields_present() -> None:
    conv = _convert(body([
        _one({}, 0.5),
        ({"__name__": "DCGM_FI_DEV_GPU_UTIL", **GPU}, [(T0, 40.0), (T0 + 1000, 60.0)]),
        ({"__name__": "DCGM_FI_DEV_POWER_USAGE", **GPU, "UUID": "GPU-bbbb", "gpu": "1"}, [(T0, 300.0)]),
    ]))
    (b,) = conv.batches
    assert _rows(b) == {("GPU-aaaa", T0 / 1000): {"sm_active": 0.5, "gpu_util": 0.4},
                        ("GPU-aaaa", T0 / 1000 + 1): {"gpu_util": 0.6},
                        ("GPU-bbbb", T0 / 1000): {"power_w": 300.0}}


def test_counters_become_rates_across_requests_and_a_retry_computes_the_same() -> None:
    name = "DCGM_FI_PROF_NVLINK_TX_BYTES"
    meta = [(name, wire.COUNTER)]
    rates = RateState()
    first = _convert(body([({"__name__": name, **GPU}, [(T0, 1000.0), (T0 + 10_000, 51000.0)])], meta), rates)
    (b,) = first.batches
    assert _rows(b) == {("GPU-aaaa", T0 / 1000 + 10): {"nvlink_tx_bytes_s": 5000.0}}
    assert first.dropped == {"counter_first_sample": 1}
    rates.commit(first.rate_updates)
    nxt = body([({"__name__": name, **GPU}, [(T0 + 20_000, 151000.0), (T0 + 30_000, 10.0)])])
    a = _convert(nxt, rates)  # metadata is remembered from the earlier request
    retry = _convert(nxt, rates)  # nothing committed in between (the first attempt got a 503)
    assert [x.samples for x in a.batches] == [x.samples for x in retry.batches]
    assert _rows(a.batches[0]) == {("GPU-aaaa", T0 / 1000 + 20): {"nvlink_tx_bytes_s": 10000.0}}
    assert a.dropped == {"counter_reset": 1}
    # without counter metadata or a _total suffix, the same name is a gauge (DCGM's PROF bytes are rates)
    g = _convert(body([({"__name__": name, **GPU}, [(T0, 7.0)])]))
    assert _rows(g.batches[0]) == {("GPU-aaaa", T0 / 1000): {"nvlink_tx_bytes_s": 7.0}}
    t = _convert(body([({"__name__": name + "_total", **GPU}, [(T0, 7.0), (T0 + 1000, 9.0)])]))
    assert _rows(t.batches[0]) == {("GPU-aaaa", T0 / 1000 + 1): {"nvlink_tx_bytes_s": 2.0}}


def test_keys_are_stable_per_request_and_distinct_per_node_and_chunk() -> None:
    raw = body([_one({"Hostname": f"n{i}", "UUID": f"GPU-{i}"}) for i in range(3)]
               + [({"__name__": "DCGM_FI_DEV_GPU_UTIL", **GPU, "Hostname": "big"},
                   [(T0 + k * 1000, 50.0) for k in range(5)])])
    a = _convert(raw, digest="abc", max_age_s=None)
    b = _convert(raw, digest="abc", max_age_s=None)
    assert [x.idempotency_key for x in a.batches] == [x.idempotency_key for x in b.batches]
    assert len({x.idempotency_key for x in a.batches}) == 4
    small = convert(wire.decode(raw), SeriesMap(), RateState(), cluster="c1", digest="abc", now=NOW,
                    max_age_s=None, max_future_s=300.0, max_rows=2)
    big = [x for x in small.batches if x.agent.node == "big"]
    assert [x.n_rows() for x in big] == [2, 2, 1]
    assert len({x.idempotency_key for x in small.batches}) == len(small.batches)

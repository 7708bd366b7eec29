"""The remote-write serving fold's state (collector/serving_remote_write.py): when a minute is
finished, a silent replica, a body sent twice, clusters kept apart, the byte bound."""

from __future__ import annotations

from gpufleet.collector.serving_remote_write import ServingRemoteWrite, serving_series

POD = {"namespace": "ml", "pod": "chat-0", "gpufleet_deployment": "chat"}
T0 = 1_700_000_040  # a minute's start


def _body(t: float, requests: float, running: float = 2.0, **target: str) -> list:
    labels = {**POD, **target}
    return [({"__name__": "vllm:request_success_total", **labels}, [(int(t * 1000), requests)]),
            ({"__name__": "vllm:num_requests_running", **labels}, [(int(t * 1000), running)])]


def _feed(rw: ServingRemoteWrite, times: list[float], cluster: str = "default", now: float = 0.0) -> None:
    for k, t in enumerate(times):
        for labels, samples in _body(t, 10.0 * k):
            m = serving_series(labels)
            assert not isinstance(m, str) and m is not None
            rw.add_mapped([(m, samples)], cluster, now=now)


def test_a_minute_is_finished_by_a_later_scrape_past_it_plus_the_grace() -> None:
    rw = ServingRemoteWrite(grace_s=5.0)
    _feed(rw, [T0 + s for s in (0, 15, 30, 45, 60)])
    assert rw.finished() == []  # the scrape at T0+60 is not folded until a newer one is 5 s past it
    _feed(rw, [T0 + 75])
    done = rw.finished()
    assert [(f.minute, f.measures["requests"]) for f in done] == [(T0, 40.0)]
    assert done[0].job == "ml/chat-0" and done[0].replica == "ml/chat-0" and done[0].deployment == "chat"
    assert rw.finished() == []  # each once


def test_a_silent_replica_is_finished_and_forgotten() -> None:
    rw = ServingRemoteWrite(grace_s=5.0, silence_s=180.0)
    _feed(rw, [T0 + s for s in (0, 15, 30)], now=1000.0)
    rw.sweep(1000.0 + 179)
    assert rw.finished() == [] and rw.replicas() == 1
    rw.sweep(1000.0 + 180)
    assert [(f.minute, f.measures["requests"]) for f in rw.finished()] == [(T0, 20.0)]
    assert rw.replicas() == 0 and rw.budget.used == 0


def test_a_body_sent_twice_counts_once() -> None:
    once, twice = ServingRemoteWrite(), ServingRemoteWrite()
    times = [T0 + s for s in (0, 15, 30, 45, 60, 75)]
    _feed(once, times)
    for k, t in enumerate(times):  # each body twice before its scrape is folded (a retry after a lost answer)
        twice.add(_body(t, 10.0 * k))
        twice.add(_body(t, 10.0 * k))
    assert [f.measures for f in twice.finished()] == [f.measures for f in once.finished()]
    assert twice.late_samples == 2 * len(times)


def test_clusters_are_kept_apart() -> None:
    rw = ServingRemoteWrite()
    times = [T0 + s for s in (0, 30, 60, 90)]
    _feed(rw, times, cluster="a")
    _feed(rw, times, cluster="b")
    assert sorted((f.cluster, f.minute, f.measures["requests"]) for f in rw.finished()) == \
        [("a", T0, 20.0), ("b", T0, 20.0)]


def test_the_state_stays_within_its_byte_bound() -> None:
    rw = ServingRemoteWrite(max_bytes=20_000)
    for r in range(40):  # 40 replicas' open minutes do not fit in 20 kB
        _feed(rw, [T0, T0 + 15], cluster="default")
        rw.add(_body(T0 + 30, 1.0, pod=f"chat-{r}"))
        assert rw.budget.used <= rw.budget.limit
    assert rw.budget.evictions > 0 and rw.lost_minutes > 0


def test_what_is_not_a_usable_serving_series() -> None:
    assert serving_series({"__name__": "DCGM_FI_DEV_GPU_UTIL", **POD}) is None
    assert serving_series({"__name__": "vllm:num_requests_running", "job": "x"}) == "serving_no_replica"
    assert serving_series({"__name__": "vllm:time_to_first_token_seconds_bucket", "le": "x", **POD}) \
        == "serving_bad_bucket"
    assert serving_series({"__name__": "vllm:time_to_first_token_seconds_bucket", "le": "+Inf", **POD}) is not None
    assert serving_series({"__name__": "vllm:num_requests_running", **POD, "namespace": "n\x00"}) \
        == "serving_bad_identity"
    assert serving_series({"__name__": "vllm:lora_requests_info", **POD}) == "serving_metric_not_used"
    job = serving_series({"__name__": "vllm:num_requests_running", **POD, "gpufleet_job": "train-7"})
    assert job is not None and not isinstance(job, str) and job.job == "train-7"

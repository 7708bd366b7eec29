"""Workload classes from scheduler metadata, and the rules that depend on them."""

from __future__ import annotations

import numpy as np

from gpufleet.analysis.workload import classify

from .verdict_data import healthy_training, kinds, run


def test_classes_from_metadata() -> None:
    assert classify(labels={"owner_kind": "ReplicaSet", "app.kubernetes.io/name": "trainer"}).name == "serving"
    assert classify(labels={"owner_kind": "PyTorchJob"}).name == "training"
    assert classify(labels={"owner_kind": "Notebook"}).name == "interactive"
    assert classify(partition="hpc", name="run42").name == "hpc"
    assert classify(partition="gpu", labels={"qos": "interactive"}, name="bash").name == "interactive"
    assert classify(name="llama3-70b-pretrain").name == "training"
    assert classify(name="embed-corpus-batch-infer").name == "batch_inference"
    assert classify(name="vllm-llama-8b", namespace="prod").name == "serving"
    # an explicit label overrides everything
    assert classify(labels={"owner_kind": "Deployment", "gpufleet.io/workload": "training"}).name == "training"
    c = classify(name="job-1234", partition="gpu")
    assert c.name is None and "no scheduler metadata" in c.reason


def test_serving_replica_idling_between_requests_is_not_an_input_stall() -> None:
    def bursty(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        d = dict(healthy_training(t, g))
        busy = (np.floor(t / 6.0) % 2) == 0  # requests in bursts: 6 s saturated, 6 s quiet
        d.update(sm_active=np.where(busy, 0.8, 0.0), tensor_active=np.where(busy, 0.4, 0.0),
                 gpu_util=np.where(busy, 1.0, 0.0))
        return d
    assert "input_stall" in kinds(run(2, 60, 1.0, bursty))  # a training job with that pattern stalls
    from gpufleet.analysis.workload import WorkloadClass
    res = run(2, 60, 1.0, bursty, workload=WorkloadClass("serving", "Kubernetes owner ReplicaSet"))
    assert "input_stall" not in kinds(res)
    assert res.report["workload"] == {"class": "serving", "from": "Kubernetes owner ReplicaSet"}
    for f in res.findings:
        assert "DataLoader" not in f.suggestion


def test_fp32_simulation_code_on_hpc_keeps_its_tensor_cores_unflagged() -> None:
    from gpufleet.analysis.workload import WorkloadClass

    def md(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        d = dict(healthy_training(t, g))
        d.update(sm_active=0.62, tensor_active=0.0, fp32_active=0.55, fp64_active=0.01, dram_active=0.3)
        return d
    assert "no_tensor_cores" in kinds(run(2, 60, 1.0, md))  # as a training job: the advice fits
    assert kinds(run(2, 60, 1.0, md, workload=classify(partition="hpc"))) == set()
    assert classify(partition="hpc") == WorkloadClass("hpc", "partition hpc")


def test_request_driven_pattern_is_serving_without_metadata() -> None:
    """No metadata; requests in bursts whose density follows the traffic (quiet, then busy
    hours): the busy share swings between windows, so it is a replica, not a stalled loader."""
    def replica(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        d = dict(healthy_training(t, g))
        load = 0.2 + 0.6 * (np.floor(t / 1800.0) % 2)  # half-hour swings in traffic
        busy = ((t % 10.0) / 10.0) < load
        d.update(sm_active=np.where(busy, 0.8, 0.0), tensor_active=np.where(busy, 0.4, 0.0),
                 gpu_util=np.where(busy, 1.0, 0.0))
        return d
    res = run(1, 180, 1.0, replica)
    assert res.report["workload"]["class"] == "serving" and "pattern" in res.report["workload"]["from"]
    assert "input_stall" not in kinds(res)

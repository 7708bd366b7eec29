"""Which job a Kubernetes pod belongs to, read from its name (gpufleet/pod_jobs.py)."""

from __future__ import annotations

import pytest

from gpufleet.pod_jobs import DEFAULT, PodJobs


@pytest.mark.parametrize(("pod", "owner"), [
    # Kubeflow training operator v1: <job>-<role>-<index>
    ("pytorch-simple-master-0", "pytorch-simple"),
    ("pytorch-simple-worker-15", "pytorch-simple"),
    ("tf-mnist-chief-0", "tf-mnist"),
    ("tf-mnist-ps-1", "tf-mnist"),
    ("tf-mnist-evaluator-0", "tf-mnist"),
    ("mpi-bert-worker-3", "mpi-bert"),
    # JobSet / Kubeflow Trainer v2 TrainJob: <jobset>-<replicated job>-<job idx>-<pod idx>-<suffix>
    ("llm-node-0-3-x7k2p", "llm"),
    ("llm-node-1-0-abcde", "llm"),
    ("big-run-trainer-12-7-q9w8e", "big-run"),
    # not grouped: a StatefulSet replica, a Deployment pod, a CronJob run, an Indexed Job pod,
    # an Indexed CronJob run (8-digit minutes are no JobSet job index), a bare pod
    ("trainer-0", None),
    ("vllm-0", None),
    ("web-7d9f8c6b5-abcde", None),
    ("backup-28312345-abcde", None),
    ("idx-3-abcde", None),
    ("nightly-eval-28312345-0-abcde", None),
    ("notebook", None),
    ("worker-0", None),  # the role alone names no job
])
def test_owner_from_the_operators_naming_rules(pod: str, owner: str | None) -> None:
    assert DEFAULT.owner(pod) == owner


def test_every_pod_of_a_job_describes_it_identically() -> None:
    a = DEFAULT.job("ml", "llm-worker-0", "trainer")
    b = DEFAULT.job("ml", "llm-worker-1", "sidecar", pod_uid="u-1", user="alice")
    assert a.job_id == b.job_id == "ml/llm" and a.name == "llm" and a.namespace == "ml"
    # no pod or container in a grouped job's description: nodes would rewrite it batch by batch
    assert a.labels == b.labels == {"job_from": "pod name"}
    assert b.user == "alice" and a.source == "kubernetes"


def test_an_ungrouped_pod_is_its_own_job_with_its_details() -> None:
    j = DEFAULT.job("", "trainer-0", "main", pod_uid="u-9")
    assert j.job_id == "default/trainer-0" and j.namespace == "default"
    assert j.labels == {"pod": "trainer-0", "container": "main", "pod_uid": "u-9"}


def test_none_turns_grouping_off_and_custom_patterns_apply_in_order() -> None:
    assert PodJobs(("none",)).owner("pytorch-simple-master-0") is None
    assert PodJobs(()).job("ml", "llm-worker-0").job_id == "ml/llm-worker-0"
    custom = PodJobs((r"^(?P<job>.+)-\d+-[a-z0-9]{5}$", r"^(?P<job>.+)-\d+$"))
    assert custom.owner("idx-3-abcde") == "idx"
    assert custom.owner("vllm-2") == "vllm"


@pytest.mark.parametrize(("pattern", "says"), [
    ("^(?P<job>.+-", "is not a regular expression"),
    (r"^(.+)-worker-\d+$", "no (?P<job>...) group"),
])
def test_a_bad_pattern_is_refused_naming_it(pattern: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"pod job pattern") as e:
        PodJobs((pattern,))
    assert says in str(e.value) and repr(pattern) in str(e.value)

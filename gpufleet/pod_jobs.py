"""Which job a Kubernetes pod belongs to, read from the pod's name.

A distributed training job on Kubernetes is several pods (a PyTorchJob's master and workers,
a JobSet's replicated Jobs). Neither source of pod attribution names the owner: the kubelet's
PodResources API (the agent) gives namespace, pod and container, and dcgm-exporter's labels
(remote write) the same. The agent does not call the API server for owner references
(decision, docs/agent.md: no cluster-wide read credentials on every node), but the training
operators name their pods by fixed rules, so the owner is in the name:

- Kubeflow training operator v1 (PyTorchJob, TFJob, MPIJob, XGBoostJob, PaddleJob, JAXJob):
  ``<job>-<role>-<index>``, role one of master, worker, chief, ps, evaluator, launcher.
- JobSet, and so Kubeflow Trainer v2's TrainJob built on it:
  ``<jobset>-<replicated job>-<job index>-<pod index>-<5-character suffix>``. A replicated
  job's name with a dash in it ends up in the owner (``a-b-c-0-1-xxxxx`` -> ``a-b``): each
  replicated job is then its own gpufleet job, never two jobs merged.

Not grouped by default, because their names read like things that must stay apart: an Indexed
Job's ``<job>-<index>-<suffix>`` is a CronJob run's ``<cronjob>-<minutes>-<suffix>`` (each
run its own job), and a StatefulSet's ``<set>-<n>`` replicas are usually independent servers.
An operator adds a pattern for them (``GPUFLEET_KUBERNETES_JOB_PATTERNS``, read by the agent and
by the server for remote write) or names the job outright (remote write: a ``gpufleet_job``
relabel). Both sides share these rules so a job seen by the agent and by remote write gets the
same id. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpufleet.protocol import JobInfo

DEFAULT_PATTERNS: tuple[str, ...] = (
    r"^(?P<job>.+)-(?:master|worker|chief|ps|evaluator|launcher)-\d+$",
    # job index at most 5 digits: a CronJob's Indexed run, <cronjob>-<minutes since 1970, 8
    # digits>-<index>-<suffix>, must not read as a JobSet (each run is its own job)
    r"^(?P<job>.+)-[a-z0-9]+-\d{1,5}-\d+-[a-z0-9]{5}$",
)


class PodJobs:
    """Compiled owner patterns; the first that matches a pod's name names its job. No patterns
    (or the setting's ``none``): every pod is its own job."""

    def __init__(self, patterns: Iterable[str] = DEFAULT_PATTERNS) -> None:
        compiled = []
        patterns = tuple(patterns)
        if tuple(p.strip().lower() for p in patterns) == ("none",):
            patterns = ()
        for p in patterns:
            try:
                rx = re.compile(p)
            except re.error as e:
                raise ValueError(f"pod job pattern {p!r} is not a regular expression: {e}") from None
            if "job" not in rx.groupindex:
                raise ValueError(f"pod job pattern {p!r} has no (?P<job>...) group naming the job")
            compiled.append(rx)
        self.patterns = tuple(compiled)

    def owner(self, pod: str) -> str | None:
        """The job a pod's name says it belongs to, or None (the pod is its own job)."""
        for rx in self.patterns:
            m = rx.match(pod)
            if m is not None and m.group("job"):
                return m.group("job")
        return None

    def job(self, namespace: str, pod: str, container: str | None = None, pod_uid: str | None = None,
            user: str | None = None) -> JobInfo:
        """The JobInfo for a pod's GPUs. A grouped job's description is the same from every
        pod and node (no pod or container in it): different descriptions of one job would
        make each node's batches rewrite the stored one."""
        ns = namespace or "default"
        owner = self.owner(pod)
        if owner is not None:
            return JobInfo(job_id=f"{ns}/{owner}", source="kubernetes", name=owner, namespace=ns,
                           labels={"job_from": "pod name"}, user=user)
        labels = {"pod": pod}
        if container:
            labels["container"] = container
        if pod_uid:
            labels["pod_uid"] = pod_uid
        return JobInfo(job_id=f"{ns}/{pod}", source="kubernetes", name=pod, namespace=ns, labels=labels, user=user)


DEFAULT = PodJobs()

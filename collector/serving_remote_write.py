"""Serving series arriving by Prometheus remote write -> the same replica-minutes the agent's scrape
sends (docs/serving.md). Pure but for the caller's ``MinuteFolder`` (gpufleet.serving_expo), which
keeps each replica's last sample between bodies.

A series is a serving series when its name starts with an engine's prefix (``vllm:``, ``sglang:``,
``tgi_``, ``nv_inference_``, ``dynamo_frontend_``). Its replica is ``namespace/pod`` when
Prometheus's Kubernetes discovery labelled it, else its ``instance``; its deployment is the
``gpufleet_deployment`` label (relabel ``gpufleet.io/deployment`` into it), else
``app_kubernetes_io_name`` or ``app``, else the pod name without its ReplicaSet hashes. The samples
of one replica that share a timestamp are one scrape. Not yet called by the receiver: the hook is a
call to ``ServingRemoteWrite.add`` with each body's decoded series and, once a minute,
``drain_records``.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gpufleet.serving_expo import MinuteFolder, Sample, measures_to_json, snapshot

PREFIXES = (("vllm:", "vllm"), ("sglang:", "sglang"), ("tgi_", "tgi"), ("nv_inference_", "triton"),
            ("dynamo_frontend_", "dynamo"))
# labels that name where a series came from, not what it measures (left out of the engine's samples)
IDENTITY = {"__name__", "job", "instance", "namespace", "pod", "container", "gpufleet_deployment",
            "app_kubernetes_io_name", "app", "endpoint", "service"}
_HASHES = re.compile(r"(-[a-z0-9]{8,10})?-[a-z0-9]{5}$")

Key = tuple[str, str, str]  # (deployment, replica, engine)


def engine_of(name: str) -> str | None:
    return next((e for p, e in PREFIXES if name.startswith(p)), None)


def replica_of(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(deployment, replica) of a series, or None when it names neither a pod nor an instance."""
    ns, pod = labels.get("namespace"), labels.get("pod")
    replica = f"{ns}/{pod}" if ns and pod else labels.get("instance")
    if not replica:
        return None
    deployment = (labels.get("gpufleet_deployment") or labels.get("app_kubernetes_io_name") or labels.get("app")
                  or (_HASHES.sub("", pod) if pod else replica))
    return deployment, replica


class ServingRemoteWrite:
    """Serving series of remote-write bodies -> replica-minutes. Prometheus splits one scrape's series
    across several bodies (and shards), so a scrape (replica, timestamp) is assembled until a body
    brings that replica's samples at least ``grace_s`` newer, or until it is older than that at a
    drain; only then does it go to the ``MinuteFolder`` (which would take a late part of an already
    folded scrape as a resend and drop it). Samples of a scrape already folded are dropped."""

    def __init__(self, grace_s: float = 5.0, folder: MinuteFolder | None = None, max_pending: int = 100_000) -> None:
        self.grace_s = grace_s
        self.folder = folder or MinuteFolder()
        self.max_pending = max_pending
        self._pending: dict[Key, dict[int, list[Sample]]] = defaultdict(lambda: defaultdict(list))
        self._newest: dict[Key, int] = {}
        self.late_samples = 0  # arrived after their scrape was folded (counted, not hidden)

    def add(self, series: Iterable[tuple[Mapping[str, str], Sequence[tuple[int, float]]]]) -> int:
        """Take one body's series; returns how many were serving series."""
        n = 0
        for labels, samples in series:
            name = labels.get("__name__", "")
            engine = engine_of(name)
            who = replica_of(labels) if engine else None
            if engine is None or who is None:
                continue
            n += 1
            key = (*who, engine)
            own = tuple(sorted((k, v) for k, v in labels.items() if k not in IDENTITY))
            for ts, value in samples:
                if math.isnan(value):
                    continue  # Prometheus's staleness marker: the series ended, no value
                last = self.folder.last_time(key)
                if last is not None and ts / 1000.0 <= last:
                    self.late_samples += 1
                    continue
                self._pending[key][ts].append(Sample(name, own, value))
                self._newest[key] = max(self._newest.get(key, ts), ts)
        self._fold(lambda key, ts: self._newest[key] - ts >= self.grace_s * 1000)
        return n

    def _fold(self, ready: Callable[[Key, int], bool]) -> None:
        for key, by_ts in self._pending.items():
            for ts in sorted(t for t in by_ts if ready(key, t)):
                self.folder.add(key, ts / 1000.0, snapshot(by_ts.pop(ts), key[2]))
        for key in [k for k, v in self._pending.items() if not v]:
            del self._pending[key]

    def drain_records(self, now: float, gpus_of: Callable[[str], list[str]]) -> list[dict[str, Any]]:
        """Intake records (collector/serving_routes.py's shape) of the minutes that ended before
        ``now``; ``gpus_of(job_id)`` is the server's GPU -> job attribution for the replica."""
        self._fold(lambda key, ts: now * 1000 - ts >= self.grace_s * 1000)
        out = []
        for key, minute, measures in self.folder.drain(now):
            deployment, replica, engine = key
            uuids = gpus_of(replica)
            out.append({"deployment": deployment, "replica": replica, "minute": minute, "engine": engine,
                        "gpus": len(uuids), "gpu_uuids": uuids, "job_id": replica,
                        "measures": measures_to_json(measures)})
        return out

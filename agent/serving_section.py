"""The agent's serving section: scrape the engines' endpoints every cycle, fold per minute, and
deliver whole minutes to ``POST /api/v1/serving/minutes`` (docs/serving.md).

Delivery goes through the same durable spool and sender policy as GPU batches, but in a spool
of its own (``<spool_dir>/serving``) with its own sender thread: a refused or undeliverable
serving body never holds back a GPU batch, and a GPU outage never holds back serving minutes.
A 4xx body is dead-lettered, never retried; records refused alone go to ``dead/refused.jsonl``.

Targets: with ``serving_pods``, the node's Running pods annotated ``gpufleet.io/serving-engine``
(listed from the kubelet or the API server, agent/sources/kubelet_pods.py); ``serving_rules`` (a
configured port per job glob) for the jobs no annotated pod names; and with ``serving_discover``
the listening TCP ports of each remaining job's GPU processes whose ``/metrics`` names a known engine.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from gpufleet.pod_jobs import PodJobs
from gpufleet.serving_expo import ExpositionError, parse_exposition
from gpufleet.serving_metrics import serving_registry

from .config import AgentConfig
from .sender import Sender
from .sources.base import GpuReading
from .sources.kubelet_pods import PodLister
from .sources.serving_scrape import (
    ServingScraper,
    ServingTarget,
    listening_ports,
    targets_from_config,
    targets_from_node_pods,
)
from .spool import SpoolItem

log = logging.getLogger(__name__)

SERVING_PATH = "/api/v1/serving/minutes"
TARGETS_TTL_S = 30.0  # re-match rules / re-probe ports at most this often (jobs come and go)
FETCH_TIMEOUT_S = 2.0  # a hung endpoint must not stall the GPU sample cycle for long


def parse_rules(text: str | None) -> list[dict[str, Any]]:
    """``serving_rules`` as a list of rule objects; ValueError names the setting and the rule."""
    if not text:
        return []
    try:
        rules = json.loads(text)
    except ValueError as e:
        raise ValueError(f"serving_rules: not JSON ({e})") from None
    if not isinstance(rules, list):
        raise ValueError("serving_rules: a JSON list of {job, engine, port, path?, deployment?} is required")
    engines = serving_registry().engines
    for i, r in enumerate(rules):
        if not isinstance(r, dict) or r.get("engine") not in engines or not str(r.get("port", "")).isdigit():
            raise ValueError(f"serving_rules[{i}]: needs engine (one of {sorted(engines)}) and port (a number)")
    return rules


def engine_of_page(text: str) -> str | None:
    """The engine whose series the page carries most of (None: not an engine's page)."""
    try:
        names = {s.name for s in parse_exposition(text)}
    except ExpositionError:
        return None
    best, hits = None, 0
    for eng in serving_registry().engines.values():
        n = sum(1 for m in eng.metrics if m.name in names or f"{m.name}_bucket" in names
                or f"{m.name}_sum" in names)
        if n > hits:
            best, hits = eng.name, n
    return best


class ServingSender(Sender):
    """The GPU sender's policy, aimed at the serving intake; refused records kept with their record."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.url = self.url.removesuffix("/api/v1/ingest") + SERVING_PATH

    def _keep_refused(self, item: SpoolItem, refused: list[dict[str, object]]) -> None:
        try:
            minutes = json.loads(item.read()[1]).get("minutes") or []
        except (OSError, ValueError, AttributeError):
            minutes = []
        target = self.spool.dead_dir / "refused.jsonl"
        try:
            self.spool.dead_dir.mkdir(exist_ok=True)
            with open(target, "a") as f:
                for r in refused:
                    i = r.get("index")
                    rec = minutes[i] if isinstance(i, int) and 0 <= i < len(minutes) else None
                    f.write(json.dumps({**r, "record": rec, "at": time.time()}, default=repr) + "\n")
        except OSError as e:
            log.error("could not keep %d refused serving records under %s (%s)", len(refused), target, e)
        log.error("collector refused %d serving record(s) (first: %s): kept in %s", len(refused),
                  refused[0].get("why"), target)
        m = self.metrics
        if m is not None and hasattr(m, "refused"):
            m.refused("serving", len(refused))


class ServingSection:
    """Owned by an Agent: ``cycle`` after each GPU sample; the agent runs ``sender`` in a thread."""

    def __init__(self, config: AgentConfig, *, metrics: Any = None,
                 fetch: Callable[[str], str] | None = None) -> None:
        from .spool import Spool

        self.config = config
        self.rules = parse_rules(config.serving_rules)
        self.discover = config.serving_discover
        self._client = httpx.Client(timeout=FETCH_TIMEOUT_S)
        self.scraper = ServingScraper(fetch=fetch or self._fetch)
        self.spool = Spool(config.spool_dir / "serving", max(1 << 20, config.spool_max_bytes // 8),
                           fsync=config.fsync, memory_max_bytes=config.spool_memory_max_bytes // 8)
        self.sender = ServingSender(self.spool, config.collector_url, token=config.token, timeout_s=config.timeout_s,
                                    backoff_base_s=config.backoff_base_s, backoff_max_s=config.backoff_max_s,
                                    retry_after_max_s=config.retry_after_max_s, metrics=metrics)
        self.pods: PodLister | None = None
        if config.serving_pods != "off":
            self.pods = PodLister(config.serving_pods, config.node, base_url=config.serving_pods_url,
                                  token_file=config.serving_pods_token_file, ca_file=config.serving_pods_ca_file,
                                  insecure_skip_tls_verify=config.serving_pods_insecure_skip_tls_verify,
                                  timeout_s=FETCH_TIMEOUT_S, retry_s=TARGETS_TTL_S)
        self.pod_jobs = PodJobs(config.kubernetes_job_patterns)  # the attribution's naming of a pod's job
        self.pods_skipped: list[str] = []  # annotated pods not scraped, and why
        self._targets_at = -1e18
        self._jobs: frozenset[str] = frozenset()
        self._gpu_job: dict[str, str] = {}

    def _fetch(self, url: str) -> str:
        try:
            return self._client.get(url).raise_for_status().text
        except httpx.HTTPError as e:  # the scraper records OSError per endpoint and goes on
            raise OSError(f"{type(e).__name__}: {e}") from None

    def targets(self, gpu_job: dict[str, str], readings: list[GpuReading]) -> list[ServingTarget]:
        jobs = sorted(set(gpu_job.values()))
        out: list[ServingTarget] = []
        if self.pods is not None:  # a failed listing: recorded per endpoint, the last good one used
            out, skipped = targets_from_node_pods(self.pods.current(), jobs, self.pod_jobs)
            for why in sorted(set(skipped) - set(self.pods_skipped)):  # once, when it starts
                log.info("annotated pod not scraped: %s", why)
            self.pods_skipped = skipped
            if self.pods.error is None:
                self.scraper.errors.pop(self.pods.url, None)
            else:
                self.scraper.errors[self.pods.url] = self.pods.error
        annotated = {t.replica for t in out}
        out += targets_from_config(self.rules, [j for j in jobs if j not in annotated])
        if self.discover:
            named = {t.replica for t in out}
            for job in jobs:
                if job in named:
                    continue
                pids = [p for r in readings if gpu_job.get(r.uuid) == job for p in r.pids]
                for port in listening_ports(self.config.proc_root, pids):
                    url = f"http://127.0.0.1:{port}/metrics"
                    try:
                        engine = engine_of_page(self.scraper.fetch(url))
                    except OSError:
                        continue
                    if engine is not None:
                        out.append(ServingTarget(job, job, engine, url))
                        break
        return out

    def cycle(self, now: float, gpu_job: dict[str, str], readings: list[GpuReading]) -> int:
        """Scrape once; spool the minutes that ended. Returns the records spooled."""
        jobs = frozenset(gpu_job.values())
        now_m = time.monotonic()
        if jobs != self._jobs or now_m - self._targets_at >= TARGETS_TTL_S:
            self.scraper.set_targets(self.targets(gpu_job, readings))
            self._jobs, self._targets_at = jobs, now_m
        self._gpu_job = dict(gpu_job)
        if not self.scraper.targets:
            return 0
        self.scraper.scrape(now)
        return self.flush(now)

    def flush(self, now: float) -> int:
        recs = self.scraper.drain(now, self._gpus_of)
        if not recs:
            return 0
        body = json.dumps({"cluster": self.config.cluster, "node": self.config.node, "minutes": recs,
                           "deployments": self.scraper.deployment_labels()}).encode()
        self.spool.put(body, {"Content-Type": "application/json"}, uuid.uuid4().hex, len(recs))
        self.sender.wake.set()
        return len(recs)

    def _gpus_of(self, job: str) -> list[str]:
        return sorted(u for u, j in self._gpu_job.items() if j == job)

    def close(self) -> None:
        self._client.close()
        self.sender.close()

"""Fabric faults of simulated jobs, drawn per job: when a collective runs slow and why.

Shared by the GPU profiles (agent/simulator.py: the SMs wait longer while collectives crawl)
and the fabric writers (agent/sim_fabric.py: NCCL Inspector records, a fake /sys per node), so
the GPU samples, the Inspector timings and the NIC counters tell one story.

The faults come and go, as they do on real clusters, so any stretch of replayed history holds
both the job's healthy speed (the detectors' baseline) and its slow episodes:

* ``congestion`` (collective_slow): another tenant's traffic (checkpoint storms to storage over
  the compute fabric) shares the spine for 7-12 minutes every 15-30 minutes. Every rank's bus
  bandwidth drops alike; no rank is consistently late and the ports' xmit_wait only doubles or
  triples (adaptive routing spreads it): slow, but not one NIC's fault.
* ``flapping_nic`` (network_degraded): a marginal transceiver on one rail of one node retrains
  at half rate for minutes at a time. The ring runs at that link's pace; the rank behind it
  enters every collective last and waits least; its port's xmit_wait climbs by orders of
  magnitude and sysfs shows the lower rate.
* ``dirty_cable`` (link_errors): a port whose symbol and receive errors count up all the time
  (FEC corrects most, throughput barely moves), now and then a link error recovery.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

FAULT_OF_PROFILE = {"collective_slow": "congestion", "network_degraded": "flapping_nic", "link_errors": "dirty_cable"}


@dataclass(frozen=True, slots=True)
class FabricFault:
    kind: str  # congestion | flapping_nic | dirty_cable | none
    period_s: float = 0.0  # episodes recur this often (job time)
    length_s: float = 0.0  # ... and last this long
    phase_s: float = 0.0
    severity: float = 0.0  # congestion: bus bandwidth lost; flapping_nic: the rate the link falls to (share)
    node_rank: int = 0  # flapping_nic / dirty_cable: which node of the job, which rail
    rail: int = 0
    errors_per_min: float = 0.0  # dirty_cable

    def active(self, t: float) -> bool:
        """Is an episode under way at job time ``t``?"""
        if self.kind not in ("congestion", "flapping_nic") or self.period_s <= 0:
            return False
        return (t + self.phase_s) % self.period_s < self.length_s

    def busbw_factor(self, t: float) -> float:
        """The share of its healthy bus bandwidth a cross-node collective gets at ``t``."""
        if not self.active(t):
            return 1.0
        return 1.0 - self.severity if self.kind == "congestion" else self.severity


@lru_cache(maxsize=4096)
def fabric_fault(profile: str, job_seed: int, n_nodes: int, gpus_per_node: int) -> FabricFault:
    kind = FAULT_OF_PROFILE.get(profile, "none")
    r = random.Random(f"fabric/{profile}/{job_seed}")
    # Episodes of 7-12 min, healthy gaps of 6-20 min between them (the detectors' baseline).
    if kind == "congestion":
        length = r.uniform(420, 720)
        period = length + r.uniform(480, 1200)
        return FabricFault(kind, period, length, r.uniform(0, period), severity=r.uniform(0.3, 0.6))
    if kind == "flapping_nic":
        length = r.uniform(420, 720)
        period = length + r.uniform(360, 900)
        return FabricFault(kind, period, length, r.uniform(0, period), severity=r.choice([0.5, 0.5, 0.25]),
                           node_rank=r.randrange(max(1, n_nodes)), rail=r.randrange(gpus_per_node))
    if kind == "dirty_cable":
        return FabricFault(kind, node_rank=r.randrange(max(1, n_nodes)), rail=r.randrange(gpus_per_node),
                           errors_per_min=r.choice([r.uniform(1, 6), r.uniform(6, 60)]))
    return FabricFault("none")

"""A serving replica-minute in the GPU-time ledger's terms (pure; docs/serving.md, "Ledger").

A GPU-second of a replica is productive in proportion to the goodput it served: the share of the
minute's requests that met both SLOs (the conservative Fréchet bound, measures.goodput_bounds) of
the replica's GPU-seconds is ``productive``; the rest is badput of the serving kind that explains
it: a minute without requests is the idle replica's, a minute with requests outside the SLO is the
missed SLO's. A minute whose engine exported no requests or latencies is ``unobserved`` (unknown is
not zero). The categories are the flag kinds' names, as the ledger's hardware categories are.

``serving_cells`` turns a job's replica-minutes into the ledger's ``ServingCell``s, which
analysis/ledger.py folds as the application's own view of the replica's GPU-minutes (the
runner reads them per job: analysis/serving/flags.py ``job_serving_cells``). Where an
``overprovisioned_deployment`` flag's episode covers a minute, the share of the replica's served
GPU-seconds the deployment did not need (1 - needed_gpus / gpus, the flag's evidence) is that
kind's instead of productive: the requests were served, but by GPUs the load did not need.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..ledger import ServingCell
from .detectors.idle_replica import KIND as IDLE_REPLICA
from .detectors.overprovisioned_deployment import KIND as OVERPROVISIONED
from .detectors.slo_missed import KIND as SLO_MISSED
from .histo import attainment
from .measures import ServingMinute, goodput_bounds, tpot_hist
from .slo import Slo

PRODUCTIVE = "productive"
UNOBSERVED = "unobserved"


def serving_ledger_minute(m: ServingMinute, slo: Slo, idle_requests_per_minute: float = 1.0) -> dict[str, float]:
    """GPU-seconds of one replica-minute by ledger category; they add up to 60 x its GPUs."""
    gpu_s = 60.0 * m.gpus
    if gpu_s <= 0:
        return {}
    requests = m.scalar("requests")
    if requests is None:
        ttft = m.hist("ttft")
        requests = ttft.count if ttft is not None else None
    if requests is None:
        return {UNOBSERVED: gpu_s}
    if requests < idle_requests_per_minute:
        return {IDLE_REPLICA: gpu_s}
    ttft, (tpot, _) = m.hist("ttft"), tpot_hist([m])
    a_t = attainment(ttft, slo.ttft_s) if ttft is not None else None
    a_p = attainment(tpot, slo.tpot_s) if tpot is not None else None
    good, upper = goodput_bounds(a_t, a_p)
    if good is None:
        if upper is None:
            return {UNOBSERVED: gpu_s}
        good = upper  # one series only (TGI has no TTFT): the share it proves is all that is known
    out = {PRODUCTIVE: gpu_s * good}
    if good < 1.0:
        out[SLO_MISSED] = gpu_s * (1.0 - good)
    return out


@dataclass(frozen=True, slots=True)
class Surplus:
    """An ``overprovisioned_deployment`` flag's episode: [start_ts, end_ts) of ``deployment``
    held ``share`` of its replicas' GPU time beyond what the load needed."""

    deployment: str
    start_ts: float
    end_ts: float
    share: float

    @classmethod
    def of(cls, deployment: str, start_ts: float, end_ts: float, evidence: Mapping[str, Any]) -> Surplus | None:
        """From a stored flag's evidence (``gpus``, ``needed_gpus``); None when they are not numbers."""
        gpus, needed = evidence.get("gpus"), evidence.get("needed_gpus")
        if not isinstance(gpus, int | float) or not isinstance(needed, int | float) or not gpus > 0:
            return None
        share = min(1.0, max(0.0, 1.0 - float(needed) / float(gpus)))
        return cls(deployment, float(start_ts), float(end_ts), share) if share > 0 else None


def serving_cells(minutes: Sequence[tuple[ServingMinute, Sequence[str] | None]], slo_of: Mapping[str, Slo],
                  surplus: Sequence[Surplus] = ()) -> list[ServingCell]:
    """The ledger cells of a job's replica-minutes (each with the GPUs it names); ``slo_of``:
    deployment -> its SLO; ``surplus``: the over-provisioning episodes on the job."""
    out = []
    for m, uuids in minutes:
        split = serving_ledger_minute(m, slo_of[m.deployment])
        over = max((s.share for s in surplus
                    if s.deployment == m.deployment and s.start_ts <= m.minute < s.end_ts), default=0.0)
        if over > 0 and split.get(PRODUCTIVE, 0.0) > 0:
            split[OVERPROVISIONED] = split[PRODUCTIVE] * over
            split[PRODUCTIVE] *= 1.0 - over
        split.pop(UNOBSERVED, None)  # the replica's telemetry decides a minute its engine did not show
        if split:
            out.append(ServingCell(m.minute, tuple(uuids or ()), split))
    return out

"""A serving replica-minute in the GPU-time ledger's terms (pure; docs/serving.md, "Ledger").

A GPU-second of a replica is productive in proportion to the goodput it served: the share of the
minute's requests that met both SLOs (the conservative Fréchet bound, measures.goodput_bounds) of
the replica's GPU-seconds is ``productive``; the rest is badput of the serving kind that explains
it: a minute without requests is the idle replica's, a minute with requests outside the SLO is the
missed SLO's. A minute whose engine exported no requests or latencies is ``unobserved`` (unknown is
not zero). The categories are the flag kinds' names, as the ledger's hardware categories are.
Hooking it into analysis/ledger.py is the ledger's business; this only answers per minute.
"""

from __future__ import annotations

from .detectors.idle_replica import KIND as IDLE_REPLICA
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

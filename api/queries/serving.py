"""Deployments for the API: stored replica-minutes -> serving measures, SLO attainment over time
and the serving findings (analysis/serving/), computed on request (docs/serving.md)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from gpufleet.analysis.serving.detectors import DeploymentView, detect_serving
from gpufleet.analysis.serving.flags import serving_minutes as _minutes
from gpufleet.analysis.serving.flags import slo_of as _slo
from gpufleet.analysis.serving.measures import per_minute_attainment, summarize
from gpufleet.settings import CostSettings
from gpufleet.storage.serving import deployment_labels, deployment_names, read_minutes


def list_deployments(session: Session, start: int, end: int, cluster: str | None,
                     cost: CostSettings) -> dict[str, Any]:
    conn = session.connection()
    pairs = deployment_names(conn, start, end, cluster)
    labels = deployment_labels(conn, pairs)
    data = []
    for c, name in pairs:
        ms = _minutes(read_minutes(conn, start, end, c, name), conn)
        slo, note = _slo(labels.get((c, name)))
        s = summarize(name, ms, slo, cost.price(c))
        item = {"cluster": c, "engine": ms[0].engine if ms else None, **s.as_dict()}
        if note:
            item["notes"] = [*s.notes, note]
        data.append(item)
    return {"start": start, "end": end, "data": data, "count": len(data)}


def one_deployment(session: Session, name: str, start: int, end: int, cluster: str | None,
                   cost: CostSettings) -> dict[str, Any] | None:
    conn = session.connection()
    rows = read_minutes(conn, start, end, cluster, name)
    if not rows:
        return None
    c = rows[0].cluster
    rows = [r for r in rows if r.cluster == c]  # a name in two clusters: the first, unless ?cluster= says
    ms = _minutes(rows, conn)
    slo, note = _slo(deployment_labels(conn, [(c, name)]).get((c, name)))
    price = cost.price(c)
    s = summarize(name, ms, slo, price)
    view = DeploymentView(name, slo, ms)
    replicas = []
    for rep, rms in view.replicas.items():
        rs = summarize(rep, rms, slo, price)
        replicas.append({"replica": rep, "node": next((r.node for r in rows if r.replica == rep), None),
                         "job_id": next((r.job_id for r in reversed(rows) if r.replica == rep), None),
                         "gpu_uuids": next((r.gpu_uuids for r in reversed(rows) if r.replica == rep), None),
                         **rs.as_dict()})
    return {"cluster": c, "deployment": name, "start": start, "end": end,
            "summary": {**s.as_dict(), **({"notes": [*s.notes, note]} if note else {})},
            "series": per_minute_attainment(ms, slo), "replicas": replicas,
            "findings": [f.as_dict() for f in detect_serving(view)]}

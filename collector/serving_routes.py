"""POST /api/v1/serving/minutes: replica-minutes of inference engines' own measures (docs/serving.md).

The agent's serving scrape (agent/sources/serving_scrape.py) sends them; the body is JSON:
``{"cluster", "node", "minutes": [{"deployment", "replica", "minute", "engine", "gpus",
"gpu_uuids"?, "job_id"?, "measures": {...}}], "deployments"?: {name: {slo labels}}}``.
Each record is checked on its own: a bad record is refused by index with its reasons and the
others are stored (200 with ``refused``); a body with nothing to store is a 422 that names every
record; a body that is not JSON is a 400. Thin: validation is ``check_minute``, storage is
storage/serving.py.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from gpufleet.collector.intake_schema import text_problem
from gpufleet.serving_expo import measures_from_json, measures_to_json
from gpufleet.serving_metrics import serving_registry
from gpufleet.storage import tokens
from gpufleet.storage.serving import write_deployment_labels, write_minutes

from .routes import collector_for

router = APIRouter()
MAX_BODY = 8 << 20
MAX_RECORDS = 20_000
_NAME_MAX = 253


def _reply(status: int, body: dict[str, Any]) -> Response:
    return Response(json.dumps(body), status_code=status, media_type="application/json")


def _name(v: Any, most: int = _NAME_MAX) -> bool:
    """A name the database stores: 1..``most`` characters, no NUL, valid UTF-8 (intake_schema's rule)."""
    return isinstance(v, str) and text_problem(v, 1, most) is None


def check_minute(rec: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """A record ready to store (measures re-encoded, refused measures left out) and what was wrong."""
    if not isinstance(rec, dict):
        return None, ["expected an object"]
    why = []
    for key in ("deployment", "replica"):
        if not _name(rec.get(key)):
            why.append(f"{key}: a string of 1..{_NAME_MAX} characters (no NUL) is required")
    minute = rec.get("minute")
    if isinstance(minute, bool) or not isinstance(minute, int) or minute < 0 or minute % 60:
        why.append("minute: epoch seconds of the minute's start (a multiple of 60) is required")
    if rec.get("engine") not in serving_registry().engines:
        why.append(f"engine: one of {sorted(serving_registry().engines)} is required")
    gpus = rec.get("gpus")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= 256:
        why.append("gpus: the replica's GPU count (0..256) is required")
    uuids = rec.get("gpu_uuids")
    if uuids is not None and (not isinstance(uuids, list) or len(uuids) > 256 or not all(_name(u) for u in uuids)):
        why.append("gpu_uuids: a list of GPU UUIDs")
    if rec.get("job_id") is not None and not _name(rec.get("job_id"), 255):
        why.append("job_id: a string of 1..255 characters")
    if why:
        return None, why
    measures, bad = measures_from_json(rec.get("measures"))
    if not measures:
        return None, [*bad, "measures: nothing to store"]
    return {**rec, "measures": measures_to_json(measures)}, bad


async def post_minutes(request: Request) -> Response:
    coll = collector_for(request.app)
    try:
        who = await coll.authorize(request.headers.get("authorization"), "agent")
    except tokens.AuthError as e:
        return _reply(e.status, {"detail": e.detail})
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            return _reply(413, {"detail": f"body exceeds {MAX_BODY} bytes: send fewer minutes per request"})
    try:
        doc = json.loads(body)
    except ValueError as e:
        return _reply(400, {"detail": f"body is not JSON: {e}"})
    if not isinstance(doc, dict) or not _name(doc.get("cluster")) or not _name(doc.get("node")):
        return _reply(400, {"detail": "body must be an object with cluster and node (strings) and minutes (a list)"})
    cluster, node = doc["cluster"], doc["node"]
    try:
        tokens.check_scope(who, cluster, node)
    except tokens.AuthError as e:
        return _reply(e.status, {"detail": e.detail})
    records = doc.get("minutes")
    if not isinstance(records, list) or len(records) > MAX_RECORDS:
        return _reply(400, {"detail": f"minutes: a list of at most {MAX_RECORDS} records is required"})
    good, refused = [], []
    for i, rec in enumerate(records):
        row, why = check_minute(rec)
        if row is not None:
            good.append({**row, "node": node})
        if why:
            name = rec.get("replica") if isinstance(rec, dict) else None
            refused.append({"index": i, "replica": name, "why": why, "stored": row is not None})
    labels = doc.get("deployments") or {}
    if not isinstance(labels, dict) or not all(_name(k) and isinstance(v, dict) for k, v in labels.items()):
        return _reply(400, {"detail": "deployments: an object of deployment name -> SLO labels"})
    if not good:
        return _reply(422, {"detail": "no record could be stored", "refused": refused})

    def store() -> int:
        with coll.engine.begin() as conn:
            n = write_minutes(conn, cluster, good)
            write_deployment_labels(conn, cluster, {k: {str(a): str(b) for a, b in v.items()}
                                                    for k, v in labels.items()})
            return n

    stored = await run_in_threadpool(store)
    return _reply(200, {"stored": stored, "refused": refused})


router.add_route("/api/v1/serving/minutes", post_minutes, methods=["POST"], include_in_schema=False)

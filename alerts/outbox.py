"""The outbox: every Slack message is a row with an idempotency key and a delivery state.

pending --claim--> sending --POST 2xx--> sent
                           --5xx/timeout/429--> pending (next_attempt_at later)
                           --4xx or too many attempts--> failed

A claim is one conditional UPDATE (only one worker wins it) that also sets a lease. The
POST happens outside any transaction; the result is committed right after it. The only
window for a duplicate is a crash between Slack accepting the POST and that commit (or a
timeout after Slack accepted it): after the lease the row is claimable again and is sent
again. That is at-least-once delivery; Slack incoming webhooks have no server-side dedup."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, and_, insert, or_, select, update

from gpufleet.alerts.config import AlertConfig
from gpufleet.alerts.ratelimit import Limiter, bucket_key
from gpufleet.alerts.transport import Transport, classify, slack_post
from gpufleet.storage.alert_models import AlertOutbox

log = logging.getLogger(__name__)
T = AlertOutbox.__table__


def enqueue(conn: Connection, *, key: str, event: str, webhook: str, payload: dict[str, Any], now: float,
            job_pk: int | None = None) -> int:
    """Insert in the caller's transaction; a duplicate key raises IntegrityError."""
    res = conn.execute(insert(T).values(
        idempotency_key=key, event=event, job_pk=job_pk, webhook_url=webhook, payload=payload, state="pending",
        attempts=0, created_at=now, next_attempt_at=now))
    return int(res.inserted_primary_key[0])  # type: ignore[index]


def due_ids(engine: Engine, now: float, limit: int = 100, grace_s: float = 0.0) -> list[int]:
    """Rows a sweeper should (re)try: pending and due (``grace_s`` late, so rows a scheduled
    retry already covers are left to it), or claimed by a worker that never finished."""
    q = (select(T.c.id).where(or_(
        and_(T.c.state == "pending", T.c.next_attempt_at <= now - grace_s),
        and_(T.c.state == "sending", T.c.claimed_until < now),
    )).order_by(T.c.id).limit(limit))
    with engine.connect() as c:
        return [int(x) for x in c.execute(q).scalars()]


@dataclass(frozen=True)
class DeliveryResult:
    state: str  # sent | failed | pending | sending | missing
    retry_in: float | None = None  # try this row again after this many seconds
    posted: bool = False


Hook = Callable[[str], None]


def deliver_one(engine: Engine, outbox_id: int, config: AlertConfig, limiter: Limiter, *,
                transport: Transport = slack_post, clock: Callable[[], float] = time.time,
                sleep: Callable[[float], None] = time.sleep, hook: Hook | None = None) -> DeliveryResult:
    d = config.delivery
    with engine.connect() as c:
        row = c.execute(select(T.c.state, T.c.webhook_url, T.c.next_attempt_at, T.c.claimed_until)
                        .where(T.c.id == outbox_id)).first()
    if row is None:
        return DeliveryResult("missing")
    now = clock()
    if row.state in ("sent", "failed"):
        return DeliveryResult(row.state)  # a redelivered task after success: nothing to do
    if row.state == "pending" and row.next_attempt_at > now:
        return DeliveryResult("pending", row.next_attempt_at - now)
    if row.state == "sending" and (row.claimed_until or 0) >= now:
        return DeliveryResult("sending", (row.claimed_until or now) - now + 0.05)

    bucket = bucket_key(row.webhook_url)
    for _ in range(10):  # bounded: each round waits at most max_inline_wait_s
        wait = limiter.acquire(bucket)
        if wait <= 0:
            break
        if wait > d.max_inline_wait_s:
            return DeliveryResult("pending", wait)
        sleep(wait)
    else:
        return DeliveryResult("pending", d.max_inline_wait_s)

    token = uuid.uuid4().hex
    now = clock()
    with engine.begin() as c:
        claimed = c.execute(update(T).where(T.c.id == outbox_id, or_(
            and_(T.c.state == "pending", T.c.next_attempt_at <= now),
            and_(T.c.state == "sending", T.c.claimed_until < now),
        )).values(state="sending", claim_token=token, claimed_until=now + d.lease_s + d.timeout_s,
                  attempts=T.c.attempts + 1)).rowcount
        if claimed != 1:
            return DeliveryResult("sending", 1.0)  # another worker won the claim
        row = c.execute(select(T.c.attempts, T.c.payload, T.c.webhook_url, T.c.idempotency_key)
                        .where(T.c.id == outbox_id)).one()
    if hook:
        hook("before_post")
    r = transport(row.webhook_url, row.payload, d.timeout_s)
    if hook:
        hook("after_post")
    out = classify(r, row.attempts, d.max_attempts, d.backoff_base_s, d.backoff_max_s)
    if out.rate_limited:
        limiter.block(bucket, out.delay_s)
    done = clock()
    values: dict[str, Any] = {"state": out.state if out.state != "retry" else "pending", "claim_token": None,
                              "claimed_until": None, "last_status": r.status,
                              "last_error": None if out.state == "sent" else (r.error or r.body or "")[:1000]}
    if out.state == "sent":
        values["sent_at"] = done
    elif out.state == "retry":
        values["next_attempt_at"] = done + out.delay_s
    with engine.begin() as c:
        n = c.execute(update(T).where(T.c.id == outbox_id, T.c.claim_token == token).values(**values)).rowcount
    if n != 1:
        log.warning("outbox %s (%s): lease expired before the result was stored", outbox_id, row.idempotency_key)
    if hook:
        hook("after_" + out.state)
    if out.state == "failed":
        log.error("alert %s: delivery failed for good after %d attempt(s): HTTP %s %s", row.idempotency_key,
                  row.attempts, r.status, r.error or r.body)
    return DeliveryResult(values["state"], out.delay_s if out.state == "retry" else None, posted=True)


def deliver_due(engine: Engine, config: AlertConfig, limiter: Limiter, *, transport: Transport = slack_post,
                deadline_s: float = 30.0, clock: Callable[[], float] = time.time,
                sleep: Callable[[float], None] = time.sleep) -> dict[str, int]:
    """In-process sweeper (``gpufleet up``): deliver every due row once, within a time budget.
    Rows still pending are picked up by the next call."""
    end = time.monotonic() + deadline_s
    counts: dict[str, int] = {}
    for oid in due_ids(engine, clock(), limit=500):
        if time.monotonic() > end:
            break
        res = deliver_one(engine, oid, config, limiter, transport=transport, clock=clock, sleep=sleep)
        counts[res.state] = counts.get(res.state, 0) + 1
    return counts

"""Delivery against a real local HTTP server standing in for Slack: 429 with Retry-After, 500,
timeouts and permanent errors. Every case ends with exactly one delivered message per
notification (or a row marked failed for permanent errors), and payloads within limits."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import select, update

from gpufleet.alerts import outbox
from gpufleet.alerts.config import AlertConfig, Delivery
from gpufleet.alerts.ratelimit import MemoryLimiter
from gpufleet.storage.alert_models import AlertOutbox

T = AlertOutbox.__table__
FAST = Delivery(rate_per_s=20.0, burst=2, timeout_s=1.0, max_attempts=6, backoff_base_s=0.05, backoff_max_s=0.2,
                max_inline_wait_s=0.5, lease_s=1.0)


def cfg(url: str, **kw: Any) -> AlertConfig:
    return AlertConfig(default_webhook=url, delivery=Delivery(**{**FAST.__dict__, **kw}))


def put(engine: Any, url: str, n: int = 1, prefix: str = "k") -> list[int]:
    ids = []
    with engine.begin() as c:
        for i in range(n):
            ids.append(outbox.enqueue(c, key=f"{prefix}{i}", event="firing", webhook=url, now=time.time(),
                                      payload={"text": f"message {prefix}{i}", "blocks": []}))
    return ids


def drain(engine: Any, config: AlertConfig, limiter: Any = None, timeout: float = 20.0) -> dict[str, int]:
    """Run the in-process sweeper until nothing is pending or sending (bounded)."""
    limiter = limiter or MemoryLimiter(config.delivery.rate_per_s, config.delivery.burst)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        outbox.deliver_due(engine, config, limiter, deadline_s=5)
        with engine.connect() as c:
            states = [s for (s,) in c.execute(select(T.c.state))]
        if all(s in ("sent", "failed") for s in states):
            return {s: states.count(s) for s in set(states)}
        time.sleep(0.02)
    raise AssertionError("outbox did not drain")


@pytest.mark.parametrize("script", [
    [],
    [429],
    [500, 502, 503],
    ["timeout"],
    [429, 500, "timeout", 500],
], ids=["ok", "429", "5xx", "timeout", "mixed"])
def test_each_failure_mode_ends_in_exactly_one_delivery(engine, fake_slack, script) -> None:  # type: ignore[no-untyped-def]
    fake_slack.script = list(script)
    fake_slack.retry_after = "0.4"
    fake_slack.hang_s = 1.6
    put(engine, fake_slack.url)
    assert drain(engine, cfg(fake_slack.url)) == {"sent": 1}
    assert len(fake_slack.delivered()) == 1
    assert len(fake_slack.posts) == len(script) + 1
    with engine.connect() as c:
        row = c.execute(select(T)).one()
    assert row.attempts == len(script) + 1 and row.sent_at is not None and row.last_status == 200


def test_retry_after_is_honoured(engine, fake_slack) -> None:  # type: ignore[no-untyped-def]
    fake_slack.script = [429]
    fake_slack.retry_after = "1"
    put(engine, fake_slack.url)
    drain(engine, cfg(fake_slack.url))
    first, second = fake_slack.posts
    assert second.ts - first.ts >= 0.95


def test_many_notifications_each_delivered_once_at_the_rate_limit(engine, fake_slack) -> None:  # type: ignore[no-untyped-def]
    fake_slack.script = [200, 500, 429, 200, "timeout"]
    fake_slack.retry_after = "0.2"
    fake_slack.hang_s = 1.6
    put(engine, fake_slack.url, n=8)
    c = cfg(fake_slack.url, rate_per_s=10.0, burst=2)
    assert drain(engine, c) == {"sent": 8}
    texts = sorted(p.body["text"] for p in fake_slack.delivered())
    assert texts == sorted(f"message k{i}" for i in range(8))  # each exactly once
    ts = sorted(p.ts for p in fake_slack.posts)
    # 8 sends + 3 retries = 11 posts; after a burst of 2, at most 10/s
    assert ts[-1] - ts[0] >= (len(ts) - 2) / 10.0 - 0.05


def test_permanent_error_is_not_retried_and_stays_visible(engine, fake_slack) -> None:  # type: ignore[no-untyped-def]
    fake_slack.script = [404]
    put(engine, fake_slack.url)
    assert drain(engine, cfg(fake_slack.url)) == {"failed": 1}
    assert len(fake_slack.posts) == 1
    with engine.connect() as c:
        row = c.execute(select(T)).one()
    assert row.last_status == 404 and "no_service" in row.last_error


def test_gives_up_after_max_attempts(engine, fake_slack) -> None:  # type: ignore[no-untyped-def]
    fake_slack.script = [500] * 10
    put(engine, fake_slack.url)
    assert drain(engine, cfg(fake_slack.url, max_attempts=3)) == {"failed": 1}
    assert len(fake_slack.posts) == 3


def test_sent_row_is_never_sent_again(engine, fake_slack) -> None:  # type: ignore[no-untyped-def]
    (oid,) = put(engine, fake_slack.url)
    c = cfg(fake_slack.url)
    lim = MemoryLimiter(100, 10)
    assert outbox.deliver_one(engine, oid, c, lim).state == "sent"
    # a redelivered Celery message, a sweeper, a second worker: all no-ops now
    for _ in range(3):
        assert outbox.deliver_one(engine, oid, c, lim).state == "sent"
    assert outbox.deliver_due(engine, c, lim) == {}
    assert len(fake_slack.posts) == 1


def test_claim_abandoned_by_a_crashed_worker_is_sent_after_the_lease(engine, fake_slack) -> None:  # type: ignore[no-untyped-def]
    (oid,) = put(engine, fake_slack.url)
    now = time.time()
    # a lease long enough that a stalled CI box still asks while it is held (0.5 s was not)
    with engine.begin() as c:  # what a worker that died between claim and POST leaves behind
        c.execute(update(T).where(T.c.id == oid).values(state="sending", claim_token="dead", attempts=1,
                                                         claimed_until=now + 1.5))
    c = cfg(fake_slack.url)
    lim = MemoryLimiter(100, 10)
    r = outbox.deliver_one(engine, oid, c, lim)
    assert r.state == "sending" and 0 < r.retry_in <= 1.6  # someone holds the lease: wait
    assert fake_slack.posts == []
    time.sleep(r.retry_in)
    assert outbox.deliver_one(engine, oid, c, lim).state == "sent"
    assert len(fake_slack.delivered()) == 1


def test_concurrent_deliverers_post_once(engine, fake_slack) -> None:  # type: ignore[no-untyped-def]
    import threading

    ids = put(engine, fake_slack.url, n=4)
    c = cfg(fake_slack.url)
    lim = MemoryLimiter(100, 10)
    ts = [threading.Thread(target=lambda: [outbox.deliver_one(engine, i, c, lim) for i in ids]) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert len(fake_slack.posts) == 4

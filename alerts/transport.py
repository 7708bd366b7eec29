"""One HTTP POST to a Slack incoming webhook, and what its outcome means (pure ``classify``).

``slack_sdk.webhook.WebhookClient`` does the POST with its own retry handlers switched off:
retries belong to the outbox, which persists them, not to an in-memory loop."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class PostResult:
    status: int | None  # None: no HTTP answer (timeout, refused, DNS)
    body: str = ""
    retry_after: float | None = None
    error: str | None = None


class Transport(Protocol):
    def __call__(self, url: str, payload: dict[str, Any], timeout: float) -> PostResult: ...


def slack_post(url: str, payload: dict[str, Any], timeout: float) -> PostResult:
    from slack_sdk.webhook import WebhookClient

    client = WebhookClient(url, timeout=timeout, retry_handlers=[])  # type: ignore[arg-type]
    try:
        r = client.send_dict(payload)
    except Exception as e:  # timeouts and connection errors: no answer, retry later
        return PostResult(None, error=f"{type(e).__name__}: {e}"[:500])
    ra = None
    for k, v in (r.headers or {}).items():
        if k.lower() == "retry-after":
            v = v[0] if isinstance(v, list) else v
            try:
                ra = float(v)
            except (TypeError, ValueError):
                ra = None
    return PostResult(r.status_code, (r.body or "")[:500], ra)


@dataclass(frozen=True)
class Outcome:
    state: str  # sent | retry | failed
    delay_s: float = 0.0
    rate_limited: bool = False


def backoff(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with +-20 % jitter so a fleet of retries does not stampede."""
    d = min(cap, base * (2 ** max(0, attempt - 1)))
    return d * (0.8 + 0.4 * (rng or random).random())


def classify(r: PostResult, attempt: int, max_attempts: int, base: float, cap: float) -> Outcome:
    if r.status is not None and 200 <= r.status < 300:
        return Outcome("sent")
    if r.status == 429:
        # Slack says when; bounded so a bogus header cannot park a message for days.
        delay = min(max(r.retry_after if r.retry_after is not None else 1.0, 0.0), 3600.0)
        if attempt >= max_attempts * 3:  # 429s are not the message's fault: allow more of them
            return Outcome("failed")
        return Outcome("retry", delay, rate_limited=True)
    retryable = r.status is None or r.status >= 500 or r.status == 408
    if not retryable or attempt >= max_attempts:
        # 400 invalid_payload, 403 action_prohibited, 404 no_service, 410 channel_is_archived:
        # retrying cannot help; the row stays in the outbox as failed for an operator to see.
        return Outcome("failed")
    return Outcome("retry", backoff(attempt, base, cap))

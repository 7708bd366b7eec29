"""Deliver spooled batches to the collector, oldest first, with the retry policy of the
ingest contract:

* 200                     stored (or a duplicate): forget the batch; side records the
                          collector refused alone (``refused``) go to the dead-letter dir's
                          refused.jsonl and are counted (gpufleet_agent_records_refused)
* 401/403, 404/405, 409  configuration error (token; URL; node name clash): log loudly, keep
                          the batch, retry with backoff (the batch is fine; the setup is not)
* 429 (+ Retry-After)     wait as told (capped), then retry the same batch
* any other 4xx           permanent: dead-letter it with the server's reason, move on (a 4xx
                          says the batch itself can never be stored: retrying it would block
                          every batch behind it)
* 503 (+ Retry-After)     wait as told (capped), then retry the same batch
* other 5xx, no answer    exponential backoff with full jitter, then retry the same batch
"""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
from dataclasses import dataclass
from enum import Enum

import httpx

from .spool import Spool, SpoolItem

log = logging.getLogger(__name__)

PERMANENT = frozenset({400, 413, 415, 422})  # the usual ones; every 4xx not below is permanent too
AUTH = frozenset({401, 403, 404, 405, 409})  # 409: another node reports our GPUs; 404/405: wrong --url (config errors)
THROTTLE = frozenset({429, 503})
CLOCK_SKEW_WARN_S = 60.0


class Outcome(Enum):
    SENT = "sent"
    DEAD = "dead_letter"
    AUTH = "auth"
    THROTTLED = "throttled"
    FAILED = "failed"


@dataclass(slots=True)
class Result:
    outcome: Outcome
    status: int | None = None
    detail: str = ""
    retry_after: float | None = None
    stored: int = 0
    duplicate: bool = False
    refused: list[dict[str, object]] | None = None  # side records refused alone (partial acceptance)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        if isinstance(body, dict) and "detail" in body:
            return str(body["detail"])[:2000]
    except ValueError:
        pass
    return resp.text[:2000]


class Backoff:
    """Exponential backoff with full jitter (AWS architecture blog), reset on success."""

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        self.base, self.cap = base, cap
        self.attempt = 0
        self.rng = rng or random.Random()

    def next(self) -> float:
        ceiling = min(self.cap, self.base * 2**self.attempt)
        self.attempt = min(self.attempt + 1, 32)
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0


class Sender:
    def __init__(self, spool: Spool, url: str, *, token: str | None, timeout_s: float = 10.0,
                 backoff_base_s: float = 1.0, backoff_max_s: float = 60.0, retry_after_max_s: float = 300.0,
                 metrics: object | None = None, client: httpx.Client | None = None) -> None:
        self.spool = spool
        self.url = url.rstrip("/") + "/api/v1/ingest"
        self.token = token
        self.client = client or httpx.Client(timeout=timeout_s)
        self.backoff = Backoff(backoff_base_s, backoff_max_s)
        self.retry_after_max_s = retry_after_max_s
        self.metrics = metrics
        self.wake = threading.Event()
        self._last_auth_log = 0.0
        self._down_since: float | None = None
        self.stopping = False  # at shutdown an unreachable collector is expected, not news
        self.dead_lettered = 0  # batches refused for good since start (`agent --once` exits 1 on any)
        self.clock_skew_s: float | None = None
        self._last_skew_log = -1e18

    # --- one attempt ---------------------------------------------------------------------

    def post(self, item: SpoolItem) -> Result:
        try:
            header, body = item.read()
        except (OSError, ValueError) as e:
            # Unreadable spool file (disk error, truncated by hand): nothing to retry.
            return Result(Outcome.DEAD, None, f"spool file unreadable: {e}")
        headers = dict(header.get("headers") or {})  # type: ignore[call-overload]
        headers["Idempotency-Key"] = str(header.get("key", ""))
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            try:
                resp = self.client.post(self.url, content=body, headers=headers)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                # The server closed a kept-alive connection just as we reused it: not an outage.
                # A close shows as "disconnected without sending a response", or, when our body
                # was still unread in its socket, as a reset (ECONNRESET on read, EPIPE on
                # write). Retry once on a fresh connection; the Idempotency-Key makes a repeat
                # harmless. Connect errors and timeouts are not retried here: those are outages.
                resp = self.client.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as e:
            return Result(Outcome.FAILED, None, f"{type(e).__name__}: {e}")
        status = resp.status_code
        self._check_clock(resp.headers.get("Date"))
        if status == 200:
            try:
                ans = resp.json()
            except ValueError:
                ans = {}
            if not isinstance(ans, dict):
                ans = {}
            refused = ans.get("refused")
            return Result(Outcome.SENT, status, stored=int(ans.get("stored", 0) or 0),
                          duplicate=bool(ans.get("duplicate", False)),
                          refused=[r for r in refused if isinstance(r, dict)] if isinstance(refused, list) else None)
        if status in AUTH:
            return Result(Outcome.AUTH, status, _detail(resp))
        if status in THROTTLE:
            return Result(Outcome.THROTTLED, status, _detail(resp),
                          retry_after=parse_retry_after(resp.headers.get("Retry-After"), time.time()))
        if status in PERMANENT or 400 <= status < 500:
            return Result(Outcome.DEAD, status, _detail(resp))
        return Result(Outcome.FAILED, status, _detail(resp))

    def _keep_refused(self, item: SpoolItem, refused: list[dict[str, object]]) -> None:
        target = self.spool.dead_letter_records(item, refused)
        first = refused[0].get("detail")
        log.error("collector stored batch %s but refused %d side record(s) for good (first: %s): kept in %s",
                  item.path.name, len(refused), first, target)
        m = self.metrics
        if m and hasattr(m, "refused"):
            by: dict[str, int] = {}
            for r in refused:
                by[str(r.get("part"))] = by.get(str(r.get("part")), 0) + 1
            for section, n in by.items():
                m.refused(section, n)

    def _check_clock(self, date: str | None) -> None:
        """The collector refuses samples too far in the future or past: a skewed node clock
        would turn into dead letters, so say so early (HTTP Date has 1 s resolution)."""
        if not date:
            return
        try:
            server = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            return
        skew = time.time() - server
        self.clock_skew_s = skew
        if abs(skew) > CLOCK_SKEW_WARN_S and time.monotonic() - self._last_skew_log > 3600:
            self._last_skew_log = time.monotonic()
            log.warning("this node's clock is %+.0f s off the collector's: fix NTP (the collector rejects samples "
                        "more than a few minutes in the future)", skew)

    def send_one(self) -> tuple[Result, float] | None:
        """Try the oldest spooled batch once; returns (result, seconds to wait before the
        next try), or None when the spool is empty."""
        item = self.spool.peek()
        if item is None:
            return None
        r = self.post(item)
        m = self.metrics
        if m:
            m.skew(self.clock_skew_s)  # type: ignore[attr-defined]
        if r.outcome is Outcome.SENT:
            if r.refused:
                self._keep_refused(item, r.refused)
            self.spool.ack(item)
            self.backoff.reset()
            if self._down_since is not None:
                log.info("collector %s reachable again after %.0f s; %d batches still spooled",
                         self.url, time.monotonic() - self._down_since, len(self.spool))
                self._down_since = None
            if m:
                m.sent(item.rows, r.duplicate)  # type: ignore[attr-defined]
            return r, 0.0
        if r.outcome is Outcome.DEAD:
            target = self.spool.dead_letter(item, r.status or 0, r.detail)
            log.error("collector rejected batch %s for good (HTTP %s: %s): dead-lettered to %s",
                      item.path.name, r.status, r.detail, target)
            self.dead_lettered += 1
            if m:
                m.dead_lettered(item.rows)  # type: ignore[attr-defined]
            return r, 0.0
        self.spool.release()
        if m:
            m.send_failed(r.outcome.value)  # type: ignore[attr-defined]
        if r.outcome is Outcome.AUTH:
            delay = self.backoff.next()
            now = time.monotonic()
            if now - self._last_auth_log > 60:
                self._last_auth_log = now
                what = ("refused our token (HTTP %s: %s): check --token / GPUFLEET_AGENT_TOKEN" if r.status != 409
                        else "reports a conflict (HTTP %s: %s): check --node / --cluster")
                log.error("collector %s " + what + "; keeping %d batches spooled in %s", self.url, r.status, r.detail,
                          len(self.spool), self.spool.dir)
            return r, delay
        if r.outcome is Outcome.THROTTLED and r.retry_after is not None:
            return r, min(r.retry_after, self.retry_after_max_s)
        delay = self.backoff.next()
        if self._down_since is None:
            self._down_since = time.monotonic()
            say = log.debug if self.stopping else log.warning
            say("collector %s unavailable (%s%s): spooling to %s (%d batches, %.1f MiB of %.0f MiB)",
                self.url, f"HTTP {r.status}: " if r.status else "", r.detail, self.spool.dir,
                len(self.spool), self.spool.pending_bytes / 2**20, self.spool.max_bytes / 2**20)
        return r, delay

    # --- loops ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Background loop: send whenever something is spooled, waiting as the policy says."""
        while not stop.is_set():
            got = self.send_one()
            if got is None:
                self.wake.wait(1.0)
                self.wake.clear()
                continue
            _, delay = got
            if delay > 0:
                stop.wait(delay)

    def drain(self, deadline_s: float) -> int:
        """Send what is spooled until empty, a failure, or the deadline; returns batches sent
        (stored or a duplicate; a dead-lettered batch is not sent, and the loop goes on past it)."""
        end = time.monotonic() + deadline_s
        n = 0
        while time.monotonic() < end:
            got = self.send_one()
            if got is None:
                break
            r, _ = got
            if r.outcome not in (Outcome.SENT, Outcome.DEAD):
                break
            n += r.outcome is Outcome.SENT
        return n

    def close(self) -> None:
        self.client.close()

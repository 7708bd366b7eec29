"""Silences and read models shared by the API and the CLI (database wrappers, validated)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, insert, select, update

from gpufleet.alerts.config import FLAG_KINDS
from gpufleet.storage.alert_models import Alert, AlertOutbox, AlertSilence
from gpufleet.storage.models import Cluster, Job

S, A, OB = AlertSilence.__table__, Alert.__table__, AlertOutbox.__table__
MAX_SILENCE_S = 90 * 86400.0  # a forgotten silence must not hide a job forever
MAX_ID = 2**31 - 1  # alert_silences.id is a 32-bit INTEGER on PostgreSQL
MATCHER_MAX = {"job": 255, "user": 255, "flag": 32, "cluster": 128}  # the alert_silences columns


class SilenceError(ValueError):
    pass


@dataclass(frozen=True)
class NewSilence:
    reason: str
    duration_s: float
    job: str | None = None
    user: str | None = None
    kind: str | None = None
    cluster: str | None = None

    def validate(self) -> None:
        for name, value in (("job", self.job), ("user", self.user), ("flag", self.kind), ("cluster", self.cluster),
                            ("reason", self.reason)):
            # PostgreSQL cannot store NUL in text, and no scheduler id or user name holds a
            # control character: refuse them here rather than fail (500) in the database.
            if value is not None and any(ord(c) < 32 and c not in "\t\n" for c in value):
                raise SilenceError(f"{name} contains a NUL or other control character; remove it")
            if value is not None and not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise SilenceError(f"{name} is not valid UTF-8 text (a lone surrogate)") from None
            if value is not None and name != "reason" and len(value) > MATCHER_MAX[name]:
                raise SilenceError(f"{name} is longer than {MATCHER_MAX[name]} characters")
        if not any((self.job, self.user, self.kind, self.cluster)):
            raise SilenceError("give at least one matcher: job, user, flag or cluster (an empty silence would mute "
                               "everything)")
        if self.kind is not None and self.kind not in FLAG_KINDS:
            raise SilenceError(f"unknown flag {self.kind!r}; known: {', '.join(FLAG_KINDS)}")
        if not self.reason.strip():
            raise SilenceError("a reason is required (it shows up for the next person wondering why it's quiet)")
        if not 0 < self.duration_s <= MAX_SILENCE_S:
            raise SilenceError(f"expiry must be in the future and at most {MAX_SILENCE_S / 86400:.0f} days away")


def create_silence(engine: Engine, s: NewSilence, created_by: str, now: float) -> dict[str, Any]:
    s.validate()
    with engine.begin() as c:
        pk = c.execute(insert(S).values(job=s.job, user=s.user, kind=s.kind, cluster=s.cluster,
                                        reason=s.reason.strip()[:2000], created_by=created_by[:128],
                                        created_at=now, expires_at=now + s.duration_s)).inserted_primary_key
        if pk is None:  # a single-row INSERT always has one; SQLAlchemy types it Optional (executemany has none)
            raise RuntimeError("the silence INSERT returned no primary key")
        sid = pk[0]
    return get_silence(engine, int(sid))  # type: ignore[return-value]  # just inserted, in a committed transaction


def get_silence(engine: Engine, sid: int) -> dict[str, Any] | None:
    if not 0 < sid <= MAX_ID:
        return None
    with engine.connect() as c:
        r = c.execute(select(S).where(S.c.id == sid)).first()
    return dict(r._mapping) if r else None


def list_silences(engine: Engine, now: float, include_expired: bool = False) -> list[dict[str, Any]]:
    q = select(S).order_by(S.c.id.desc()).limit(1000)
    if not include_expired:
        q = q.where(S.c.expires_at > now)
    with engine.connect() as c:
        return [dict(r._mapping) | {"active": r.expires_at > now} for r in c.execute(q)]


def expire_silence(engine: Engine, sid: int, now: float) -> bool:
    if not 0 < sid <= MAX_ID:  # an id no row can have; the database would overflow (500) on it
        return False
    with engine.begin() as c:
        return c.execute(update(S).where(S.c.id == sid, S.c.expires_at > now).values(expires_at=now)).rowcount == 1


def list_alerts(engine: Engine, state: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
    q = (select(A, Job.job_id, Job.user, Cluster.name.label("cluster")).join(Job, Job.id == A.c.job_pk)
         .join(Cluster, Cluster.id == Job.cluster_id).order_by(A.c.id.desc()).limit(limit))
    if state:
        q = q.where(A.c.state == state)
    with engine.connect() as c:
        return [dict(r._mapping) for r in c.execute(q)]


def mask(url: str) -> str:
    """Webhook URLs are secrets: show where they point, not the token."""
    head, _, tail = url.rpartition("/")
    return f"{head}/…{tail[-4:]}" if head else "…"


def list_outbox(engine: Engine, state: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
    q = select(OB.c.id, OB.c.idempotency_key, OB.c.event, OB.c.job_pk, OB.c.webhook_url, OB.c.state, OB.c.attempts,
               OB.c.created_at, OB.c.next_attempt_at, OB.c.sent_at, OB.c.last_status, OB.c.last_error
               ).order_by(OB.c.id.desc()).limit(limit)
    if state:
        q = q.where(OB.c.state == state)
    with engine.connect() as c:
        return [dict(r._mapping) | {"webhook_url": mask(r.webhook_url)} for r in c.execute(q)]


def retry_failed(engine: Engine, now: float) -> int:
    """Operator action after fixing a webhook: failed rows go back to pending (same key)."""
    with engine.begin() as c:
        return c.execute(update(OB).where(OB.c.state == "failed").values(state="pending", attempts=0,
                                                                       next_attempt_at=now)).rowcount

"""Alert tables (issue 7). Defined on the shared ``Base`` so migrations and the schema test
see them; imported at the end of ``storage/models.py``.

- ``alert_groups``: one row per job that ever notified; ``notify_seq`` numbers the job's
  messages and feeds the idempotency key, so two evaluators racing produce the same key and
  the outbox's unique constraint lets only one of them win.
- ``alerts``: one row per (job, flag kind): pending (matched but silenced/inhibited, never
  sent) -> firing -> resolved.
- ``alert_silences``: matchers (job, user, flag, cluster; ANDed) with expiry and reason.
- ``alert_outbox``: every Slack message to send, keyed by its idempotency key, with a
  delivery state (pending -> sending -> sent | failed). Written in the same transaction
  as the lifecycle change that caused it, so a notification is never lost.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Double, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.storage.models import Base


class AlertGroup(Base):
    __tablename__ = "alert_groups"
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # firing | resolved
    notify_seq: Mapped[int] = mapped_column(Integer, default=0)
    first_fired_at: Mapped[float] = mapped_column(Double)
    last_notified_at: Mapped[float] = mapped_column(Double)
    resolved_at: Mapped[float | None] = mapped_column(Double)


class Alert(Base):
    __tablename__ = "alerts"
    __table_args__ = (
        UniqueConstraint("job_pk", "kind", name="uq_alerts_job_kind"),
        Index("ix_alerts_state", "state"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16))  # pending | firing | resolved
    severity: Mapped[str] = mapped_column(String(16))
    scopes: Mapped[list[str] | None] = mapped_column(JSON)
    wasted_gpu_hours: Mapped[float] = mapped_column(Double, default=0.0)
    suppressed_by: Mapped[str | None] = mapped_column(String(255))  # "silence:<id>" | "inhibited:<node>"
    first_seen_at: Mapped[float] = mapped_column(Double)
    fired_at: Mapped[float | None] = mapped_column(Double)
    last_notified_at: Mapped[float | None] = mapped_column(Double)
    resolved_at: Mapped[float | None] = mapped_column(Double)


class AlertSilence(Base):
    __tablename__ = "alert_silences"
    __table_args__ = (Index("ix_alert_silences_expires_at", "expires_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job: Mapped[str | None] = mapped_column(String(255))  # scheduler job id
    user: Mapped[str | None] = mapped_column(String(255))
    kind: Mapped[str | None] = mapped_column(String(32))  # flag kind
    cluster: Mapped[str | None] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)


class AlertOutbox(Base):
    __tablename__ = "alert_outbox"
    __table_args__ = (
        UniqueConstraint("idempotency_key", name="uq_alert_outbox_idempotency_key"),
        Index("ix_alert_outbox_state_next", "state", "next_attempt_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(String(255))
    event: Mapped[str] = mapped_column(String(16))  # firing | reminder | resolved | digest
    job_pk: Mapped[int | None] = mapped_column(Integer)  # no FK: the record outlives a purged job
    webhook_url: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column()
    state: Mapped[str] = mapped_column(String(16))  # pending | sending | sent | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Double)
    next_attempt_at: Mapped[float] = mapped_column(Double)
    claim_token: Mapped[str | None] = mapped_column(String(64))
    claimed_until: Mapped[float | None] = mapped_column(Double)
    sent_at: Mapped[float | None] = mapped_column(Double)
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)

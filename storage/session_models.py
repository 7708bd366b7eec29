"""The ``web_sessions`` table: browser sign-ins (docs/api.md, "Signing in"). Defined on the
shared ``Base`` so migrations and the schema test see it; imported at the end of
``storage/models.py``. Only the SHA-256 of a session id is stored, like tokens."""

from __future__ import annotations

from sqlalchemy import Double, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.storage.models import Base


class WebSession(Base):
    __tablename__ = "web_sessions"
    __table_args__ = (Index("ix_web_sessions_expires_at", "expires_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(255))  # the token's name, or the SSO user
    role: Mapped[str] = mapped_column(String(16))
    cluster: Mapped[str | None] = mapped_column(String(128))
    source: Mapped[str] = mapped_column(String(16))  # "token" (signed in with one) | "sso" (trusted proxy)
    # A session made from a token dies with it: revoking the token ends the sign-in too.
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"))
    created_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)

"""Bearer tokens: created once (the raw value is shown once), stored as SHA-256, verified in
constant time, scoped to a role and optionally to a cluster and a node.

Roles are ordered ``viewer < operator < admin`` for reading and operating; ``agent`` only
writes (ingest), and an agent token may be pinned to a cluster and a node so a compromised
node cannot write as another one. ``admin`` may do everything, including writing."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, insert, select, update

from gpufleet.storage.models import ApiToken

ROLES = ("agent", "viewer", "operator", "admin")
TOKEN_PREFIX = "gpf_"
# Verified tokens are cached this long: revocation takes effect within it, and a busy
# collector does not hit the database on every request.
CACHE_TTL_S = 5.0
_NAME_MAX = 128


@dataclass(frozen=True)
class TokenInfo:
    name: str
    role: str
    cluster: str | None
    node: str | None


ANONYMOUS = TokenInfo("anonymous", "admin", None, None)


class AuthError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def role_at_least(have: str, need: str) -> bool:
    """Whether a token of role ``have`` may do what needs ``need``."""
    if have not in ROLES or need not in ROLES:
        return False
    if need == "agent":
        return have in ("agent", "admin")
    if have == "agent":  # agents write telemetry, they never read it
        return False
    return ROLES.index(have) >= ROLES.index(need)


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def create_token(engine: Engine, name: str, role: str, cluster: str | None = None, node: str | None = None) -> str:
    """Create a token and return its raw value (shown once; only its hash is stored)."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    if not name or len(name) > _NAME_MAX or any(ord(ch) < 32 for ch in name):
        raise ValueError(f"token name must be 1-{_NAME_MAX} characters, without control characters")
    if node is not None and role != "agent":
        raise ValueError("--node only applies to agent tokens")
    if cluster is not None and role not in ("agent", "viewer"):
        raise ValueError(f"--cluster applies to agent and viewer tokens: what an {role} does is not cluster-scoped, "
                         "so the token would reach every cluster; create it without --cluster")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as c:
        exists = c.execute(select(ApiToken.id).where(ApiToken.name == name)).first()
        if exists:
            raise ValueError(f"a token named {name!r} already exists (revoke it or pick another name)")
        c.execute(insert(ApiToken).values(name=name, token_hash=_hash(raw), role=role, cluster=cluster,
                                          node=node, created_at=time.time(), revoked_at=None))
    _cache_clear()
    return raw


def list_tokens(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as c:
        rows = c.execute(select(ApiToken.name, ApiToken.role, ApiToken.cluster, ApiToken.node,
                                ApiToken.created_at, ApiToken.revoked_at).order_by(ApiToken.name)).all()
    return [dict(r._mapping) for r in rows]


def revoke_token(engine: Engine, name: str) -> bool:
    if not name or len(name) > _NAME_MAX or "\x00" in name:  # no token has such a name (PostgreSQL refuses NUL)
        return False
    with engine.begin() as c:
        n = c.execute(update(ApiToken).where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
                      .values(revoked_at=time.time())).rowcount
    _cache_clear()
    return bool(n)


# --- verification ------------------------------------------------------------------------

_cache: dict[tuple[int, str], tuple[float, TokenInfo | None]] = {}
_cache_lock = threading.Lock()


def _cache_clear() -> None:
    with _cache_lock:
        _cache.clear()


def verify_token(engine: Engine, raw: str) -> TokenInfo | None:
    """The token's identity, or None when it is unknown or revoked."""
    if not raw or len(raw) > 512:
        return None
    digest = _hash(raw)
    key = (id(engine), digest)
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None and now - hit[0] < CACHE_TTL_S:
        return hit[1]
    with engine.connect() as c:
        row = c.execute(select(ApiToken.name, ApiToken.role, ApiToken.cluster, ApiToken.node, ApiToken.token_hash,
                               ApiToken.revoked_at).where(ApiToken.token_hash == digest)).first()
    info: TokenInfo | None = None
    # The lookup is by hash (an index probe, whose timing reveals nothing about the raw
    # token); the explicit constant-time compare guards against any collation surprise.
    if row is not None and row.revoked_at is None and hmac.compare_digest(row.token_hash, digest):
        info = TokenInfo(row.name, row.role, row.cluster, row.node)
    with _cache_lock:
        if len(_cache) > 10_000:
            _cache.clear()
        _cache[key] = (now, info)
    return info


def unsupported_scope(info: TokenInfo, cluster_scope: str | None = None) -> str | None:
    """Why a stored token cannot be used for this request, or None. A viewer token with a
    cluster reads only requests the web layer narrowed to that cluster (``cluster_scope``,
    ``api.auth.cluster_scope``); an operator/admin token with one (made before ``--cluster`` was
    refused for them) was meant to be limited, but what operators do is not cluster-scoped:
    refused rather than let it reach every cluster."""
    if info.role == "agent" or info.cluster is None:
        return None
    if info.role == "viewer":
        if cluster_scope == info.cluster:
            return None
        return (f"token {info.name!r} reads only cluster {info.cluster!r}, and this endpoint is not a per-cluster "
                "read (docs/api.md, Token scope)")
    return (f"token {info.name!r} ({info.role}) was created for cluster {info.cluster!r}, but {info.role} tokens "
            "cannot be limited to a cluster; an admin revokes it and creates one without --cluster")


def authorize(engine: Engine, authorization_header: str | None, required: str, allow_anonymous: bool,
              identity: TokenInfo | None = None, cluster_scope: str | None = None) -> TokenInfo:
    """Check an ``Authorization`` header for role ``required``; raises AuthError(401/403).
    ``identity`` is who the web layer already knows is calling without a header (a signed-in
    session or a trusted SSO proxy, ``api.auth``); it wins over anonymous access. ``cluster_scope``:
    the cluster the web layer narrowed this request to, for a cluster-scoped viewer."""
    if not authorization_header and identity is not None:
        why = unsupported_scope(identity, cluster_scope)
        if why is not None:
            raise AuthError(403, why)
        if not role_at_least(identity.role, required):
            raise AuthError(403, f"{identity.name} is signed in as {identity.role}; this needs {required}")
        return identity
    if not authorization_header:
        if allow_anonymous:
            return ANONYMOUS
        raise AuthError(401, "missing bearer token; create one with `gpufleet token create`")
    scheme, _, raw = authorization_header.partition(" ")
    raw = raw.strip()
    if scheme.lower() != "bearer" or not raw:
        raise AuthError(401, "Authorization must be 'Bearer <token>'")
    info = verify_token(engine, raw)
    if info is None:
        raise AuthError(401, "unknown or revoked token")
    why = unsupported_scope(info, cluster_scope)
    if why is not None:
        raise AuthError(403, why)
    if not role_at_least(info.role, required):
        raise AuthError(403, f"token {info.name!r} has role {info.role}; this needs {required}")
    return info


def check_scope(info: TokenInfo, cluster: str, node: str) -> None:
    """A scoped token may only write as its own cluster/node; raises AuthError(403)."""
    if info.cluster is not None and info.cluster != cluster:
        raise AuthError(403, f"token {info.name!r} may write cluster {info.cluster!r}, not {cluster!r}")
    if info.node is not None and info.node != node:
        raise AuthError(403, f"token {info.name!r} may write node {info.node!r}, not {node!r}")


EMBEDDED_AGENTS_PREFIX = "gpufleet-up-agents-"


def mint_embedded_agent_token(engine: Engine, now: float | None = None) -> str:
    """A fresh agent token for the agents ``gpufleet up`` runs in its own process, so they store
    data whether or not anonymous access is on (it is off off-loopback). The previous run's
    tokens are revoked: only the live process knows the raw value, so nothing else could use them."""
    now = time.time() if now is None else now
    with engine.begin() as c:
        c.execute(update(ApiToken).where(ApiToken.name.startswith(EMBEDDED_AGENTS_PREFIX),
                                         ApiToken.revoked_at.is_(None)).values(revoked_at=now))
    _cache_clear()
    return create_token(engine, f"{EMBEDDED_AGENTS_PREFIX}{time.time_ns()}", "agent")

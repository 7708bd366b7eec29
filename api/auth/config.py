"""Settings of the browser-facing auth layer, parsed: the server Settings' ``auth`` section holds
them as plain strings (``GPUFLEET_ALLOWED_HOSTS``, ``GPUFLEET_TRUSTED_PROXIES``, ...); this turns
them into networks, a group->role map and lower-cased header names, with errors that name the
variable. ``from_env`` reads the same variables directly (for a Settings without the fields)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gpufleet.storage.tokens import ROLES

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _split(raw: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (raw or "").split(",") if p.strip())


def parse_group_roles(raw: str) -> dict[str, str]:
    """``"ml-platform=admin,oncall=operator,*=viewer"`` -> {group: role}; ``*`` = any signed-in user."""
    out: dict[str, str] = {}
    for part in _split(raw):
        group, sep, role = part.rpartition("=")
        if not sep or not group.strip():
            raise ValueError(f"GPUFLEET_PROXY_GROUP_ROLES: {part!r} is not group=role")
        role = role.strip()
        if role not in ROLES or role == "agent":
            raise ValueError(f"GPUFLEET_PROXY_GROUP_ROLES: role {role!r} must be viewer, operator or admin")
        out[group.strip()] = role
    return out


@dataclass(frozen=True)
class WebAuthConfig:
    # Host names the server answers to for requests without a bearer token (browsers). IP literals
    # always pass (DNS rebinding needs a name); "*" turns the check off; ".example.com" = subdomains.
    allowed_hosts: tuple[str, ...] = ()
    session_ttl_s: float = 12 * 3600.0
    # "auto": Secure cookies when the request came over HTTPS (directly or per a trusted proxy).
    cookie_secure: str = "auto"
    trusted_proxies: tuple[Network, ...] = ()
    proxy_user_header: str = "x-forwarded-user"
    proxy_email_header: str = "x-forwarded-email"
    proxy_groups_header: str = "x-forwarded-groups"
    group_roles: dict[str, str] = field(default_factory=dict)
    # the host of public_url and the listen address join allowed_hosts
    implied_hosts: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Any) -> WebAuthConfig:
        """From the settings' ``auth`` section (the same GPUFLEET_* variables), parsed and checked;
        from the environment when the section predates these fields."""
        auth = getattr(settings, "auth", None)
        if auth is None or not hasattr(auth, "trusted_proxies"):
            return cls.from_env(settings=settings)
        values = {"GPUFLEET_ALLOWED_HOSTS": auth.allowed_hosts, "GPUFLEET_SESSION_TTL_S": str(auth.session_ttl_s),
                  "GPUFLEET_COOKIE_SECURE": auth.cookie_secure, "GPUFLEET_TRUSTED_PROXIES": auth.trusted_proxies,
                  "GPUFLEET_PROXY_USER_HEADER": auth.proxy_user_header,
                  "GPUFLEET_PROXY_EMAIL_HEADER": auth.proxy_email_header,
                  "GPUFLEET_PROXY_GROUPS_HEADER": auth.proxy_groups_header,
                  "GPUFLEET_PROXY_GROUP_ROLES": auth.proxy_group_roles}
        return cls.from_env(values, settings=settings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, settings: Any = None) -> WebAuthConfig:
        e = os.environ if env is None else env
        nets = []
        for p in _split(e.get("GPUFLEET_TRUSTED_PROXIES")):
            try:
                nets.append(ipaddress.ip_network(p, strict=False))
            except ValueError:
                raise ValueError(f"GPUFLEET_TRUSTED_PROXIES: {p!r} is not an address or CIDR network") from None
        ttl = float(e.get("GPUFLEET_SESSION_TTL_S") or cls.session_ttl_s)
        if ttl <= 0:
            raise ValueError("GPUFLEET_SESSION_TTL_S must be > 0")
        secure = (e.get("GPUFLEET_COOKIE_SECURE") or "auto").strip().lower()
        if secure not in ("auto", "true", "false"):
            raise ValueError("GPUFLEET_COOKIE_SECURE must be auto, true or false")
        implied: list[str] = []
        if settings is not None:
            http = getattr(settings, "http", settings)
            public = getattr(http, "public_url", "") or ""
            if public:
                host = urlsplit(public).hostname
                if host:
                    implied.append(host)
            bind = getattr(http, "host", "") or ""
            if bind and bind not in ("0.0.0.0", "::"):
                implied.append(bind)
        return cls(allowed_hosts=tuple(h.lower() for h in _split(e.get("GPUFLEET_ALLOWED_HOSTS"))),
                   session_ttl_s=ttl, cookie_secure=secure, trusted_proxies=tuple(nets),
                   proxy_user_header=(e.get("GPUFLEET_PROXY_USER_HEADER") or cls.proxy_user_header).lower(),
                   proxy_email_header=(e.get("GPUFLEET_PROXY_EMAIL_HEADER") or cls.proxy_email_header).lower(),
                   proxy_groups_header=(e.get("GPUFLEET_PROXY_GROUPS_HEADER") or cls.proxy_groups_header).lower(),
                   group_roles=parse_group_roles(e.get("GPUFLEET_PROXY_GROUP_ROLES") or ""),
                   implied_hosts=tuple(h.lower() for h in implied))

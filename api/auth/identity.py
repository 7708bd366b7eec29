"""Who is calling when no bearer token is sent: a trusted SSO proxy's headers, or a session
cookie. Pure functions over headers and config; the session lookup itself is storage's."""

from __future__ import annotations

import ipaddress
from http.cookies import CookieError, SimpleCookie

from gpufleet.storage.tokens import ROLES, TokenInfo

from .config import WebAuthConfig

SESSION_COOKIE = "gpufleet_session"
CSRF_COOKIE = "gpufleet_csrf"  # readable by the page's script, which echoes it in X-CSRF-Token
CSRF_HEADER = "x-csrf-token"


def cookies(header: str | None) -> dict[str, str]:
    if not header:
        return {}
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return {}
    return {k: m.value for k, m in jar.items()}


def from_trusted_proxy(client_ip: str | None, cfg: WebAuthConfig) -> bool:
    if not client_ip or not cfg.trusted_proxies:
        return False
    try:
        ip = ipaddress.ip_address(client_ip)
    except ValueError:
        return False
    return any(ip in net for net in cfg.trusted_proxies)


class SsoRefused(Exception):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def role_for_groups(groups: list[str], mapping: dict[str, str]) -> str | None:
    """The highest role any of the user's groups maps to (``*`` matches everyone), or None."""
    best: str | None = None
    for g in [*groups, "*"]:
        r = mapping.get(g)
        if r is not None and (best is None or ROLES.index(r) > ROLES.index(best)):
            best = r
    return best


def sso_identity(client_ip: str | None, headers: dict[str, str], cfg: WebAuthConfig) -> TokenInfo | None:
    """The SSO user, when the request comes from a configured proxy address and carries its user
    headers. Headers from anyone else are ignored (never trusted), so a client cannot claim a
    user by sending X-Forwarded-User itself. Raises SsoRefused when no group maps to a role."""
    if not from_trusted_proxy(client_ip, cfg):
        return None
    user = (headers.get(cfg.proxy_email_header) or headers.get(cfg.proxy_user_header) or "").strip()
    if not user:
        return None
    if len(user) > 255 or any(ord(c) < 32 for c in user):
        raise SsoRefused("the proxy's user header is not a usable name")
    raw_groups = headers.get(cfg.proxy_groups_header) or ""
    groups = [g.strip() for g in raw_groups.split(",") if g.strip()]
    role = role_for_groups(groups, cfg.group_roles)
    if role is None:
        raise SsoRefused(f"signed in as {user} through the SSO proxy, but none of your groups "
                         f"({', '.join(groups) or 'none'}) maps to a gpufleet role (GPUFLEET_PROXY_GROUP_ROLES)")
    return TokenInfo(user, role, None, None)

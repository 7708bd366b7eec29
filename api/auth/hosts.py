"""Pure decisions about a request's Host and Origin (no I/O; tested on their own).

DNS rebinding: a page on evil.example re-points its name at 127.0.0.1 and reads the local
server as same-origin; the browser then sends ``Host: evil.example``. Refusing unknown names
stops it. IP literals cannot be rebound, so they always pass (kubelet probes, Prometheus).

Cross-site writes: a page elsewhere can POST ``text/plain`` (a "simple" request, no preflight)
to any address the browser reaches, and the browser sends ``Origin`` (or at least
``Sec-Fetch-Site``) with it. A state-changing request whose origin is not this server's is refused.
"""

from __future__ import annotations

import ipaddress
import socket
from functools import lru_cache
from urllib.parse import urlsplit

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# "testserver": Starlette's TestClient default. A single-label name no public DNS serves, so no
# rebinding attacker can make a browser send it; the tests of every part use it.
ALWAYS = ("localhost", "localhost.", "testserver")


@lru_cache(maxsize=1)
def machine_names() -> tuple[str, ...]:
    names = {socket.gethostname().lower()}
    try:
        names.add(socket.getfqdn().lower())
    except OSError:  # no resolver: the short name is enough
        pass
    return tuple(sorted(n for n in names if n))


def split_host(host_header: str) -> tuple[str, str | None]:
    """``"Example.com:8000"`` -> ("example.com", "8000"); ``"[::1]:80"`` -> ("::1", "80")."""
    h = host_header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        if end < 0:
            return h, None
        rest = h[end + 1:]
        return h[1:end], rest[1:] if rest.startswith(":") else None
    name, sep, port = h.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        return name, port
    return h, None


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_allowed(host_header: str | None, allowed: tuple[str, ...], implied: tuple[str, ...] = ()) -> bool:
    if host_header is None:
        return True  # browsers always send Host; a request without one is not a rebinding attack
    if not host_header.strip():
        return False
    name, _ = split_host(host_header)
    if not name or is_ip(name):
        return bool(name)
    if "*" in allowed:
        return True
    for a in (*allowed, *implied, *ALWAYS, *machine_names()):
        if a.startswith(".") and (name.endswith(a) or name == a[1:]):
            return True
        if name == a or name == a.rstrip("."):
            return True
    return False


def cross_site(method: str, host_header: str | None, origin: str | None, sec_fetch_site: str | None) -> str | None:
    """Why a state-changing request is cross-site (refuse it), or None. Requests without
    Origin or Sec-Fetch-Site (curl, agents, scripts) are not from a browser page: they pass."""
    if method.upper() not in UNSAFE_METHODS:
        return None
    if origin is not None:
        o = origin.strip().lower()
        if o == "null":
            return "Origin null (a sandboxed or file: page)"
        parts = urlsplit(o)
        if not parts.scheme or not parts.netloc:
            return f"malformed Origin {origin!r}"
        if host_header is None or _same_authority(parts.scheme, parts.netloc, host_header) is False:
            return f"Origin {origin} is not this server ({host_header})"
        return None
    if sec_fetch_site is not None and sec_fetch_site.strip().lower() == "cross-site":
        return "Sec-Fetch-Site: cross-site"
    return None


def _same_authority(scheme: str, netloc: str, host_header: str) -> bool:
    default = "443" if scheme == "https" else "80"
    on, op = split_host(netloc)
    hn, hp = split_host(host_header)
    return on == hn and (op or default) == (hp or default)

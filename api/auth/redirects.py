"""Where the sign-in page may send the browser afterwards (``/signin?next=...``): a path on this
origin, or ``/``. Pure; the page's script applies the same rule again (``signin.js``).

Browsers are lenient where this must be strict: they drop tabs and newlines anywhere in a URL
(``/\\t/evil`` becomes ``//evil``, another host), read ``\\`` as ``/`` and ignore leading
spaces. So anything with a control character, a space or a backslash is refused outright, not
cleaned, and what is left must be a path that does not start with ``//``."""

from __future__ import annotations

from urllib.parse import urlsplit

HOME = "/"


def safe_next(target: str | None) -> str:
    """``target`` when it is a same-origin path (with its query), else ``/``."""
    if not target or len(target) > 2048 or not target.startswith("/") or target.startswith("//"):
        return HOME
    if any(ord(ch) <= 0x20 or ch in "\\\x7f" for ch in target):
        return HOME
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/"):
        return HOME
    return target

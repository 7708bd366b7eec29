"""Escaping and truncation for Slack mrkdwn and Block Kit limits.

Anything a user controls (job name, user, account, partition, evidence strings) goes through
``esc`` or ``code``: Slack parses ``<...>`` as links and mentions (``<!channel>``,
``<@U123>``, ``<https://evil|click>``), so ``& < >`` become entities, as Slack's formatting
guide asks. Plain words like ``@channel`` are broken with a zero-width space in case a webhook
enables ``link_names``."""

from __future__ import annotations

import re

ZWSP = "\u200b"
_BROADCAST = re.compile(r"@(channel|here|everyone)\b", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

# Block Kit limits (https://docs.slack.dev/reference/block-kit/blocks)
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_FIELD_TEXT = 2000
MAX_FIELDS = 10
MAX_HEADER_TEXT = 150
MAX_CONTEXT_ELEMENTS = 10
MAX_BUTTON_TEXT = 75
MAX_URL = 3000
MAX_FALLBACK_TEXT = 3000  # Slack truncates top-level text at 40k; keep notifications short


def esc(s: object) -> str:
    t = _CONTROL.sub(" ", str(s))
    t = t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _BROADCAST.sub(lambda m: "@" + ZWSP + m.group(1), t)


def code(s: object, limit: int = 200) -> str:
    """User text shown verbatim in an inline code span: no formatting, no auto-linked URLs.
    Backticks would close the span, so they become a look-alike."""
    t = esc(truncate(str(s).replace("\n", " "), limit)).replace("`", "ˋ")
    return f"`{t}`" if t else "`-`"


def plain(s: object, limit: int) -> str:
    """For ``plain_text`` objects: not parsed as mrkdwn, only control characters and length."""
    return truncate(_BROADCAST.sub(lambda m: "@" + ZWSP + m.group(1), _CONTROL.sub(" ", str(s))), limit)


def truncate(s: str, limit: int) -> str:
    if len(s) <= limit:
        return s
    cut = s[: max(0, limit - 1)]
    # don't leave half an entity (&am…) behind
    amp = cut.rfind("&")
    if amp != -1 and ";" not in cut[amp:] and len(cut) - amp < 6:
        cut = cut[:amp]
    return cut + "…"


"""Credentials out of URLs before they are logged or returned.

`redis://:secret@host:6379/0` becomes `redis://:***@host:6379/0`, `https://user:pw@h/` becomes
`https://user:***@h/`, and a lone userinfo (`https://token@h/`, often a secret itself) becomes
`https://***@h/`. `redact_text` does this to every URL inside a longer text (an error message, a
log line); `redact_event` is the structlog processor that applies it to every logged string.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

_MASK = "***"
# scheme://userinfo@ — userinfo runs up to the last '@' before the host's path, query or space.
_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<info>[^\s/?#@]*(?:@[^\s/?#@]*)*)@"
)


def _mask(match: re.Match[str]) -> str:
    user, sep, _ = match["info"].partition(":")
    hidden = f"{user}:{_MASK}" if sep else _MASK
    return f"{match['scheme']}{hidden}@"


def redact_text(text: str) -> str:
    """`text` with the password (or lone userinfo) of every URL in it replaced by ***."""
    if "@" not in text:
        return text
    return _USERINFO.sub(_mask, text)


def redact_url(url: str) -> str:
    return redact_text(url)


def redact_event(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: redact URL credentials in every string value of a log event."""
    for name, value in event.items():
        if isinstance(value, str) and "@" in value:
            event[name] = redact_text(value)
    return event

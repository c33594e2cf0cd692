"""Signatures on the thinking blocks the Messages API returns, so that only reasoning this gateway
produced for the same API key is trusted when a client sends it back in a later turn.

A signature is `gwt1.` + base64url(HMAC-SHA256(secret, key_id NUL text)). The secret comes from
settings (`GATEWAY_MESSAGES__SIGNING_SECRET`); without one a random secret is drawn per process,
so blocks signed before a restart or by another replica are then dropped (never refused).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

_MARK = "gwt1."


def is_gateway_signature(signature: str) -> bool:
    """Whether `signature` has this gateway's form (whichever secret or key made it)."""
    return signature.startswith(_MARK)


class ThinkingSigner:
    def __init__(self, secret: bytes | None = None) -> None:
        self.ephemeral = secret is None
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def sign(self, key_id: str, text: str) -> str:
        digest = hmac.new(
            self._secret, key_id.encode() + b"\0" + text.encode(), hashlib.sha256
        ).digest()
        return _MARK + base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def verify(self, key_id: str, text: str, signature: str) -> bool:
        """Whether `signature` is this gateway's for `text` under `key_id`."""
        if not signature.startswith(_MARK):
            return False
        return hmac.compare_digest(self.sign(key_id, text), signature)

"""A key's routing policy: what it may ask of thinking and of providers.

Stored with the key (`policy` in its record, managed by the admin API and CLI) and carried on
the Principal. `thinking`: "off" and "on" force the mode on every model; "auto" leaves it to
the model (the client's switch is refused); "client" lets the client's explicit switch win, else
the model decides. `max_reasoning_tokens` caps reasoning (enforced exactly by the local engine).
`providers`: "local" keeps the key on the local engine (never an upstream), "any" allows both.
`default_model`: served when a request names no model or one this gateway does not serve.
"""

from __future__ import annotations

from typing import Literal

from plumbing.record import record

ThinkingPolicy = Literal["off", "auto", "on", "client"]
ProviderPolicy = Literal["local", "any"]


@record
class KeyPolicy:
    thinking: ThinkingPolicy = "client"
    max_reasoning_tokens: int | None = None
    providers: ProviderPolicy = "any"
    default_model: str | None = None

    def may_use(self, is_local: bool) -> bool:
        return is_local or self.providers == "any"


DEFAULT_POLICY = KeyPolicy()

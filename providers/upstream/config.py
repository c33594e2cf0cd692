"""The settings of one upstream provider, as `OpenAIUpstream` (and `AnthropicUpstream`) take them.

The gateway builds `UpstreamConfig` from its `ProviderSettings` (providers/ does not import the
gateway): name = the provider's key in settings, base_url, api_key = settings.api_key(),
thinking_style, send_reasoning_history, the timeouts, max_connections, headers, stream_upstream
the HTTP client's bounds and fim map one to one; `proxy` is the provider's own proxy setting or,
when it has none, the one the environment names for base_url (HTTPS_PROXY, NO_PROXY: resolved by the
gateway, which reads the environment); the remaining fields keep their defaults unless the gateway
has better.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field

from plumbing.record import record
from providers.upstream.openai_wire import FimStyle, ThinkingStyle


@record
class UpstreamConfig:
    """`models`: the model ids `models()` lists without asking the upstream (empty: ask)."""

    name: str
    base_url: str  # ends before "/chat/completions", e.g. "https://api.deepseek.com/v1"
    api_key: str | None = field(default=None, repr=False)
    # Several accounts of this upstream, (identity, key) each: a conversation keeps to one
    # (providers/upstream/affinity.py), so the upstream's prefix cache serves its later turns.
    accounts: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    thinking_style: ThinkingStyle = "deepseek"
    send_reasoning_history: bool = False
    connect_timeout_s: float = 10.0
    first_byte_timeout_s: float = 120.0
    idle_timeout_s: float = 120.0
    answer_timeout_s: float = 600.0
    models_timeout_s: float = 10.0
    health_timeout_s: float = 3.0
    max_connections: int = 256
    headers: Mapping[str, str] = field(default_factory=dict)
    models: tuple[str, ...] = ()
    stream_upstream: bool = False  # stream from the upstream for JSON clients too
    # The HTTP client (providers/transport/http1.py): what an answer may hold, how long an idle
    # pooled connection is kept, TCP keepalive's idle time (0: off), and the egress proxy (an
    # http://[user:password@]host:port URL; None: direct), for every call to this upstream.
    max_answer_headers: int = 128
    max_header_field_bytes: int = 8192
    max_answer_bytes: int = 64 << 20
    pool_idle_timeout_s: float = 15.0
    tcp_keepalive_s: float = 30.0
    proxy: str | None = field(default=None, repr=False)
    fim: FimStyle = "suffix"  # how it takes fill-in-the-middle requests (openai_wire.FimStyle)
    # A PEM file of the certificate authorities an https upstream is verified against, in place
    # of the system's (None: the system's, which SSL_CERT_FILE and SSL_CERT_DIR may point at).
    ca_file: str | None = None
    total_timeout_s: float = 1800.0  # the most a whole answer may take, however it streams

"""The providers, the models and their routes: `[providers.NAME]`, `[models."NAME"]`, and the
built-in upstream presets (enabled when their key is in the environment)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from gateway.config.frozen import FROZEN
from providers.transport.http1_proxy import Proxy, proxy_for
from providers.upstream.openai_wire import FimStyle, ThinkingStyle

RoutingMode = Literal["static", "auto", "shadow"]


class ProviderSettings(BaseModel):
    """One configured provider. `kind = "openai"`: an upstream speaking the OpenAI API;
    `kind = "anthropic"`: one speaking the Anthropic Messages API (base_url before /v1/messages);
    `kind = "local"`: the embedded DeepSeek-V3.1 engine."""

    model_config = FROZEN
    kind: Literal["openai", "anthropic", "local"] = Field(
        default="openai",
        description="`openai`: an upstream speaking the OpenAI API; `anthropic`: one speaking "
        "the Anthropic Messages API; `local`: the embedded engine (`[engine]`).",
    )
    base_url: str = Field(
        default="",
        description="The upstream's base URL, http:// or https:// (OpenAI kind: up to and "
        "including `/v1`; Anthropic kind: before `/v1/messages`). Unused by `local`.",
    )
    api_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the upstream's key (keys never "
        "live in the TOML file).",
    )
    api_key_envs: tuple[str, ...] = Field(
        default=(),
        description="Further accounts of the same upstream (environment variables holding "
        "their keys): a conversation keeps to one account, by a hash of its first messages.",
    )
    enabled: bool = Field(default=True, description="false: the provider is not opened.")
    thinking_style: ThinkingStyle = Field(
        default="deepseek",
        description="How the upstream takes the thinking switch: `deepseek` "
        '(`thinking: {"type": ...}`), `chat_template_kwargs` (vLLM/SGLang), '
        "`reasoning_effort` (OpenAI), `none` (never sent).",
    )
    send_reasoning_history: bool = Field(
        default=False,
        description="Whether earlier assistant reasoning is sent back upstream in the history.",
    )
    connect_timeout_s: float = Field(
        default=10.0, gt=0, description="Seconds to open the TCP (and TLS) connection."
    )
    first_byte_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="A streamed request: seconds from sending it until the first data frame "
        "(keep-alive comments do not count).",
    )
    idle_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="A streamed answer: the longest wait for its next data event (keep-alive "
        "comments do not count).",
    )
    total_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="The most one answer from this provider may take, from the request to its "
        "last byte, however it streams: a stream kept open by comments, or trickling data, is "
        "cut off here (an error event after the first token, else the next route is tried).",
    )
    answer_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="A non-streamed upstream request (a JSON client's, unless "
        "`stream_upstream`): seconds until its whole answer is read.",
    )
    stream_upstream: bool = Field(
        default=False,
        description="Stream from the upstream for JSON clients too: a stalled upstream is "
        "found by the first-byte and idle timeouts, at the CPU cost of parsing every chunk.",
    )
    max_connections: int = Field(
        default=256, gt=0, description="Kept-alive upstream connections pooled per process."
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra HTTP headers sent with every upstream request."
    )
    ca_file: Path | None = Field(
        default=None,
        description="A PEM file of the certificate authorities this https upstream's "
        "certificate is verified against, in place of the system's (a private CA). Unset: the "
        "system's trust store, or the file SSL_CERT_FILE names.",
    )
    direct_models: tuple[str, ...] = Field(
        default=(),
        description="Provider-side model names or glob patterns (`deepseek-*`, `*`) that "
        "clients may address directly as `<provider>/<model>`; empty: only the configured "
        "models reach this provider.",
    )
    proxy: str | None = Field(
        default=None,
        description="The egress proxy for every call to this upstream. Unset: the one the "
        "environment names (HTTPS_PROXY for an https base_url, HTTP_PROXY for an http one, "
        'lower-case names first, unless NO_PROXY covers the host); "direct": none, whatever '
        "the environment says; else an http://[user:password@]host:port URL (https is tunnelled "
        "with CONNECT; credentials are sent as Proxy-Authorization: Basic and never logged).",
    )
    busy_wait: bool = Field(
        default=False,
        description="Poll for this upstream's answers instead of sleeping, as [server] "
        "busy_wait_us says (it costs up to that much CPU per request): worth it only for an "
        "engine next door that answers within tens of microseconds, never over the internet.",
    )
    max_answer_headers: int = Field(
        default=128,
        gt=0,
        description="The most header fields an answer of this upstream may have; beyond it "
        "the request fails with a 502.",
    )
    max_header_field_bytes: int = Field(
        default=8192,
        gt=0,
        description="The longest header field (name and value) an answer may have; beyond it "
        "the request fails with a 502.",
    )
    max_answer_bytes: int = Field(
        default=64 << 20,
        gt=0,
        description="The largest answer body, after decoding gzip or deflate; beyond it (a "
        "decompression bomb) the request fails with a 502.",
    )
    pool_idle_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="An idle pooled connection to this upstream is closed after this many "
        "seconds unused (NATs and load balancers drop idle connections silently).",
    )
    tcp_keepalive_s: float = Field(
        default=30.0,
        ge=0,
        description="TCP keepalive on connections to this upstream: the first probe after "
        "this many idle seconds, then every third of it, 3 unanswered close it. 0: off.",
    )
    fim: FimStyle = Field(
        default="suffix",
        description="How this upstream takes fill-in-the-middle (code completion) requests: "
        '"suffix" (OpenAI style, `suffix` on its /completions), "deepseek_beta" (DeepSeek\'s '
        '/beta/completions, in place of the base URL\'s /v1), or "none" (the router skips it '
        'for them). Kind "openai" only: the local engine always can, Messages APIs never.',
    )

    @model_validator(mode="after")
    def _check(self) -> ProviderSettings:
        if self.kind != "local" and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"an {self.kind} provider needs base_url starting with http:// or https://"
            )
        if self.proxy is not None and self.proxy != "direct":
            Proxy.parse(self.proxy)  # a ValueError that leaves the credentials out
        return self

    def proxy_url(self, environ: Mapping[str, str]) -> str | None:
        """The proxy URL for this provider's calls (None: direct), from `proxy` or `environ`."""
        if self.proxy == "direct":
            return None
        url = self.proxy if self.proxy is not None else proxy_for(self.base_url, environ)
        if url is None:
            return None
        return url.strip() if "://" in url else f"http://{url.strip()}"

    def key_envs(self) -> tuple[str, ...]:
        """The environment variables that hold this provider's keys, the main one first."""
        return ((self.api_key_env,) if self.api_key_env else ()) + self.api_key_envs

    def api_key(self) -> str | None:
        """The upstream key, read from the environment when asked (never stored here)."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def accounts(self) -> tuple[tuple[str, str], ...]:
        """(environment variable, key) of every account whose key is set, the main one first."""
        return tuple((n, os.environ[n]) for n in self.key_envs() if os.environ.get(n))


class RouteSettings(BaseModel):
    model_config = FROZEN
    provider: str = Field(description="A configured provider's name, or a preset's.")
    model: str = Field(description="The model's name at that provider.")
    thinking: bool | None = Field(
        default=None,
        description="Force DeepSeek thinking on (true) or off (false) on this route; unset: "
        "the client's choice, or the routing decision.",
    )


class ModelSettings(BaseModel):
    model_config = FROZEN
    routes: tuple[RouteSettings, ...] = Field(
        description="The routes, in order: when one fails before the first token reached the "
        "client, the next is tried."
    )
    owned_by: str = Field(default="gateway", description="`owned_by` in /v1/models.")
    max_output_tokens: int | None = Field(
        default=None,
        gt=0,
        description="The most tokens the model produces in one answer (reasoning included): "
        "what a request without max_tokens reserves. Unset: a local engine's context length "
        "minus the prompt, else `limits.default_max_tokens`.",
    )
    default_max_tokens: int | None = Field(
        default=None,
        gt=0,
        description="A cap sent upstream for requests that set no max_tokens (at most "
        "`max_output_tokens`). Unset: none is sent, and the answer may run to the model's own "
        "limit.",
    )
    routing: RoutingMode = Field(
        default="static",
        description="`static`: the routes as listed, thinking as the route forces or the client "
        "asks; `auto`: thinking and local or upstream decided per request (`[routing]`); "
        "`shadow`: decided like `auto` and reported, but served as `static`.",
    )
    gates_readiness: bool = Field(
        default=False,
        description="Whether /readyz answers 503 while every route of this model is failing. "
        "Off: a failing model is reported in /readyz's body, the metrics and the console, but "
        "the process stays ready (a provider down on every replica must not take the healthy "
        "models and the local engine out of the load balancer with it).",
    )

    @field_validator("routes")
    @classmethod
    def _non_empty(cls, v: tuple[RouteSettings, ...]) -> tuple[RouteSettings, ...]:
        if not v:
            raise ValueError("a model needs at least one route")
        return v

    @model_validator(mode="after")
    def _cap_within_limit(self) -> ModelSettings:
        limit, cap = self.max_output_tokens, self.default_max_tokens
        if limit is not None and cap is not None and cap > limit:
            raise ValueError(f"default_max_tokens {cap} exceeds max_output_tokens {limit}")
        return self


# Built-in upstreams, enabled only when their key is in the environment.
PRESETS: dict[str, ProviderSettings] = {
    "taotoken": ProviderSettings(
        kind="openai",
        base_url="https://taotoken.net/api/v1",
        api_key_env="TAOTOKEN_API_KEY",
        direct_models=("*",),  # a model marketplace: it checks the names itself
    ),
    "deepseek": ProviderSettings(
        kind="openai",
        base_url="https://api.deepseek.com/v1",
        api_key_env="DEEPSEEK_API_KEY",
        direct_models=("deepseek-*",),
        fim="deepseek_beta",
    ),
    "openai": ProviderSettings(
        kind="openai",
        base_url="https://api.openai.com/v1",
        api_key_env="OPENAI_API_KEY",
        thinking_style="reasoning_effort",
        direct_models=("gpt-*", "o[0-9]*", "chatgpt-*"),
    ),
}

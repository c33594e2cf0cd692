"""Typed, frozen settings: `settings.toml` overridden by `GATEWAY_*` environment variables.

Precedence (highest first): environment (`GATEWAY_SERVER__PORT=9000`), the TOML file, defaults.
Secrets never live in the TOML file: providers name the environment variable holding their key
(`api_key_env`), and the admin key comes from `GATEWAY_ADMIN__API_KEY`.
"""

from __future__ import annotations

import os
import re
import ssl
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.config.cluster import ClusterSettings
from gateway.config.engine import EngineSettings
from gateway.config.frozen import FROZEN
from gateway.config.process import LoggingSettings, RedisSettings, ServerSettings
from gateway.config.providers import PRESETS, ModelSettings, ProviderSettings
from gateway.config.routing import RoutingSettings
from gateway.config.usage import UsageSettings
from providers.transport.http1_proxy import Proxy

# The longest path a unix socket may have on Linux (sun_path is 108 bytes, NUL included).
_MAX_SOCKET_PATH = 107


class AdminSettings(BaseModel):
    model_config = FROZEN
    api_key: SecretStr | None = Field(
        default=None,
        description="Bearer token of the admin API (environment only: "
        "`GATEWAY_ADMIN__API_KEY`). Unset: every /admin request is a 403 `admin_disabled`.",
    )
    console: bool = Field(
        default=True,
        description="Serve the admin console in the browser at /admin/ui (only while an "
        "admin key is set; it signs in with that key).",
    )
    session_ttl_s: int = Field(
        default=8 * 3600,
        ge=60,
        le=30 * 86400,
        description="How long a console session lasts after sign-in (seconds); sessions live in "
        "Redis under the key prefix and end at sign-out.",
    )
    login_attempts_per_minute: int = Field(
        default=10,
        ge=1,
        le=10000,
        description="Console sign-in attempts allowed per client address in any 60 seconds (a "
        "sliding window); more are refused with 429.",
    )


class AuthSettings(BaseModel):
    model_config = FROZEN
    enabled: bool = Field(
        default=True,
        description="false: no API keys, limits or usage records (only behind your own "
        "authentication).",
    )


class LimitSettings(BaseModel):
    model_config = FROZEN
    default_max_tokens: int = Field(
        default=4096,
        gt=0,
        description="Completion tokens reserved for a request without max_tokens on a model "
        "whose output limit is unknown (no `max_output_tokens`, no local engine). Never sent "
        "upstream as a cap.",
    )
    usage_stream_maxlen: int = Field(
        default=1_000_000,
        gt=0,
        description="Most per-request usage records the Redis usage stream keeps (the oldest "
        "are trimmed).",
    )
    slot_lease_s: float = Field(
        default=15.0,
        ge=1,
        description="A request's concurrency slot and reservation are a lease of this many "
        "seconds, renewed while it runs: capacity held by a replica that died or lost Redis "
        "comes back this soon.",
    )
    spool_dir: Path = Field(
        default=Path(".data/spool"),
        description="Settlements Redis could not take are appended (fsync'd) here and replayed "
        "at recovery and at the next start.",
    )


class MessagesSettings(BaseModel):
    """The Anthropic Messages API (`/v1/messages`)."""

    model_config = FROZEN
    signing_secret: SecretStr | None = Field(
        default=None,
        description="HMAC secret signing thinking blocks (environment only: "
        "`GATEWAY_MESSAGES__SIGNING_SECRET`; the same on every replica). Unset: a random one "
        "per process (shared by its workers), so signatures do not survive a restart or cross "
        "replicas.",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    server: ServerSettings = Field(
        default=ServerSettings(),
        description="The HTTP server: address, timeouts for slow clients, streams, processes.",
    )
    redis: RedisSettings = Field(
        default=RedisSettings(),
        description="The Redis that holds keys, limits, usage, stickiness and the cluster index.",
    )
    logging: LoggingSettings = Field(default=LoggingSettings(), description="Log format and level.")
    admin: AdminSettings = Field(default=AdminSettings(), description="The admin API (/admin).")
    auth: AuthSettings = Field(default=AuthSettings(), description="API keys on the public API.")
    limits: LimitSettings = Field(
        default=LimitSettings(),
        description="Reservations, leases and the durability of usage accounting.",
    )
    engine: EngineSettings = Field(
        default=EngineSettings(),
        description="The embedded DeepSeek-V3.1 engine, used by providers of kind `local`.",
    )
    cluster: ClusterSettings = Field(
        default=ClusterSettings(),
        description="Several nodes (gateway and engine) sharing one Redis, each request served "
        "where its prompt's prefix is cached.",
    )
    providers: dict[str, ProviderSettings] = Field(
        default_factory=dict,
        description="Providers by name. The presets `taotoken` (https://taotoken.net/api/v1, "
        "`TAOTOKEN_API_KEY`, any model addressable), `deepseek` (https://api.deepseek.com/v1, "
        "`DEEPSEEK_API_KEY`, `deepseek-*`) and `openai` (https://api.openai.com/v1, "
        "`OPENAI_API_KEY`, `gpt-*`, `o[0-9]*`, `chatgpt-*`) are added when their key is set "
        "(see `use_presets`); a provider of the same name here replaces the preset.",
    )
    models: dict[str, ModelSettings] = Field(
        default_factory=dict, description="Public models by id: what /v1/models lists."
    )
    routing: RoutingSettings = Field(
        default=RoutingSettings(),
        description="Routing of auto models: rules, the scorer, breakers, stickiness, overflow.",
    )
    model_patterns: dict[str, str] = Field(
        default_factory=dict,
        description="Client model ids served as a configured model: fnmatch pattern -> model "
        'id, first match wins (`"claude-*haiku*" = "deepseek-chat"`). Usage, quotas and a '
        "key's model list count the configured model; the answer echoes the id asked for.",
    )
    messages: MessagesSettings = Field(
        default=MessagesSettings(), description="The Anthropic Messages API (/v1/messages)."
    )
    usage: UsageSettings = Field(
        default=UsageSettings(),
        description="The SQL usage store: where usage records are kept and queried, retention, "
        "prices.",
    )
    use_presets: bool = Field(
        default=True,
        description="Add the built-in TaoToken, DeepSeek and OpenAI providers whose key's "
        "environment variable is set.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The TOML file arrives as init kwargs; the environment overrides it.
        return env_settings, init_settings

    @model_validator(mode="after")
    def _routes_name_providers(self) -> Settings:
        for model_id, model in self.models.items():
            for route in model.routes:
                if route.provider not in self.providers and route.provider not in PRESETS:
                    raise ValueError(
                        f"model {model_id!r} routes to unknown provider {route.provider!r}"
                    )
        for pattern, target in self.model_patterns.items():
            if target not in self.models:
                raise ValueError(f"model pattern {pattern!r} names unknown model {target!r}")
        return self

    @model_validator(mode="after")
    def _upstreams_reachable(self) -> Settings:
        """Every live upstream's keys can go in a header, and its proxy can be used: said now,
        naming the provider and the variable (never a key), not as a 500 per request."""
        for name, provider in self.live_providers()[0].items():
            if provider.kind == "local":
                continue
            for env in provider.key_envs():
                problem = header_value_problem(os.environ.get(env) or "")
                if problem:
                    raise ValueError(
                        f"provider {name!r}: the key in environment variable {env} {problem}; "
                        "an HTTP header cannot carry it (check for a trailing newline)"
                    )
            for header, value in provider.headers.items():
                problem = header_value_problem(value)
                if not _TOKEN.fullmatch(header):
                    problem = "has a name that is not an HTTP token"
                if problem:  # the value is never repeated: it may be a secret
                    raise ValueError(
                        f"provider {name!r}: the header {header!r} in `headers` {problem}; "
                        "an HTTP header cannot carry it"
                    )
            if provider.ca_file is not None:
                try:
                    ssl.create_default_context(cafile=provider.ca_file)
                except (OSError, ssl.SSLError) as exc:
                    raise ValueError(
                        f"provider {name!r}: ca_file {str(provider.ca_file)!r} is not a readable "
                        f"PEM file of certificates ({exc})"
                    ) from None
            if provider.proxy is None:
                try:
                    url = provider.proxy_url(os.environ)
                    if url is not None:
                        Proxy.parse(url)
                except ValueError as exc:
                    raise ValueError(
                        f"provider {name!r}: the proxy in the environment (HTTPS_PROXY / "
                        f"HTTP_PROXY) is unusable: {exc}"
                    ) from None
        return self

    @model_validator(mode="after")
    def _usage_needs_auth(self) -> Settings:
        # On by default, where there are keys; asked for without them it is a mistake.
        asked = "enabled" in self.usage.model_fields_set
        if asked and self.usage.enabled and not self.auth.enabled:
            raise ValueError("usage.enabled needs auth.enabled: without keys nothing is recorded")
        return self

    @model_validator(mode="after")
    def _one_engine(self) -> Settings:
        """Workers share one engine (worker 0's); a cluster node is one serving process."""
        workers = self.server.workers
        if workers == 1:
            return self
        if self.cluster.enabled:
            raise ValueError(
                f"server.workers = {workers} with cluster.enabled is not supported: peers reach "
                "a node at its one internal URL, which SO_REUSEPORT would spread over workers "
                "without the engine; run one worker per node and more nodes instead"
            )
        local = self.local_providers()
        if len(local) > 1:
            raise ValueError(
                f"server.workers = {workers} shares one local engine; providers "
                f"{', '.join(map(repr, local))} would each load the model: enable one"
            )
        if local:
            self.engine_socket()  # a path too long says so now, not at start
        return self

    @model_validator(mode="after")
    def _cluster_shares_redis(self) -> Settings:
        """A node that started a private Redis would be a cluster of one that reports ready:
        keys, budgets and the prefix index live in the one Redis every node shares."""
        if self.cluster.enabled and self.redis.embedded:
            raise ValueError(
                "cluster.enabled needs the Redis every node shares: set redis.embedded = false "
                "(GATEWAY_REDIS__EMBEDDED=false) and redis.url to that server; an embedded "
                "Redis would make each node that cannot reach it a cluster of its own"
            )
        return self

    def local_providers(self) -> list[str]:
        """The enabled providers of kind "local" (each is an engine)."""
        return [n for n, p in self.providers.items() if p.kind == "local" and p.enabled]

    def engine_socket(self) -> Path:
        """Where worker 0 serves its engine to the other workers: `cluster.internal_socket`,
        else `server.run_dir/engine-<port>.sock`; absolute, so every worker finds it."""
        path = self.cluster.internal_socket
        if path is None:
            path = self.server.run_dir / f"engine-{self.server.port}.sock"
        path = path.absolute()
        if len(str(path).encode()) > _MAX_SOCKET_PATH:
            raise ValueError(
                f"the engine socket path {path} is longer than a unix socket allows "
                f"({_MAX_SOCKET_PATH} bytes): set server.run_dir or cluster.internal_socket shorter"
            )
        return path

    @property
    def shares_engine(self) -> bool:
        """Workers 1..N-1 reach worker 0's local engine (`[server] workers` > 1 and one local
        provider)."""
        return self.server.workers > 1 and bool(self.local_providers())

    def live_providers(self) -> tuple[dict[str, ProviderSettings], dict[str, str]]:
        """Providers to open, and for each one left out, why (for one clear log line)."""
        live: dict[str, ProviderSettings] = {}
        skipped: dict[str, str] = {}
        candidates: dict[str, ProviderSettings] = {}
        if self.use_presets:
            candidates.update(PRESETS)
        candidates.update(self.providers)
        for name, provider in candidates.items():
            if not provider.enabled:
                skipped[name] = "disabled in settings"
            elif name not in self.providers and not provider.api_key():
                skipped[name] = f"preset without ${provider.api_key_env}"
            else:
                live[name] = provider
        return live, skipped


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP field name (RFC 9110)


def header_value_problem(value: str) -> str:
    """What keeps `value` out of an HTTP header ("" if nothing): control characters (CR and LF
    above all) and characters beyond latin-1."""
    if value.isprintable() and value.isascii():
        return ""  # the common case, checked in C
    for char in value:
        if char in "\r\n":
            return "holds a line break"
        if ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F:
            return f"holds the control character {char!r}"
        if ord(char) > 0xFF:
            return "holds a character beyond latin-1"
    return ""


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read the TOML file (`path`, else $GATEWAY_CONFIG, else none) and the environment."""
    path = path or os.environ.get("GATEWAY_CONFIG")
    data: dict[str, Any] = {}
    if path:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    data.update(overrides)
    return Settings(**data)

"""Typed, frozen settings: `settings.toml` overridden by `GATEWAY_*` environment variables.

Precedence (highest first): environment (`GATEWAY_SERVER__PORT=9000`), the TOML file, defaults.
Secrets never live in the TOML file: providers name the environment variable holding their key
(`api_key_env`), and the admin key comes from `GATEWAY_ADMIN__API_KEY`.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from backend.engine.engine_config import EngineConfig
from gateway.cluster_settings import ClusterSettings
from gateway.routing_settings import RoutingSettings
from gateway.usage_store.settings import UsageSettings
from providers.busy_wait import Spin
from providers.openai_wire import ThinkingStyle

_FROZEN = ConfigDict(frozen=True, extra="forbid")

RoutingMode = Literal["static", "auto", "shadow"]
# The longest path a unix socket may have on Linux (sun_path is 108 bytes, NUL included).
_MAX_SOCKET_PATH = 107


class ServerSettings(BaseModel):
    model_config = _FROZEN
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    grace_period_s: float = Field(default=10.0, ge=0)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    # A stream that has no first event after this many seconds gets its headers (and opening
    # frames) at once; before that a failing route falls back unseen and an error keeps its
    # HTTP status, after it errors arrive in the stream (route fallback still works).
    stream_headers_after_s: float = Field(default=2.0, gt=0)
    # A stream silent for this many seconds gets a keep-alive frame (an SSE comment; a
    # `response.in_progress` event on /v1/responses). Keep it below clients' read timeouts.
    keepalive_s: float = Field(default=5.0, gt=0)
    # Serving processes on one port (SO_REUSEPORT). With a local engine, worker 0 loads it and
    # the others reach it over a unix socket (gateway/engine_share.py).
    workers: int = Field(default=1, ge=1, le=256)
    # Where the supervisor of workers > 1 puts the engine socket (engine-<port>.sock) unless
    # cluster.internal_socket names one.
    run_dir: Path = Path(".data/run")
    # How often workers 1..N-1 ask worker 0's engine for its load and liveness (routing's
    # queue signal and /readyz read the latest answer).
    engine_poll_s: float = Field(default=0.1, gt=0)
    # Slow clients are bounded: a connection is closed when it has not sent a whole request
    # head this long after it opened or after its last answer (idle keep-alive connections
    # too); a request's body must arrive this long after its head (else a 408); a client that
    # reads nothing of a stream for this long is disconnected, and its slot freed.
    request_head_timeout_s: float = Field(default=60.0, gt=0)
    request_body_timeout_s: float = Field(default=60.0, gt=0)
    write_stall_timeout_s: float = Field(default=60.0, gt=0)
    # While at most busy_wait_max_waiting answers are awaited (Redis's replies to admissions
    # and settlements, upstream answers), the event loop polls for them for up to busy_wait_us
    # after each is asked for instead of sleeping: an idle CPU of a virtual machine takes
    # longer to wake than Redis or a nearby upstream takes to answer. 0: always sleep. Not in
    # the process that runs the embedded engine (its threads want the CPU).
    busy_wait_us: int = Field(default=200, ge=0, le=10_000)
    busy_wait_max_waiting: int = Field(default=4, ge=1)
    # Once a serving process is up, what it built to start (modules, settings, the app, the
    # engine's objects) is moved out of the garbage collector's sight (gc.freeze), and a young
    # collection runs after this many more container objects were allocated than freed (Python's
    # default is 700). A request leaves almost no reference cycles behind but keeps a few
    # hundred objects alive while it runs: at 700, dozens of requests in flight set off a young
    # collection every few requests and an old one, over every object of the process, every
    # few thousand (together 9% of a request's CPU here).
    gc_young_threshold: int = Field(default=10_000, ge=100)

    @property
    def spin(self) -> Spin:
        """busy_wait_us and busy_wait_max_waiting as `BusyWait` takes them."""
        return Spin(self.busy_wait_us / 1e6, self.busy_wait_max_waiting)


class RedisSettings(BaseModel):
    model_config = _FROZEN
    url: str = "redis://127.0.0.1:6379/0"
    # Start a private redis-server under data_dir when `url` is unreachable.
    embedded: bool = True
    data_dir: Path = Path(".data/redis")
    key_prefix: str = "gw:"
    # Connections per gateway process; callers wait for a free one up to timeout_s.
    max_connections: int = Field(default=128, gt=0)
    # Every call to Redis (key lookups, admission, settlement, the admin API) fails after this.
    timeout_s: float = Field(default=5.0, gt=0)
    # How long start-up waits for a Redis that is loading its data (a large append-only file).
    start_timeout_s: float = Field(default=60.0, gt=0)


class LoggingSettings(BaseModel):
    model_config = _FROZEN
    format: Literal["json", "console"] = "console"
    level: Literal["debug", "info", "warning", "error"] = "info"


class AdminSettings(BaseModel):
    model_config = _FROZEN
    api_key: SecretStr | None = None


class AuthSettings(BaseModel):
    model_config = _FROZEN
    # false: no API keys, limits or usage accounting (a private deployment behind its own auth).
    enabled: bool = True


class LimitSettings(BaseModel):
    model_config = _FROZEN
    # Completion tokens reserved for a request that sets no max_tokens, on a model whose output
    # limit is unknown (no `max_output_tokens`, no local engine). Never sent upstream as a cap.
    default_max_tokens: int = Field(default=4096, gt=0)
    usage_stream_maxlen: int = Field(default=1_000_000, gt=0)
    # A request's concurrency slot and reservation are a lease of this many seconds, renewed
    # while it runs: capacity held by a replica that died or lost Redis is back this soon.
    slot_lease_s: float = Field(default=15.0, ge=1)
    # Settlements Redis could not take are appended here and replayed (at recovery and start).
    spool_dir: Path = Path(".data/spool")


class MessagesSettings(BaseModel):
    """The Anthropic Messages API (`/v1/messages`)."""

    model_config = _FROZEN
    # HMAC secret signing thinking blocks (environment only: GATEWAY_MESSAGES__SIGNING_SECRET);
    # unset: a random one per process, so signatures do not survive a restart or cross replicas.
    signing_secret: SecretStr | None = None


class ProviderSettings(BaseModel):
    """One configured provider. `kind = "openai"`: an upstream speaking the OpenAI API;
    `kind = "anthropic"`: one speaking the Anthropic Messages API (base_url before /v1/messages);
    `kind = "local"`: the embedded DeepSeek-V3.1 engine."""

    model_config = _FROZEN
    kind: Literal["openai", "anthropic", "local"] = "openai"
    base_url: str = ""
    api_key_env: str | None = None
    # Further accounts of the same upstream (environment variables holding their keys): a
    # conversation keeps to one account, by a hash of its first messages.
    api_key_envs: tuple[str, ...] = ()
    enabled: bool = True
    thinking_style: ThinkingStyle = "deepseek"
    # Whether earlier assistant reasoning is sent back upstream in the history.
    send_reasoning_history: bool = False
    connect_timeout_s: float = Field(default=10.0, gt=0)
    first_byte_timeout_s: float = Field(default=120.0, gt=0)
    idle_timeout_s: float = Field(default=120.0, gt=0)
    # A JSON client's answer, non-streamed upstream unless stream_upstream (openai_upstream.py).
    answer_timeout_s: float = Field(default=600.0, gt=0)
    stream_upstream: bool = False
    max_connections: int = Field(default=256, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)
    # Provider-side model names or glob patterns (`deepseek-*`, `*`) that clients may address
    # directly as `<provider>/<model>`; empty: only the configured models reach this provider.
    direct_models: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> ProviderSettings:
        if self.kind != "local" and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"an {self.kind} provider needs base_url starting with http:// or https://"
            )
        return self

    def api_key(self) -> str | None:
        """The upstream key, read from the environment when asked (never stored here)."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def accounts(self) -> tuple[tuple[str, str], ...]:
        """(environment variable, key) of every account whose key is set, the main one first."""
        names = ((self.api_key_env,) if self.api_key_env else ()) + self.api_key_envs
        return tuple((n, os.environ[n]) for n in names if os.environ.get(n))


class RouteSettings(BaseModel):
    model_config = _FROZEN
    provider: str
    model: str
    # Force DeepSeek thinking on/off on this route (None: the client's choice).
    thinking: bool | None = None


class ModelSettings(BaseModel):
    model_config = _FROZEN
    routes: tuple[RouteSettings, ...]
    owned_by: str = "gateway"
    # The most tokens the model can produce in one answer (reasoning included): what a request
    # without max_tokens reserves. Unset: a local engine's context length minus the prompt,
    # else limits.default_max_tokens.
    max_output_tokens: int | None = Field(default=None, gt=0)
    # A cap sent upstream for requests that set no max_tokens. Unset: none is sent, and the
    # answer may run to the model's own limit.
    default_max_tokens: int | None = Field(default=None, gt=0)
    # "static": the routes as listed, thinking as the route forces or the client asks;
    # "auto": thinking and local/upstream decided per request (gateway/routing/);
    # "shadow": decided like "auto" and reported, but served as "static".
    routing: RoutingMode = "static"

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


class EngineSettings(BaseModel):
    """The embedded engine (providers of kind "local"): where its checkpoint comes from, and its
    knobs, written flat under `[engine]` and validated into `EngineConfig`, whose defaults and
    checks are the only ones (`cache_memory_mb` is accepted for `cache_memory_bytes`)."""

    model_config = _FROZEN
    model_path: Path | None = None
    demo_dir: Path = Path(".data/demo-checkpoint")
    demo_preset: Literal["tiny", "small"] = "small"
    config: EngineConfig = Field(default_factory=EngineConfig)

    @model_validator(mode="before")
    @classmethod
    def _knobs_into_config(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "config" in data:
            return data
        own = {
            name: data[name] for name in ("model_path", "demo_dir", "demo_preset") if name in data
        }
        knobs = {name: value for name, value in data.items() if name not in own}
        if "cache_memory_mb" in knobs:
            knobs["cache_memory_bytes"] = int(knobs.pop("cache_memory_mb")) << 20
        unknown = set(knobs) - {field.name for field in dataclasses.fields(EngineConfig)}
        if unknown:
            raise ValueError(f"unknown engine settings: {', '.join(sorted(unknown))}")
        return {**own, "config": knobs}


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
    ),
    "openai": ProviderSettings(
        kind="openai",
        base_url="https://api.openai.com/v1",
        api_key_env="OPENAI_API_KEY",
        thinking_style="reasoning_effort",
        direct_models=("gpt-*", "o[0-9]*", "chatgpt-*"),
    ),
}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    server: ServerSettings = ServerSettings()
    redis: RedisSettings = RedisSettings()
    logging: LoggingSettings = LoggingSettings()
    admin: AdminSettings = AdminSettings()
    auth: AuthSettings = AuthSettings()
    limits: LimitSettings = LimitSettings()
    engine: EngineSettings = EngineSettings()
    cluster: ClusterSettings = ClusterSettings()
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)
    models: dict[str, ModelSettings] = Field(default_factory=dict)
    routing: RoutingSettings = RoutingSettings()
    # Model-id patterns (fnmatch, first match wins) -> a configured model, for clients that
    # ask for their own ids: {"claude-*haiku*" = "deepseek-chat", "claude-*" = "deepseek-reasoner"}.
    model_patterns: dict[str, str] = Field(default_factory=dict)
    messages: MessagesSettings = MessagesSettings()
    usage: UsageSettings = UsageSettings()
    # Add the built-in TaoToken / DeepSeek / OpenAI providers whose key env var is set.
    use_presets: bool = True

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
    def _usage_needs_auth(self) -> Settings:
        if self.usage.enabled and not self.auth.enabled:
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


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read the TOML file (`path`, else $GATEWAY_CONFIG, else none) and the environment."""
    path = path or os.environ.get("GATEWAY_CONFIG")
    data: dict[str, Any] = {}
    if path:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    data.update(overrides)
    return Settings(**data)

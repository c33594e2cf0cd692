"""`[usage]`: the SQL usage store, its consumer, retention and prices."""

from __future__ import annotations

from pydantic import BaseModel, Field

from gateway.config.frozen import FROZEN


class Price(BaseModel):
    """Prices per million tokens, in `usage.currency`."""

    model_config = FROZEN
    input: float = Field(default=0.0, ge=0, description="Per million uncached prompt tokens.")
    cached_input: float | None = Field(
        default=None,
        ge=0,
        description="Per million prompt tokens served from the provider's cache; unset: `input`.",
    )
    output: float = Field(
        default=0.0, ge=0, description="Per million completion tokens (reasoning included)."
    )


class UsageSettings(BaseModel):
    model_config = FROZEN

    enabled: bool = Field(
        default=True,
        description="Store every usage record in SQL (on by default wherever `auth.enabled` "
        "is: a SQLite file under `.data/`); every node runs a consumer, and the Redis stream "
        "is trimmed only after its records are stored. false: the stream is capped at "
        "`limits.usage_stream_maxlen` and only its totals are kept.",
    )
    url: str = Field(
        default="sqlite+aiosqlite:///.data/usage.db",
        description="SQLAlchemy URL: `sqlite+aiosqlite:///path` (one node) or "
        "`postgresql+asyncpg://user:pass@host/db` (every node of a cluster the same).",
    )
    group: str = Field(default="usage-store", description="The Redis consumer group's name.")
    batch_size: int = Field(
        default=25_000,
        gt=0,
        le=100_000,
        description="Most records per read and transaction (a backlog drains in batches this "
        "large: each rollup row is written once a batch; about 2 KiB of memory per record of "
        "a batch, two batches while the next is read).",
    )
    block_ms: int = Field(
        default=1000, gt=0, description="How long one read waits for new records."
    )
    flush_ms: int = Field(
        default=1000,
        ge=0,
        le=60_000,
        description="After a batch that was not full, wait this long before reading again: "
        "live traffic is stored a second's records to a transaction, not a few (each batch "
        "costs the gateway a transaction and Redis an acknowledgement and a trim); records "
        "show in reports this much later. 0: read again at once.",
    )
    claim_idle_s: float = Field(
        default=60.0,
        gt=0,
        description="Records read by a consumer that has not stored them for this long "
        "(it died) are claimed by another.",
    )
    retry_s: float = Field(
        default=1.0, gt=0, description="Wait after Redis or the database failed, doubling to 30 s."
    )
    retention_days: int = Field(default=30, gt=0, description="Days raw records are kept.")
    rollup_retention_days: int = Field(
        default=400,
        gt=0,
        description="Days the rollups are kept at least (they are deleted by whole UTC months).",
    )
    retention_interval_s: float = Field(
        default=3600.0, gt=0, description="How often retention deletes what is past it."
    )
    currency: str = Field(
        default="USD",
        min_length=1,
        max_length=16,
        description="The currency prices and costs are in (a name only: nothing is converted).",
    )
    prices: dict[str, Price] = Field(
        default_factory=dict,
        description="Per model the client asked for: {'deepseek-chat' = {input = 0.27, ...}}.",
    )
    route_prices: dict[str, Price] = Field(
        default_factory=dict,
        description="Per provider route, '<provider>/<provider-side model>'; wins over `prices`.",
    )
    local_price: Price = Field(
        default_factory=Price,
        description="What a request served by the local engine costs (default: nothing), "
        "unless `route_prices` names its route.",
    )

"""Pydantic models of API-key records and of the admin API's request bodies.

Bodies are strict (`extra="forbid"`, no type coercion from JSON strings to numbers) so that bad
input is a 400 naming the field. Limits are non-negative; 0 means "nothing allowed", None means
"no limit". Datetimes are UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

from gateway.routing.policy import KeyPolicy

BudgetPeriod = Literal["day", "month"]
GroupBy = Literal["day", "model", "key"]

_Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
_Model = Annotated[str, StringConstraints(min_length=1, max_length=200)]
_Limit = Annotated[int, Field(ge=0, le=10**15)]
# A cost budget in `usage.currency`; Redis counts it in millionths, so at most 10**9.
_CostLimit = Annotated[float, Field(ge=0, le=10**9, allow_inf_nan=False)]
_MetaKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
_MetaValue = Annotated[str, StringConstraints(max_length=512)]
# OpenAI-style metadata: at most 16 string pairs.
_Metadata = Annotated[dict[_MetaKey, _MetaValue], Field(max_length=16)]
_Models = Annotated[list[_Model], Field(max_length=1000)]


class KeyPolicyBody(BaseModel):
    """A key's routing policy as stored and as the admin API takes it (gateway/routing/policy.py
    says what each field does)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    thinking: Literal["off", "auto", "on", "client"] = "client"
    max_reasoning_tokens: Annotated[int, Field(ge=1, le=10**7)] | None = None
    providers: Literal["local", "any"] = "any"
    default_model: _Model | None = None

    def policy(self) -> KeyPolicy:
        return KeyPolicy(
            self.thinking, self.max_reasoning_tokens, self.providers, self.default_model
        )


def as_utc(value: datetime) -> datetime:
    """An aware datetime in UTC (a naive one is taken to be UTC). A moment whose UTC time falls
    outside years 1 to 9999 (`0001-01-01T00:00:00+14:00`) is a ValueError, which pydantic
    reports as a validation error naming the field."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the date is out of range once converted to UTC") from None


class KeyLimits(BaseModel):
    """The fields a key is created with and that PATCH may change."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    models: _Models | None = None
    budget_tokens: _Limit | None = None
    budget_period: BudgetPeriod | None = None
    budget_cost: _CostLimit | None = None
    budget_cost_period: BudgetPeriod | None = None
    rpm: _Limit | None = None
    tpm: _Limit | None = None
    max_concurrency: _Limit | None = None
    expires_at: datetime | None = None
    metadata: _Metadata = Field(default_factory=dict)
    # The routing policy; None: the default (thinking "client", any provider, no budget).
    policy: KeyPolicyBody | None = None

    @field_validator("expires_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else as_utc(value)

    @field_validator("models")
    @classmethod
    def _dedupe(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else sorted(set(value))


class KeyCreate(KeyLimits):
    """Body of `POST /admin/keys`."""

    name: _Name

    @field_validator("budget_period")
    @classmethod
    def _needs_budget(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("budget_tokens") is None:
            raise ValueError("budget_period needs budget_tokens")
        return value

    @field_validator("budget_cost_period")
    @classmethod
    def _needs_cost_budget(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("budget_cost") is None:
            raise ValueError("budget_cost_period needs budget_cost")
        return value


class KeyUpdate(KeyLimits):
    """Body of `PATCH /admin/keys/{id}`: only the fields present change; null clears a limit."""

    name: _Name | None = None
    disabled: bool | None = None
    metadata: _Metadata | None = None  # type: ignore[assignment]

    @field_validator("name", "disabled", mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        # Runs only for fields the body names: these two have nothing to clear.
        if value is None:
            raise ValueError("cannot be null")
        return value


class KeyRecord(KeyCreate):
    """A stored key, as the admin API shows it. The secret itself is never part of it; `hint`
    holds its last four characters so an operator can tell keys apart. Fields it does not know
    are ignored: a node of an older version reads the records a newer one wrote (a rolling
    upgrade), as long as no field it knows changed meaning."""

    model_config = ConfigDict(extra="ignore", strict=False, frozen=True)

    id: str
    created: datetime
    disabled: bool = False
    hint: str

    def updated(self, patch: KeyUpdate) -> KeyRecord:
        """This record with the fields present in `patch` replaced (validated again)."""
        changes: dict[str, Any] = {name: getattr(patch, name) for name in patch.model_fields_set}
        if changes.get("metadata", {}) is None:
            changes["metadata"] = {}
        return KeyRecord.model_validate({**self.model_dump(), **changes})

    def public(self) -> dict[str, Any]:
        """The record as JSON-ready data, identity first (for the admin API and the CLI)."""
        data = self.model_dump(mode="json")
        first = ("id", "name", "created", "expires_at", "disabled", "hint")
        return {**{name: data.pop(name) for name in first}, **data}

    def is_expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


class UsageQuery(BaseModel):
    """Query of `GET /admin/usage`; dates are UTC days, `end` inclusive."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key_id: str | None = None
    model: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    group_by: GroupBy | None = None

    @field_validator("start", "end")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else as_utc(value)

"""Key forms of the console -> the admin API's own bodies (`KeyCreate`, `KeyUpdate`).

HTML forms send strings; the bodies are strict, so numbers and dates are converted here and an
empty field means "no limit" (null). A bad value is a `FormError` naming the field."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from multidict import MultiDictProxy
from pydantic import ValidationError

from gateway.keys.records import KeyCreate, KeyUpdate

LIMITS = ("budget_tokens", "rpm", "tpm", "max_concurrency")


class FormError(ValueError):
    pass


def _text(form: MultiDictProxy[Any], name: str) -> str:
    value = form.get(name, "")
    return value.strip() if isinstance(value, str) else ""


def _int(form: MultiDictProxy[Any], name: str) -> int | None:
    raw = _text(form, name).replace(",", "").replace("_", "")
    if not raw:
        return None
    if not raw.isdigit():
        raise FormError(f"'{name}' must be a whole number (or empty for no limit).")
    return int(raw)


def _fields(form: MultiDictProxy[Any]) -> dict[str, Any]:
    body: dict[str, Any] = {name: _int(form, name) for name in LIMITS}
    body["budget_period"] = _text(form, "budget_period") or None
    models = [m.strip() for m in _text(form, "models").split(",") if m.strip()]
    body["models"] = models or None
    expires = _text(form, "expires_at")
    if expires:
        try:
            moment = datetime.fromisoformat(expires)
        except ValueError:
            raise FormError("'expires_at' must be a date (YYYY-MM-DD or an ISO time).") from None
        body["expires_at"] = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    else:
        body["expires_at"] = None
    policy: dict[str, Any] = {
        "thinking": _text(form, "thinking") or "client",
        "providers": _text(form, "providers") or "any",
        "max_reasoning_tokens": _int(form, "max_reasoning_tokens"),
        "default_model": _text(form, "default_model") or None,
    }
    body["policy"] = policy
    return body


def _message(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    field = ".".join(str(part) for part in error["loc"])
    return f"Invalid value for '{field}': {error['msg']}." if field else str(error["msg"])


def key_create(form: MultiDictProxy[Any]) -> KeyCreate:
    body = {k: v for k, v in _fields(form).items() if v is not None}
    body["name"] = _text(form, "name")
    try:
        return KeyCreate.model_validate(body)
    except ValidationError as exc:
        raise FormError(_message(exc)) from None


def key_update(form: MultiDictProxy[Any]) -> KeyUpdate:
    """Every field of the edit form (an empty limit clears it)."""
    body = _fields(form)
    body["name"] = _text(form, "name")
    if body["budget_tokens"] is None:
        body["budget_period"] = None
    try:
        return KeyUpdate.model_validate(body)
    except ValidationError as exc:
        raise FormError(_message(exc)) from None

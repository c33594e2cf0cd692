"""The admin API's query-string errors in words a person can act on: the parameter named (in
the message and in `param`) and what it allows, never the validation library's own phrasing."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gateway.errors import InvalidRequest

# What a parameter allows, where its type alone does not say it well.
ALLOWED = {
    "start": "a UTC time in ISO 8601, e.g. 2026-11-01 or 2026-11-01T12:00:00Z",
    "end": "a UTC time in ISO 8601, e.g. 2026-11-30 or 2026-11-30T12:00:00Z",
    "limit": "a whole number from 1 to 1000",
    "status": "an HTTP status, a whole number from 0 to 999",
    "latency": "true or false",
    "interval": "hour, day or month",
}


def _allowed(model: type[BaseModel], field: str, error: ErrorDetails) -> str:
    if field in ALLOWED:
        return ALLOWED[field]
    if error["type"] == "literal_error":
        return f"one of {error['ctx']['expected']}"
    if field in model.model_fields and "str" in str(model.model_fields[field].annotation):
        return "text of at most 200 characters, without NUL"
    return "a valid value"


def query_error(model: type[BaseModel], exc: ValidationError) -> InvalidRequest:
    """The first of `exc`'s errors as a 400 naming its parameter and what it allows."""
    error = exc.errors(include_url=False)[0]
    field = ".".join(str(part) for part in error["loc"])
    kind = error["type"]
    if kind == "start_after_end":  # a check of the whole query: it names its parameter
        return InvalidRequest(str(error["msg"]), param="start")
    if not field:
        return InvalidRequest(f"Invalid query: {error['msg']}.")
    if kind == "extra_forbidden":
        known = ", ".join(model.model_fields)
        return InvalidRequest(f"Unknown parameter '{field}' (known: {known}).", param=field)
    if field == "cursor":
        return InvalidRequest(
            "Invalid value for 'cursor': pass the next_cursor you were given, as it was given "
            "(leave it out for the first page).",
            param=field,
        )
    if kind == "unknown_dimension":
        return InvalidRequest(str(error["msg"]), param=field)
    return InvalidRequest(
        f"Invalid value for '{field}': expected {_allowed(model, field, error)}.", param=field
    )

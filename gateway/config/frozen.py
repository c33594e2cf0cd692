"""The model configuration every settings section shares: frozen (read once, passed down) and
refusing unknown keys (a misspelt setting is an error at start, not a silent default)."""

from pydantic import ConfigDict

FROZEN = ConfigDict(frozen=True, extra="forbid")

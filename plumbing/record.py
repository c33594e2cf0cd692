"""`@record`: an immutable value class, checked immutable by mypy and cheap to build at run time.

`@dataclass(frozen=True)` enforces immutability at run time by routing every field of `__init__`
through `object.__setattr__`: a 16-field `ChatRequest` takes about four times as long to build
frozen as plain, and a request builds dozens of such values (messages, sampling,
tickets, grants, outcomes, decisions, events). A `@record` class is a slotted dataclass with a
field-wise `__hash__`, exactly as a frozen one, whose immutability is proved statically instead:
mypy (strict, on every commit) treats it as frozen through `dataclass_transform` and rejects any
assignment to a field. `dataclasses.replace` makes changed copies, as for any dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from typing_extensions import dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[T]) -> type[T]:
    return dataclass(slots=True, unsafe_hash=True)(cls)

"""Bounds of the integers the API takes, shared by every wire protocol.

Every integer a client sends either reaches a model (whose sampler works in 32- or 64-bit
integers) or crosses Redis Lua (whose numbers are doubles, exact only up to 2^53). A value
outside these bounds is a 400 naming the parameter, never a silent wrap-around.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

# More completion tokens than any model's context window holds, and far below 2^53 even when
# admission adds the prompt and sums the reservations of every request in flight.
MAX_OUTPUT_TOKENS = 2**24
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1

OutputTokens = Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS)]
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
TopK = Annotated[int, Field(ge=-1, le=INT32_MAX)]

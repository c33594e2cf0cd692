"""What a probe found: one row per check (group, name, passed, what was seen), and the rule every
answer must keep, as a verdict rather than an assertion."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from testkit.threaded import assert_api_answer


@dataclass
class Results:
    rows: list[tuple[str, str, bool, str]] = field(default_factory=list)

    def add(self, group: str, name: str, ok: bool, seen: str = "") -> None:
        self.rows.append((group, name, ok, seen[:300]))
        print(f"{'ok  ' if ok else 'FAIL'} {group:10} {name}" + ("" if ok else f": {seen[:300]}"))

    async def run(
        self, group: str, name: str, check: Callable[[], Awaitable[str | None]], within_s: float
    ) -> None:
        """Runs `check`, which returns None when it passed, else what was wrong; an exception or
        a check that outlives `within_s` (a hang) fails it too."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(within_s):
                problem = await check()
        except TimeoutError:
            problem = f"no verdict within {within_s:g} s (a hang)"
        except Exception as exc:  # the check itself broke: that is a finding too
            problem = f"{type(exc).__name__}: {exc}"
        took = time.monotonic() - started
        self.add(
            group, name, problem is None, "" if problem is None else f"{problem} ({took:.1f} s)"
        )

    @property
    def failed(self) -> list[tuple[str, str, bool, str]]:
        return [row for row in self.rows if not row[2]]


def answer_problem(
    status: int, headers: Any, body: bytes, path: str, *, upstream_failed: bool = False
) -> str | None:
    """None when an answer keeps the rules (no 5xx, an x-request-id, an error in the shape of its
    path's protocol), else what it broke. `upstream_failed`: a 502, 503, 504 or 529 is the right
    answer (the error must keep its shape all the same); a 500 never is."""
    shown = 400 if upstream_failed and status in (502, 503, 504, 529) else status
    try:
        assert_api_answer(shown, headers, body, path, path)
    except (AssertionError, ValueError, KeyError, TypeError) as exc:
        return f"HTTP {status}: {exc!r}"[:300]
    return None

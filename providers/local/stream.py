"""Generated token ids -> provider Events, for one request of the local engine.

Per engine step, the new ids are detokenized incrementally, split into reasoning, content and
tool calls by the engine's OutputParser (chat) or taken as plain text (legacy completions), and
content is cut at the first stop string. Torch-free: it sees ids, text and logprob records only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from backend.text.detokenizer import IncrementalDetokenizer
from backend.text.output_parser import (
    ContentDelta,
    OutputParser,
    ParsedDelta,
    ParsedReasoning,
    ToolCallArgs,
    ToolCallStart,
)
from backend.text.tokenizer import Tokenizer
from providers.types import Event, ReasoningDelta, TextDelta, ToolCallDelta


class TokenLogprob(Protocol):
    """What the engine reports per generated token when logprobs were asked for."""

    @property
    def logprob(self) -> float: ...

    @property
    def top(self) -> list[tuple[int, float]]: ...


class StopMatcher:
    """Cuts text at the first of `stops`. Text that may be the start of a stop string is held
    back until the next piece (or `flush`) decides it; after a hit, everything is dropped."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.hit = False
        self.matched: str | None = None  # the stop string found first in the text

    def feed(self, text: str) -> str:
        """The part of `held + text` now known to precede any stop string."""
        if self.hit:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        found = [(i, s) for s in self._stops if (i := buf.find(s)) >= 0]
        if found:
            index, self.matched = min(found)
            self.hit = True
            self._held = ""
            return buf[:index]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """Text held back when the text ends (or is interrupted by a tool call)."""
        held, self._held = self._held, ""
        return "" if self.hit else held

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        longest = max(len(s) for s in self._stops) - 1
        for n in range(min(longest, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0


class TokenTranslator:
    """Turns a request's generated ids into Events and counts what was generated.

    `parse`: chat output (reasoning and tool calls parsed); False for a legacy completion, whose
    whole output is text. `thinking`: the prompt ended in `<think>`, so output starts as
    reasoning; tokens up to and including `</think>` count as reasoning tokens. `stops`: stop
    strings matched on content; once one is found `stopped` is set and later output is dropped.
    `logprobs`: attach OpenAI-shaped logprob entries to the TextDeltas; an entry rides with the
    first TextDelta emitted at or after its token's step (reasoning tokens have none).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        *,
        parse: bool,
        thinking: bool,
        tools_enabled: bool,
        stops: Sequence[str],
        logprobs: bool,
    ) -> None:
        self._tokenizer = tokenizer
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._parser = (
            OutputParser(thinking=thinking, tools_enabled=tools_enabled) if parse else None
        )
        self._stop = StopMatcher(stops)
        self._want_logprobs = logprobs
        self._pending_logprobs: list[dict[str, Any]] = []
        self._in_reasoning = thinking
        self._think_end = tokenizer.special.think_end
        self.num_tokens = 0
        self.num_reasoning_tokens = 0
        self.num_tool_calls = 0

    @property
    def stopped(self) -> bool:
        return self._stop.hit

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the content, if one did."""
        return self._stop.matched

    def push(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob | None] | None = None
    ) -> list[Event]:
        """Events for one step's new tokens (`logprobs`: one record per token, when asked)."""
        text = []
        for i, token_id in enumerate(token_ids):
            self.num_tokens += 1
            record = logprobs[i] if logprobs is not None and i < len(logprobs) else None
            if self._in_reasoning:
                self.num_reasoning_tokens += 1
                self._in_reasoning = token_id != self._think_end
            elif self._want_logprobs and record is not None:
                self._pending_logprobs.append(self._logprob_entry(token_id, record))
            text.append(self._detok.push(token_id))
        return self._text_events("".join(text), final=False)

    def finish(self) -> list[Event]:
        """Events for everything held back at the end of the output."""
        return self._text_events(self._detok.flush(), final=True)

    def _text_events(self, text: str, *, final: bool) -> list[Event]:
        if self._parser is None:
            deltas: list[ParsedDelta] = [ContentDelta(text)] if text else []
        else:
            deltas = self._parser.feed(text) if text else []
            if final:
                deltas += self._parser.finish()
        events: list[Event] = []
        for delta in deltas:
            if isinstance(delta, ContentDelta):
                self._add_text(events, self._stop.feed(delta.text))
            elif self._stop.hit:
                continue
            elif isinstance(delta, ParsedReasoning):
                events.append(ReasoningDelta(delta.text))
            elif isinstance(delta, ToolCallStart):
                self._add_text(events, self._stop.flush())
                self.num_tool_calls += 1
                events.append(ToolCallDelta(delta.index, id=delta.id, name=delta.name))
            elif isinstance(delta, ToolCallArgs):
                events.append(ToolCallDelta(delta.index, arguments_fragment=delta.fragment))
        if final:
            self._add_text(events, self._stop.flush())
        return events

    def _add_text(self, events: list[Event], text: str) -> None:
        if not text:
            return
        if self._want_logprobs:
            entries, self._pending_logprobs = self._pending_logprobs, []
            events.append(TextDelta(text, logprobs=entries))
        else:
            events.append(TextDelta(text))

    def _logprob_entry(self, token_id: int, record: TokenLogprob) -> dict[str, Any]:
        entry = self._token_fields(token_id, record.logprob)
        entry["top_logprobs"] = [self._token_fields(t, lp) for t, lp in record.top]
        return entry

    def _token_fields(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self._tokenizer.token_bytes(token_id)
        return {
            "token": raw.decode("utf-8", errors="replace"),
            "logprob": logprob,
            "bytes": list(raw),
        }

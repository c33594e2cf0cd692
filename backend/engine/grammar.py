"""Grammar-constrained sampling: compiled grammars (cached) and each sequence's matcher.

The grammar engine is xgrammar. `GrammarCompiler` turns a request's constraint
(`backend.text.structured.Constraint`, carried as text in `SamplingParams.grammar`) into a
compiled grammar over the V3.1 vocabulary, cached by that text; compiling takes milliseconds to
a second, so `AsyncEngine` calls it in a worker thread. `GrammarMasks` (the runner's hook) keeps
one matcher per constrained sequence and, before sampling, masks each of its logits rows to the
tokens the grammar allows there: the sequence's last token and, with MTP, each draft after it
(the matcher accepts the drafts tentatively and rolls them back, so a draft the grammar forbids
meets a target that cannot equal it and is rejected like any mismatch).

The grammar starts after `SamplingParams.grammar_after`'s tokens have appeared in order in the
output (the end of thinking, the tool-call section's marker): before that the rows are free.

The vocabulary the grammar sees: ordinary tokens as their bytes; the tool-call markers as byte
strings no JSON text can contain (a control character first), matched by token id, so a JSON
string never holds a marker; every other added token (BOS, EOS, `<think>`, placeholders) as
special: never allowed, EOS only where the grammar may end.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import xgrammar as xgr
from xgrammar import structural_tag as st

from backend.text.structured import Constraint, ConstraintError
from backend.text.tokenizer import SpecialIds, Tokenizer

logger = logging.getLogger(__name__)

CACHE_SIZE = 256  # compiled grammars kept, least recently used dropped first


class GrammarError(ConstraintError):
    """A constraint the grammar engine cannot compile; `param` names the part."""


def _markers(special: SpecialIds) -> dict[int, bytes]:
    names = ("tool_calls_begin", "tool_calls_end", "tool_call_begin", "tool_call_end", "tool_sep")
    return {getattr(special, n): b"\x01" + n.encode() + b"\x01" for n in names}


def grammar_vocab(tokenizer: Tokenizer) -> list[bytes]:
    """Each token id's bytes as the grammar matches them (see the module docstring)."""
    markers = _markers(tokenizer.special)
    added = tokenizer.added_token_ids
    return [
        markers.get(i, b"" if i in added else tokenizer.token_bytes(i))
        for i in range(tokenizer.vocab_size)
    ]


_BOUNDED_STRING_CHAR = r"[^\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\\r\n]"


def json_grammar(schema: dict[str, Any], param: str) -> st.Format:
    """Compact JSON (no whitespace outside strings: a weak model cannot pad forever) following
    `schema`, properties in its order, none beyond those it allows. Raises GrammarError."""
    try:
        grammar = xgr.Grammar.from_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
        )
    except (RuntimeError, ValueError) as exc:
        lines = str(exc).strip().splitlines()
        detail = lines[-1].rsplit(": ", 1)[-1] if lines else type(exc).__name__
        raise GrammarError(f"Invalid JSON Schema at '{param}': {detail}", param) from None
    # xgrammar's rule for a string with a length bound admits control characters, which JSON
    # forbids unescaped (the unbounded rule excludes them): give it the unbounded rule's class.
    text = str(grammar).replace(_BOUNDED_STRING_CHAR, _JSON_STRING_CHAR)
    return st.GrammarFormat(grammar=text)


def structural_tag(constraint: Constraint, special: SpecialIds) -> st.StructuralTag:
    """The constraint as an xgrammar structural tag. A triggered constraint starts after the
    tool-call section's opening marker (left out of the grammar). Raises GrammarError."""

    def call(name: str, schema: dict[str, Any], param: str) -> st.Format:
        return st.SequenceFormat(
            elements=[
                st.TokenFormat(token=special.tool_call_begin),
                st.ConstStringFormat(value=name),
                st.TokenFormat(token=special.tool_sep),
                json_grammar(schema, param),
                st.TokenFormat(token=special.tool_call_end),
            ]
        )

    formats: list[st.Format] = []
    if constraint.calls:
        each = [call(*c) for c in constraint.calls]
        one = each[0] if len(each) == 1 else st.OrFormat(elements=each)
        calls: st.Format = st.PlusFormat(content=one) if constraint.parallel else one
        section = [calls, st.TokenFormat(token=special.tool_calls_end)]
        if not constraint.triggered:
            section.insert(0, st.TokenFormat(token=special.tool_calls_begin))
        formats.append(st.SequenceFormat(elements=section))
    if constraint.json_schema is not None:
        formats.append(json_grammar(constraint.json_schema, "response_format.json_schema.schema"))
    fmt = formats[0] if len(formats) == 1 else st.OrFormat(elements=formats)
    return st.StructuralTag(format=fmt)


class GrammarCompiler:
    """Compiles constraints over one tokenizer and model vocabulary; thread-safe."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, *, threads: int = 1) -> None:
        self.special = tokenizer.special
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo(
            grammar_vocab(tokenizer),
            xgr.VocabType.RAW,
            vocab_size=vocab_size,
            stop_token_ids=[tokenizer.special.eos],
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self._cache: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def cached(self, text: str) -> xgr.CompiledGrammar | None:
        with self._lock:
            compiled = self._cache.get(text)
            if compiled is not None:
                self._cache.move_to_end(text)
            return compiled

    def compile(self, text: str) -> xgr.CompiledGrammar:
        """The compiled grammar of `text` (a `Constraint.text`). Blocking: milliseconds to a
        second for a new constraint. Raises GrammarError naming what does not compile."""
        compiled = self.cached(text)
        if compiled is not None:
            return compiled
        try:
            constraint = Constraint.from_text(text)
        except (ValueError, KeyError, TypeError) as exc:
            raise GrammarError(f"malformed grammar constraint: {exc}", "grammar") from None
        tag = structural_tag(constraint, self.special)
        try:
            compiled = self._compiler.compile_structural_tag(tag)
        except (RuntimeError, ValueError) as exc:
            reason = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
            raise GrammarError(
                f"The output format does not compile: {reason[0]}", "grammar"
            ) from None
        with self._lock:
            self._cache[text] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled


@dataclass(slots=True)
class GrammarRow:
    """One sequence's rows in a step: output so far, drafts, and its first logits row."""

    request_id: str
    grammar: object  # xgr.CompiledGrammar (opaque to the engine's other modules)
    after: Sequence[int]
    output_token_ids: Sequence[int]
    draft_token_ids: Sequence[int]
    first_row: int


class _State:
    """A sequence's matcher and how far into its output (and its `after` tokens) it has read."""

    def __init__(self, grammar: object, after: Sequence[int]) -> None:
        if not isinstance(grammar, xgr.CompiledGrammar):
            raise TypeError(f"expected a compiled grammar, got {type(grammar).__name__}")
        self.matcher = xgr.GrammarMatcher(grammar)
        self.after = tuple(after)
        self.waiting = 0  # how many of `after` have appeared
        self.num_seen = 0  # output tokens read
        self.broken = False

    def catch_up(self, output: Sequence[int]) -> None:
        for token in output[self.num_seen :]:
            if not self.broken and not self._advance(token):
                # only a token the engine wrote itself (a forced end of thinking) can get here
                logger.warning("grammar: token %d outside the grammar; unconstrained now", token)
                self.broken = True
        self.num_seen = len(output)

    def _advance(self, token: int) -> bool:
        """Read one token; False (and no change) where the grammar forbids it."""
        if self.waiting < len(self.after):
            if token == self.after[self.waiting]:
                self.waiting += 1
            return True
        if self.broken or self.matcher.is_terminated():
            return False
        return bool(self.matcher.accept_token(token))

    @property
    def active(self) -> bool:
        return not self.broken and self.waiting == len(self.after)


def _allowed(bitmask: torch.Tensor, row: int, token: int) -> bool:
    """Whether `token` is set in row `row` of a bitmask [R, ceil(V / 32)] int32."""
    return token < bitmask.shape[1] * 32 and bool(
        (int(bitmask[row, token >> 5]) >> (token & 31)) & 1
    )


class GrammarMasks:
    """Per-sequence matchers; masks a step's logits rows before they are sampled."""

    def __init__(self) -> None:
        self._states: dict[str, _State] = {}

    def apply(self, logits: torch.Tensor, rows: Sequence[GrammarRow]) -> None:
        """logits: [R, V] fp32, changed in place: forbidden tokens of each constrained row set
        to -inf. Row `first_row + j` of a sequence follows its j-th draft."""
        if not rows:
            return
        bitmask = xgr.allocate_token_bitmask(logits.shape[0], logits.shape[1])
        masked: list[int] = []
        for row in rows:
            state = self._states.get(row.request_id)
            if state is None:
                state = self._states[row.request_id] = _State(row.grammar, row.after)
            state.catch_up(row.output_token_ids)
            if state.broken:
                continue
            matcher = state.matcher
            waiting, accepted = state.waiting, 0
            for j in range(len(row.draft_token_ids) + 1):
                filled = state.active and not matcher.is_terminated()
                if filled:
                    matcher.fill_next_token_bitmask(bitmask, row.first_row + j)
                    masked.append(row.first_row + j)
                if j == len(row.draft_token_ids):
                    break
                draft = row.draft_token_ids[j]
                if filled and not _allowed(bitmask, row.first_row + j, draft):
                    break  # rows after a forbidden draft are never read
                if filled:
                    matcher.accept_token(draft)
                    accepted += 1
                elif not state._advance(draft):
                    break
            if accepted:
                matcher.rollback(accepted)
            state.waiting = waiting
        if not masked:
            return
        bitmask = bitmask.to(logits.device, non_blocking=True)
        if logits.is_contiguous():
            xgr.apply_token_bitmask_inplace(logits, bitmask, indices=masked)
            return
        # the kernel needs row-major rows (a small batch's logits may come transposed)
        at = torch.tensor(masked, dtype=torch.long, device=logits.device)
        rows_of = logits.index_select(0, at)  # [M, V], contiguous
        xgr.apply_token_bitmask_inplace(rows_of, bitmask.index_select(0, at))
        logits.index_copy_(0, at, rows_of)

    def release(self, request_id: str) -> None:
        self._states.pop(request_id, None)

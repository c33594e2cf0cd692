"""DeepSeek-V3.1 tokenizer: byte-level BPE via `tokenizers`, the chat template, special ids.

Prompt-injection guard: in V3.1 the role and tool markers (`<｜User｜>`, `<｜tool▁sep｜>`, ...)
are added tokens, so the plain encoder turns their text into the control token wherever it
occurs. `encode_chat` therefore encodes client text (message contents, tool arguments and
results, tool descriptions) with a second encoder built from the same tokenizer.json without
added tokens: such text becomes ordinary byte-level pieces, while the markers the template itself
writes stay single tokens. Mechanism: before rendering, every added-token string in client text
is replaced by a private-use code (`_AddedTokenText.escape`); the rendered prompt is then split at
the added tokens that remain (all the template's), and the text between them is unescaped and
encoded without added tokens. For text with no marker strings the ids equal a plain encode of
the rendered prompt. Fill-in-the-middle prompts (`encode_fim`) encode the client's prefix and
suffix the same way, without added tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers

from backend.text.chat_template import ChatTemplate, Message

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# Every V3.1 added token looks like `<...>` with no `<` or `>` inside (checked at load), so the
# occurrences of added tokens in a text are among the matches of this shape, and never overlap.
_TOKEN_SHAPE = re.compile(r"<[^<>]+>")
_ESC = "\ue000"  # private-use; _ESC + _ESC is a literal _ESC, _ESC + chr(_CODE0 + k) token k
_CODE0 = 0xE100


@dataclass(frozen=True, slots=True)
class SpecialIds:
    """Ids of the control tokens the engine and parsers use (V3.1 values in comments)."""

    bos: int  # 0 <｜begin▁of▁sentence｜>
    eos: int  # 1 <｜end▁of▁sentence｜>
    user: int  # 128803
    assistant: int  # 128804
    think: int  # 128798
    think_end: int  # 128799
    tool_calls_begin: int  # 128806
    tool_calls_end: int  # 128807
    tool_call_begin: int  # 128808
    tool_call_end: int  # 128809
    tool_output_begin: int  # 128812
    tool_output_end: int  # 128813
    tool_sep: int  # 128814
    fim_begin: int  # 128801
    fim_hole: int  # 128800
    fim_end: int  # 128802


_SPECIAL_TEXT = {
    "user": "<｜User｜>",
    "assistant": "<｜Assistant｜>",
    "think": "<think>",
    "think_end": "</think>",
    "tool_calls_begin": "<｜tool▁calls▁begin｜>",
    "tool_calls_end": "<｜tool▁calls▁end｜>",
    "tool_call_begin": "<｜tool▁call▁begin｜>",
    "tool_call_end": "<｜tool▁call▁end｜>",
    "tool_output_begin": "<｜tool▁output▁begin｜>",
    "tool_output_end": "<｜tool▁output▁end｜>",
    "tool_sep": "<｜tool▁sep｜>",
    "fim_begin": "<｜fim▁begin｜>",
    "fim_hole": "<｜fim▁hole｜>",
    "fim_end": "<｜fim▁end｜>",
}


def _token_text(value: Any) -> str:
    """A special token in tokenizer_config.json: a string or {"content": ...}."""
    return value["content"] if isinstance(value, Mapping) else str(value)


def _byte_level_chars() -> dict[str, int]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the rest are shifted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if chr(b) not in chars)
    chars.update({chr(0x100 + n): b for n, b in enumerate(shifted)})
    return chars


def _token_to_bytes(text: str, alphabet: Mapping[str, int]) -> bytes:
    """What the ByteLevel decoder makes of one token string: a token whose characters are all in
    the alphabet maps through it; any other (an added token such as <｜User｜>) is its UTF-8."""
    if all(c in alphabet for c in text):
        return bytes(alphabet[c] for c in text)
    return text.encode()


class _AddedTokenText:
    """Finds, escapes and unescapes added-token strings in text (see the module docstring)."""

    def __init__(self, added: Mapping[str, int]) -> None:
        bad = [t for t in added if not _TOKEN_SHAPE.fullmatch(t)]
        if bad:
            raise ValueError(f"added tokens not of the form <...>: {bad[:3]}")
        self._ids = dict(added)
        self._codes = {text: _ESC + chr(_CODE0 + k) for k, text in enumerate(added)}
        self._texts = {code[1]: text for text, code in self._codes.items()}

    def escape(self, text: str) -> str:
        """`text` with no added-token string left in it; `unescape` restores it exactly."""
        if "<" not in text and _ESC not in text:
            return text
        text = text.replace(_ESC, _ESC + _ESC)
        return _TOKEN_SHAPE.sub(lambda m: self._codes.get(m[0], m[0]), text)

    def unescape(self, text: str) -> str:
        """Inverse of `escape` (also on any run of escaped text cut at added tokens)."""
        if _ESC not in text:
            return text
        parts = text.split(_ESC)
        out = [parts[0]]
        i = 1
        while i < len(parts):
            if parts[i] == "" and i + 1 < len(parts):  # _ESC _ESC
                out.append(_ESC + parts[i + 1])
                i += 2
                continue
            out.append(self._texts[parts[i][0]] + parts[i][1:])
            i += 1
        return "".join(out)

    def split(self, text: str) -> Iterator[str | int]:
        """`text` as a sequence of plain-text runs (str) and added-token ids (int)."""
        start = 0
        for match in _TOKEN_SHAPE.finditer(text):
            token_id = self._ids.get(match[0])
            if token_id is None:
                continue
            if match.start() > start:
                yield text[start : match.start()]
            yield token_id
            start = match.end()
        if start < len(text):
            yield text[start:]


class Tokenizer:
    """Encode and decode V3.1 text and chat prompts. Build with `from_dir`; safe to share."""

    def __init__(self, tokenizer_json: str, config: Mapping[str, Any]) -> None:
        self._full = tokenizers.Tokenizer.from_str(tokenizer_json)
        # Same model and pre-tokenizer (shared, not copied), no added tokens.
        self._plain = tokenizers.Tokenizer(self._full.model)
        self._plain.normalizer = self._full.normalizer
        self._plain.pre_tokenizer = self._full.pre_tokenizer
        decoder = self._full.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, t in decoder.items() if t.special)
        self.added_token_ids: frozenset[int] = frozenset(decoder)  # role, tool and control tokens
        self._added = _AddedTokenText({t.content: i for i, t in decoder.items()})
        self.vocab_size: int = self._full.get_vocab_size(with_added_tokens=True)
        self._alphabet = _byte_level_chars()
        self._bytes: dict[int, bytes] = {}  # filled on demand by token_bytes

        bos, eos = _token_text(config["bos_token"]), _token_text(config["eos_token"])
        ids = {name: self._id(text) for name, text in _SPECIAL_TEXT.items()}
        self.special = SpecialIds(bos=self._id(bos), eos=self._id(eos), **ids)
        self.chat_template = ChatTemplate(config["chat_template"], bos_token=bos, eos_token=eos)

    @classmethod
    def from_dir(cls, model_dir: Path) -> Tokenizer:
        """Load `tokenizer.json` and `tokenizer_config.json` from a checkpoint directory."""
        config = json.loads((model_dir / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
        return cls((model_dir / TOKENIZER_FILE).read_text(encoding="utf-8"), config)

    def _id(self, text: str) -> int:
        token_id = self._full.token_to_id(text)
        if token_id is None:
            raise ValueError(f"token {text!r} is not in the vocabulary")
        return token_id

    def encode(self, text: str, *, add_bos: bool = False, allow_special: bool = True) -> list[int]:
        """Ids of `text`. `allow_special=False` encodes added-token strings as plain bytes."""
        encoder = self._full if allow_special else self._plain
        ids = encoder.encode(text, add_special_tokens=False).ids
        return [self.special.bos, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of `ids`. Skipping drops BOS/EOS/pad only: think and tool markers stay as text."""
        return self._full.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for; b"" for ids past the vocabulary."""
        cached = self._bytes.get(token_id)
        if cached is None:
            text = self._full.id_to_token(token_id) if 0 <= token_id < self.vocab_size else None
            cached = b"" if text is None else _token_to_bytes(text, self._alphabet)
            self._bytes[token_id] = cached
        return cached

    def is_special(self, token_id: int) -> bool:
        """True for tokens `skip_special_tokens` drops (BOS, EOS, pad, placeholders)."""
        return token_id in self._special_ids

    def render_chat(
        self,
        messages: Sequence[Message],
        *,
        thinking: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text, as transformers' apply_chat_template(tokenize=False) writes it."""
        return self.chat_template.render(
            messages, thinking=thinking, tools=tools, add_generation_prompt=add_generation_prompt
        )

    def encode_chat(
        self,
        messages: Sequence[Message],
        *,
        thinking: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Prompt ids for OpenAI-style `messages`; client text never yields an added token.

        The prompt starts with BOS. It ends in <think> (thinking) or </think> after a user turn,
        and in <｜tool▁output▁end｜> after tool results (the template adds no prompt there).
        Raises ChatFormatError for messages or tools it cannot render.
        """
        rendered = self.chat_template.render(
            messages,
            thinking=thinking,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            escape=self._added.escape,
        )
        ids: list[int] = []
        for piece in self._added.split(rendered):
            if isinstance(piece, int):
                ids.append(piece)
            else:
                text = self._added.unescape(piece)
                ids.extend(self._plain.encode(text, add_special_tokens=False).ids)
        return ids

    def count_chat_tokens(
        self,
        messages: Sequence[Message],
        *,
        thinking: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> int:
        """len(encode_chat(...))."""
        return len(
            self.encode_chat(
                messages,
                thinking=thinking,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
            )
        )

    def encode_fim(self, prefix: str, suffix: str) -> list[int]:
        """Fill-in-the-middle prompt ids, DeepSeek's prefix-suffix-middle layout:
        BOS <｜fim▁begin｜> prefix <｜fim▁hole｜> suffix <｜fim▁end｜>; the model writes the middle.
        Client text never yields an added token (`prefix` and `suffix` are encoded without
        them), so the only control tokens are these four."""
        s = self.special
        return [
            s.bos,
            s.fim_begin,
            *self.encode(prefix, allow_special=False),
            s.fim_hole,
            *self.encode(suffix, allow_special=False),
            s.fim_end,
        ]

    def prompt_opens_reasoning(self, prompt_ids: Sequence[int]) -> bool:
        """Whether generation after `prompt_ids` starts inside reasoning (prompt ends in <think>).

        This is the `thinking` flag for OutputParser.
        """
        return bool(prompt_ids) and prompt_ids[-1] == self.special.think

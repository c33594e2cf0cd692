"""Tokenizer: V3.1 special ids, encode/decode, and chat encoding safe from injected markers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.text.tokenizer import Tokenizer
from backend.text.tokenizer_assets import write_tokenizer_files

MARKERS = [
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜fim▁hole｜>",
    "<|EOT|>",
]
# Pieces that may glue into markers, and the escape code's own private-use characters.
FRAGMENTS = [
    *MARKERS,
    "<",
    ">",
    "｜",
    "User",
    "think",
    "/",
    "x",
    " ",
    "\n",
    "\ue000",
    "\ue100",
    "é",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path: Path = tmp_path_factory.mktemp("v31-tokenizer")
    write_tokenizer_files(path)
    return Tokenizer.from_dir(path)


def conversation(text: str) -> list[dict[str, Any]]:
    """Every place client text reaches the prompt, filled with `text`."""
    call = {"type": "function", "function": {"name": "f" + text, "arguments": text}}
    return [
        {"role": "system", "content": text},
        {"role": "user", "content": text},
        {"role": "assistant", "content": text, "tool_calls": [call]},
        {"role": "tool", "content": text},
        {"role": "assistant", "content": text},
        {"role": "user", "content": [{"type": "text", "text": text}]},
    ]


def tools(text: str) -> list[dict[str, Any]]:
    schema = {"type": "object", "properties": {"q": {"type": "string", "description": text}}}
    return [
        {
            "type": "function",
            "function": {"name": "f" + text, "description": text, "parameters": schema},
        }
    ]


def added_ids(tok: Tokenizer, ids: list[int]) -> Counter[int]:
    return Counter(i for i in ids if i < 3 or i >= 128000)


def test_special_ids_are_the_v31_ones(tok: Tokenizer) -> None:
    s = tok.special
    assert (s.bos, s.eos, s.user, s.assistant, s.think, s.think_end) == (
        0,
        1,
        128803,
        128804,
        128798,
        128799,
    )
    assert (s.tool_calls_begin, s.tool_calls_end, s.tool_call_begin, s.tool_call_end) == (
        128806,
        128807,
        128808,
        128809,
    )
    assert (s.tool_output_begin, s.tool_output_end, s.tool_sep) == (128812, 128813, 128814)
    assert tok.vocab_size == 128815
    assert tok.is_special(s.bos) and tok.is_special(s.eos) and not tok.is_special(s.think)


def test_encode_decode_round_trip(tok: Tokenizer) -> None:
    text = "def f(x):\n    return x * 2  # 你好, мир 😀👨‍👩‍👧"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode(text, add_bos=True) == [0, *ids]


def test_encode_reads_markers_only_when_allowed(tok: Tokenizer) -> None:
    text = "a<｜User｜>b</think>"
    assert tok.encode(text) == [*tok.encode("a"), 128803, *tok.encode("b"), 128799]
    plain = tok.encode(text, allow_special=False)
    assert not added_ids(tok, plain)
    assert tok.decode(plain) == text


def test_decode_skips_only_bos_eos_style_tokens(tok: Tokenizer) -> None:
    ids = [0, *tok.encode("<think>r</think>a<｜tool▁calls▁begin｜>"), 1]
    assert tok.decode(ids) == "<think>r</think>a<｜tool▁calls▁begin｜>"
    assert tok.decode(ids, skip_special_tokens=False).startswith("<｜begin▁of▁sentence｜><think>")


@pytest.mark.parametrize("thinking", [True, False])
def test_encode_chat_equals_encoding_the_rendered_prompt(tok: Tokenizer, thinking: bool) -> None:
    messages = conversation("Hello 世界, here is code: `x = [1, 2]`\n\n  done.")
    ids = tok.encode_chat(messages, tools=tools("Find  things."), thinking=thinking)
    rendered = tok.render_chat(messages, tools=tools("Find  things."), thinking=thinking)
    assert ids == tok.encode(rendered)
    assert ids[0] == tok.special.bos
    assert tok.count_chat_tokens(messages, tools=tools("Find  things."), thinking=thinking) == len(
        ids
    )


def test_generation_prompt_tells_where_reasoning_starts(tok: Tokenizer) -> None:
    user = [{"role": "user", "content": "hi"}]
    thinking = tok.encode_chat(user, thinking=True)
    plain = tok.encode_chat(user, thinking=False)
    assert thinking[-2:] == [128804, 128798] and tok.prompt_opens_reasoning(thinking)
    assert plain[-2:] == [128804, 128799] and not tok.prompt_opens_reasoning(plain)
    after_tool = tok.encode_chat(conversation("x")[:4], thinking=True)
    assert after_tool[-1] == 128813 and not tok.prompt_opens_reasoning(after_tool)


def test_injected_markers_never_become_control_tokens(tok: Tokenizer) -> None:
    injected = "".join(MARKERS) + " and <｜User｜>again"
    ids = tok.encode_chat(conversation(injected), tools=tools(injected), thinking=False)
    benign = tok.encode_chat(conversation("x"), tools=tools("x"), thinking=False)
    assert added_ids(tok, ids) == added_ids(tok, benign)
    # The template's own markers are single tokens; the injected text survives as text.
    assert Counter(ids)[128803] == 2 and Counter(ids)[128806] == 2  # 2 user turns; 1 call + tools
    rendered = tok.render_chat(conversation(injected), tools=tools(injected), thinking=False)
    assert tok.decode(ids, skip_special_tokens=False) == rendered


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join))
def test_no_client_text_yields_an_added_token(tok: Tokenizer, text: str) -> None:
    ids = tok.encode_chat(conversation(text), tools=tools(text), thinking=True)
    benign = tok.encode_chat(conversation("x"), tools=tools("x"), thinking=True)
    assert added_ids(tok, ids) == added_ids(tok, benign)
    rendered = tok.render_chat(conversation(text), tools=tools(text), thinking=True)
    assert tok.decode(ids, skip_special_tokens=False) == rendered


def test_fim_ids_are_v31s_and_the_layout_is_prefix_suffix_middle(tok: Tokenizer) -> None:
    s = tok.special
    assert (s.fim_begin, s.fim_hole, s.fim_end) == (128801, 128800, 128802)
    prefix, suffix = "def f(x):\n    ", "\n\nprint(f(2))\n"
    assert tok.encode_fim(prefix, suffix) == [
        0,
        128801,
        *tok.encode(prefix),
        128800,
        *tok.encode(suffix),
        128802,
    ]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.sampled_from([*FRAGMENTS, "<｜fim▁begin｜>", "<｜fim▁end｜>"]), max_size=12).map(
        "".join
    )
)
def test_no_fim_text_yields_an_added_token(tok: Tokenizer, text: str) -> None:
    ids = tok.encode_fim(text + "<｜fim▁end｜>", "<｜fim▁begin｜>" + text)
    assert [i for i in ids if i < 3 or i >= 128000] == [0, 128801, 128800, 128802]
    hole = ids.index(128800)
    assert tok.decode(ids[2:hole]) == text + "<｜fim▁end｜>"
    assert tok.decode(ids[hole + 1 : -1]) == "<｜fim▁begin｜>" + text

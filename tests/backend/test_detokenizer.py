"""IncrementalDetokenizer: exact text, never half a character, markers kept as text."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.text.detokenizer import IncrementalDetokenizer
from backend.text.tokenizer import Tokenizer
from backend.text.tokenizer_assets import write_tokenizer_files

MIXED = (
    "Hello, 世界! Ünïcödé naïve café — “quotes” … 😀👍🏽👨‍👩‍👧‍👦🇫🇷 𝔘𝔫𝔦\n"
    "```python\ndef 加(a: int, b: int) -> int:\n    return a + b  # ✓ 完了\n```\n"
    "日本語のテキスト、한국어 텍스트, العربية, עברית, ไทย.\t<b>&amp;</b>"
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path: Path = tmp_path_factory.mktemp("v31-tokenizer")
    write_tokenizer_files(path)
    return Tokenizer.from_dir(path)


def stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.push(i) for i in ids] + [detok.flush()]


def test_streaming_mixed_text_reproduces_it_exactly(tok: Tokenizer) -> None:
    ids = tok.encode(MIXED)
    pieces = stream(IncrementalDetokenizer(tok), ids)
    assert "".join(pieces) == MIXED
    assert not any("\ufffd" in piece for piece in pieces)
    # Some characters are split across tokens, so some pushes must have held bytes back.
    assert pieces.count("") > 1
    assert len(ids) > len(MIXED) // 4


def test_markers_come_out_as_text_and_bos_eos_are_skipped(tok: Tokenizer) -> None:
    text = "<think>why</think>Sure<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
    ids = [tok.special.bos, *tok.encode(text), tok.special.eos]
    assert "".join(stream(IncrementalDetokenizer(tok), ids)) == text
    kept = "".join(stream(IncrementalDetokenizer(tok, skip_special_tokens=False), ids))
    assert kept == "<｜begin▁of▁sentence｜>" + text + "<｜end▁of▁sentence｜>"


def test_prompt_ending_inside_a_character_is_completed(tok: Tokenizer) -> None:
    ids = tok.encode("ok😀")
    split = next(n for n in range(1, len(ids)) if "\ufffd" in tok.decode(ids[:n]))
    prompt, generated = ids[:split], ids[split:]
    with_context = "".join(stream(IncrementalDetokenizer(tok, prompt_ids=prompt), generated))
    assert with_context == "😀"
    without = "".join(stream(IncrementalDetokenizer(tok), generated))
    assert "\ufffd" in without


def test_unfinished_character_at_the_end_becomes_replacement(tok: Tokenizer) -> None:
    ids = tok.encode("😀")
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tok)
    assert [detok.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.flush() == "\ufffd"


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ids=st.lists(
        st.one_of(
            st.integers(0, 129279),  # the whole embedding, past the vocabulary too
            st.integers(0, 2),
            st.integers(128790, 128815),
        ),
        max_size=30,
    ),
    skip=st.booleans(),
)
def test_pieces_equal_whole_decode_for_any_ids(tok: Tokenizer, ids: list[int], skip: bool) -> None:
    pieces = stream(IncrementalDetokenizer(tok, skip_special_tokens=skip), ids)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)

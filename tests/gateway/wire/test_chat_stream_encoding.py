"""The chat stream's text chunks, byte for byte: whatever the text (quotes, escapes, NULs, line
separators, non-BMP characters) and whatever the completion id and model name, each content or
reasoning chunk is the chunk's JSON (keys in the order every other chunk has) in one SSE frame."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gateway.wire.chat_response import ChatStreamEncoder
from plumbing import jsoncodec
from providers.types import Event, ReasoningDelta, TextDelta

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
deltas = st.lists(
    st.one_of(texts.map(TextDelta), texts.map(ReasoningDelta)), min_size=1, max_size=8
)
names = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=20)


def _frame(head: dict[str, Any], delta: dict[str, Any]) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    return b"data: " + jsoncodec.dumps({**head, "choices": [choice]}) + b"\n\n"


@given(events=deltas, completion_id=names, model=names, opened=st.booleans())
def test_text_chunks_are_the_chunk_json(
    events: list[Event], completion_id: str, model: str, opened: bool
) -> None:
    encoder = ChatStreamEncoder(completion_id, model, include_usage=False)
    first = encoder.start() if opened else None
    frames = [encoder.encode(event) for event in events]
    sample = first or frames[0]
    assert sample is not None
    created = json.loads(sample[len(b"data: ") :])["created"]
    head = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }
    role = {"role": "assistant"}
    if first is not None:
        assert first == _frame(head, {**role, "content": ""})
        role = {}
    for event, frame in zip(events, frames, strict=True):
        assert isinstance(event, TextDelta | ReasoningDelta)
        field = "content" if isinstance(event, TextDelta) else "reasoning_content"
        assert frame == _frame(head, {**role, field: event.text})
        role = {}


def test_a_text_with_logprobs_carries_them() -> None:
    encoder = ChatStreamEncoder("chatcmpl-1", "m", include_usage=False)
    encoder.start()
    entries = [{"token": "a", "logprob": -0.5, "top_logprobs": []}]
    frame = encoder.encode(TextDelta("a", logprobs=entries))
    assert frame is not None
    choice = json.loads(frame[len(b"data: ") :])["choices"][0]
    assert choice["delta"] == {"content": "a"}
    assert choice["logprobs"] == {"content": entries}

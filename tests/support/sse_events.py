"""Reading the SSE frames of a Responses API stream, and checking their order and shape."""

from __future__ import annotations

import json
from typing import Any


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The events of a Responses stream: `event: <type>\\ndata: <json>\\n\\n` frames whose
    `type` matches the event line, numbered 0, 1, 2, ... by `sequence_number`."""
    text = raw.decode()
    assert text.endswith("\n\n"), "the stream must end with a complete frame"
    events = []
    for frame in text.split("\n\n")[:-1]:
        event_line, data_line = frame.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: "), frame
        payload = json.loads(data_line[len("data: ") :])
        assert payload["type"] == event_line[len("event: ") :]
        events.append(payload)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def check_stream(events: list[dict[str, Any]], last: str = "response.completed") -> dict[str, Any]:
    """Asserts Codex's ordering rules; returns the final response object. A failed response
    presents no partial item as done: items left open stand in its output as "incomplete"."""
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["status"] == "in_progress"
    assert events[-1]["type"] == last
    final = events[-1]["response"]
    assert events[0]["response"]["id"] == final["id"] and final["id"].startswith("resp_")
    added: dict[str, dict[str, Any]] = {}
    done: dict[str, dict[str, Any]] = {}
    parts_open: set[str] = set()
    for event in events[2:-1]:
        kind = event["type"]
        if kind == "response.output_item.added":
            assert event["item"]["status"] == "in_progress"
            added[event["item"]["id"]] = event
        elif kind == "response.content_part.added":
            assert event["item_id"] in added and event["item_id"] not in done
            parts_open.add(event["item_id"])
        elif kind == "response.content_part.done":
            parts_open.discard(event["item_id"])
        elif kind in DELTAS:
            assert event["item_id"] in added and event["item_id"] not in done, kind
            if kind == "response.output_text.delta":
                assert event["item_id"] in parts_open, "content_part.added must come first"
        elif kind == "response.output_item.done":
            assert event["item"]["id"] not in parts_open, "content_part.done must come first"
            done[event["item"]["id"]] = event
        assert kind not in ("response.completed", "response.failed")
    finished = [item for item in final["output"] if item["id"] in done]
    if last == "response.failed":
        assert done.keys() <= added.keys()
        assert all(i["status"] == "incomplete" for i in final["output"] if i["id"] not in done)
    else:
        assert added.keys() == done.keys() and finished == final["output"]
    assert [done[i]["item"] for i in sorted(done, key=lambda i: done[i]["output_index"])] == (
        finished
    )
    return final


DELTAS = (
    "response.output_text.delta",
    "response.function_call_arguments.delta",
    "response.reasoning_summary_text.delta",
)

"""The normalized contract between the gateway and whatever answers a request.

Every front-end protocol (chat completions, completions, ...) parses into a `ChatRequest` and
encodes a stream of `Event`s; every provider (upstream HTTP, the local engine) consumes a
`ChatRequest` and produces `Event`s. Nothing here knows about HTTP on the client side.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, Literal

from plumbing.record import record

Role = Literal["system", "developer", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


@record
class ToolCall:
    """A complete tool call in a message of the history (or in a final answer)."""

    id: str
    name: str
    arguments: str  # JSON text, "{}" when the call has no arguments


@record
class Message:
    """One message of the conversation.

    `content` is plain text, or the raw list of OpenAI content parts when the client sent parts
    (kept as-is so an upstream receives exactly what the client sent; `text` flattens them).
    """

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def openai_dict(self) -> dict[str, Any]:
        """The message as the OpenAI chat API (and the chat template) spells it; reasoning is
        left to the caller, whose policy on earlier reasoning differs."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    @property
    def text(self) -> str:
        """The message's text: string content, or the text parts joined."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(
            str(part.get("text", "")) for part in self.content if part.get("type") == "text"
        )


@record
class Tool:
    """A function tool the model may call. `parameters` is a JSON schema; `strict`: the
    client asks for arguments that follow it exactly (OpenAI's `strict`)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False


@record
class Sampling:
    """Sampling parameters; None means "the provider's or model's default"."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    # A reasoning budget (the key's policy): the local engine ends thinking after this many
    # reasoning tokens; upstreams get the nearest parameter they accept.
    max_reasoning_tokens: int | None = None


@record
class PreparedPrompt:
    """A prompt tokenized once, off the event loop, by the provider that will serve it (its
    `owner`), and carried forward: the router reads its length, admission reserves by it, the
    engine runs its ids and usage reports its count. `thinking`: the switch the ids end with.
    `block_hashes`: the engine's chained hashes (backend/engine/block_hash.py) of the leading
    full blocks it may take from its prefix cache (all but the block holding the last token, so
    switching thinking, which changes only the last token, keeps them), hashed while preparing
    so that the router and the cluster placer look the prefix up without hashing on the loop."""

    owner: str
    ids: list[int]
    thinking: bool
    parse: bool  # chat: parse reasoning and tool calls; completion: plain text
    opens_reasoning: bool  # the prompt ends in <think>: output starts as reasoning
    tools_enabled: bool
    block_hashes: tuple[bytes, ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.ids)


@record
class ProviderLoad:
    """How busy a provider is now, for routing: requests `waiting` for a slot, `running` of
    `slots`, and the longest prompt plus output it can hold (`max_context`)."""

    waiting: int
    running: int
    slots: int
    max_context: int

    def queue_after(self) -> int:
        """Requests that would wait, one more included, were one more added now."""
        return max(0, self.running + self.waiting + 1 - self.slots)


@record
class EngineFit:
    """Where a prepared prompt would run now, for the router's local-or-upstream choice:
    `peer` None is this process's engine, else the cluster node the placer would forward it to
    (with the requests `peer_waiting` there, as it last published them); `cached_tokens`: how
    many of the prompt's leading tokens that engine holds in its prefix cache."""

    cached_tokens: int
    peer: str | None = None
    peer_waiting: int = 0

    def queue_after(self, local_queue: int) -> int:
        """Requests that would wait where the prompt runs, this one included: `local_queue`
        (`ProviderLoad.queue_after()`) on this engine; on a peer, its waiting ones and this one
        when any wait (a peer's running count is not published, so a full peer with nobody
        waiting counts as free)."""
        if self.peer is None:
            return local_queue
        return self.peer_waiting + 1 if self.peer_waiting else 0


@record
class ChatRequest:
    """A normalized chat request.

    `model` is the provider-side model id (the router rewrites it from the public alias).
    `thinking`: True/False forces DeepSeek thinking on/off, None leaves the provider's default.
    `tool_choice`: "auto" | "none" | "required" | {"type": "function", "function": {"name"}}.
    `response_format`: the client's object in Chat Completions' shape, passed through to
    upstreams; the local engine enforces it (providers/local/structured.py).
    `extra`: provider-specific fields a client sent that a pass-through upstream may want.
    `anthropic_body`: the client's own Messages API body, for an upstream that speaks Messages
    (sent as it came, nothing lost in translation); None for other front-end protocols.
    """

    model: str
    messages: tuple[Message, ...]
    sampling: Sampling = field(default_factory=Sampling)
    tools: tuple[Tool, ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    thinking: bool | None = None
    stream: bool = False
    user: str | None = None
    request_id: str = ""
    # Legacy /v1/completions: a raw prompt instead of messages (no chat template applied).
    prompt: str | None = None
    # Fill in the middle: the text after the gap, with `prompt` the text before it (never
    # thinking; only providers that can fill in the middle serve it).
    suffix: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # The prompt as the serving provider prepared it (None: the provider prepares it itself).
    prepared: PreparedPrompt | None = None
    anthropic_body: dict[str, Any] | None = None
    # Set by the gateway: the index of the account (of a provider with several) the request
    # goes to; None: the provider picks by the conversation.
    account: int | None = None


# ---- events a provider yields, in order -------------------------------------------------------


@record
class Placed:
    """Where the provider is sending the request, for the route explanation ("node=b;
    prefix=12/14; via=forward", "account=2/3"). Only before any other event; a later one
    replaces an earlier one (a forward that fell back to this node)."""

    placement: str


@record
class TextDelta:
    text: str
    logprobs: list[dict[str, Any]] | None = None  # OpenAI-shaped logprob entries, when asked


@record
class ReasoningDelta:
    """`signature`: the provider's own signature of the reasoning block this delta ends
    (Anthropic's), carried back to Messages clients; None from every other provider."""

    text: str
    signature: str | None = None


@record
class ToolCallDelta:
    """A fragment of tool call number `index`.

    The first fragment of a call carries `id` and `name`; later ones only `arguments_fragment`.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments_fragment: str = ""


@record
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_prompt_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


# The largest token count taken from an upstream's usage: no answer comes within orders of
# magnitude of it, and a day's sums of such counts stay inside Redis's 64-bit counters.
MAX_TOKEN_COUNT = 2**31 - 1


def token_count(value: object) -> int:
    """A count from an upstream's usage: None is 0; a whole number (an integral float or a
    numeric string too) from 0 to MAX_TOKEN_COUNT; anything else is a ValueError (the answer
    cannot be trusted, nor charged)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"a token count must be a number, not {type(value).__name__}")
    number = value if isinstance(value, int) else float(value)
    if not 0 <= number <= MAX_TOKEN_COUNT or number != int(number):
        raise ValueError(f"token count out of range: {str(value)[:40]}")
    return int(number)


@record
class Finish:
    """`stop_sequence`: the stop string that ended the output, where the provider says which."""

    reason: FinishReason
    stop_sequence: str | None = None


Event = Placed | TextDelta | ReasoningDelta | ToolCallDelta | Usage | Finish

"""The ask of a request: the user's instruction, apart from the material it carries.

`ask_of(request)` reads the turn being decided (the last message) and returns an `Ask`:
  instruction  the words the user wrote as the request, at most `_MAX_INSTRUCTION` characters
               (its head and tail when longer): what rules match and the model scores;
  material     the kinds of material carried around it (`MATERIAL_KINDS`) and their size in
               characters, features of their own, so pasted text never reads as a long ask;
  client       the agent whose wrapper was recognised: cline | claude-code | codex | plain;
  turn         how the turn is classified (below), and `earlier` (user turns before it).

What counts as material, removed from the instruction:
  - client context blocks: Cline's <environment_details>, <file_content>, `[tool for 'x'] Result:`
    messages; Claude Code's <system-reminder>; Codex's <environment_context>, `# AGENTS.md
    instructions` with <INSTRUCTIONS>, <user_instructions>; Cline's <task> and <feedback> hold
    the instruction itself;
  - fenced code blocks (```), and XML-like document blocks (<document>, <file>, <log>, ...);
    these and the pasted lines below are found by `pasted.py`;
  - lines that look pasted: log lines (a timestamp or level first), stack-trace frames, quoted
    lines ("> "), indented or symbol-heavy code, `key: value` / `key = value` configuration
    lines; e-mail headers and labelled sentences ("ACTION: Ana to send the deck") are prose;
  - in a long text of several paragraphs, the paragraphs between the first and the last (a pasted
    document), and everything after a lead-in ending in a colon ("Here is the log:", "内容如下：");
    what is left out of these reads as prose (mail, minutes, articles, notices: kind "prose")
    when its lines are sentences, not code, logs or configuration (found by `instruction.py`);
  - long quoted text inside the ask ("Translate this: '...'", 把“...”改写一下), left as “…”.

How a turn is classified (`turn`):
  "tool"      the last message is a tool result (role tool, or Cline's `[tool] Result:` user
              message): the work goes on, so the conversation keeps its mode;
  "continue"  a user turn with no ask of its own ("continue", "go on", "yes, do it", "继续"):
              also keeps the mode;
  "new"       anything else, a follow-up included ("now format it as a table", a new question
              after small talk): judged anew on its own ask.
For "tool" and "continue" turns, `anchor` is the ask of the latest user turn that was "new" (the
work being continued); the judge falls back to it when the conversation has no stored mode.
"""

from __future__ import annotations

import re
from typing import Literal

from gateway.routing.instruction import instruction_of
from gateway.routing.pasted import (
    code_kind,
    document_kind,
    remove_documents,
    remove_fences,
    split_lines,
)
from plumbing.record import record
from providers.types import ChatRequest, Message

Turn = Literal["new", "continue", "tool"]
Unwrapped = tuple[str | None, str]  # see _unwrapped
MATERIAL_KINDS = (
    "context", "code", "log", "trace", "config", "quote", "prose", "document", "tool"
)  # fmt: skip
_MAX_INSTRUCTION = 300  # characters scored: the ask's head (2/3) and tail (1/3) beyond it
_MAX_SCAN = 20_000  # characters of one message read at all (bounded cost)

# Client wrappers: blocks removed whole (context), and blocks whose body is the instruction.
# A context block runs from its opening tag to its closing tag or the end (`_without_context`).
_CONTEXT_OPEN = re.compile(
    r"<(environment_details|system-reminder|environment_context|user_instructions|INSTRUCTIONS"
    r"|file_content|context|attachments?)\b[^>]*>"
)
_AGENTS_MD = re.compile(r"^# AGENTS\.md instructions for [^\n]*\n?", re.M)
_INSTRUCTION_BLOCK = re.compile(r"<(task|feedback|user_message|user_query)>(.*?)(?:</\1>|\Z)", re.S)
_CLINE_RESULT = re.compile(r"^\[([a-z_]+)(?: for [^\]]*)?\] Result:", re.M)
# Text quoted inside the ask ("translate this: '...'", 把这句“...”翻译成英文) is material too, when
# long enough not to be a name or a phrase the ask is about.
_QUOTE_MARKS = re.compile(r"[\"“‘「『']")
_QUOTED = re.compile(
    r"\"[^\"\n]{40,}\"|“[^”]{24,}”|‘[^’]{40,}’|「[^」]{24,}」|『[^』]{24,}』"
    r"|'(?<=[\s:：]')[^'\n]{40,}'(?=[\s.,;:?!)]|$)"
)  # every alternative starts with its quote mark, so the regex engine skips to those


# A user turn that continues the work without an ask of its own (the whole ask, lower-cased,
# punctuation stripped).
_CONTINUE = re.compile(
    r"^(?:(?:ok|okay|yes|yep|sure|good|great|thanks|thank you|please)\s*)*"
    r"(?:continue|go on|keep going|go ahead|proceed|carry on|do it|next|and|and then|more"
    r"|finish it|resume|try again|retry|same for the rest|do the rest)(?: please)?$"
    r"|^(?:ok|okay|yes|yep|sure)$"
    r"|^(?:好的?|嗯|是的?|对|可以|谢谢)?\s*(?:继续|接着来?|接着说|然后呢|请继续|下一步|再来|重试|行)$"
    # the same in Japanese, Korean, German, French, Spanish, Portuguese and Russian
    r"|^(?:ok|okay|ja|oui|sí|si|sim|да|はい|네|bitte|s'il te plaît|por favor|пожалуйста)?\s*"
    r"(?:weiter|mach weiter|weitermachen|fortfahren|continue[rz]?|vas-y|la suite|continúa|continua"
    r"|sigue|seguir|siga|continue aí|continua aí|vai|продолжай(?:те)?|дальше|давай дальше|続けて"
    r"|続き|続きを|どうぞ|계속|계속해|계속해\s*줘|계속\s*해\s*줘)"
    r"(?:\s*(?:bitte|s'il te plaît|por favor|пожалуйста|ください|주세요))?$"
)
_PUNCT = re.compile(r"[\s.,!?;:。，！？；：…~\-¡¿、]+")


@record
class Ask:
    instruction: str  # the user's words, at most _MAX_INSTRUCTION characters
    material: tuple[str, ...]  # kinds, in the order of MATERIAL_KINDS
    material_chars: int
    client: str  # cline | claude-code | codex | plain
    turn: Turn
    earlier: int  # user turns before this one
    anchor: Ask | None = None  # for tool/continue turns: the ask being continued


def ask_of(request: ChatRequest) -> Ask:
    """The ask of the request's last turn (a completion's prompt is one user turn)."""
    if request.prompt is not None:
        return _user_ask(request.prompt, "plain", 0, "new")
    messages = request.messages
    client = _client(messages)
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    last = _last_turn(messages, users)
    if last is None:
        return Ask("", (), 0, client, "new", 0)
    message = messages[last]
    turn, unwrapped = _classify(message)
    earlier = sum(1 for i in users if i < last)
    if turn == "new":
        return _user_ask(message.text, client, earlier, "new", unwrapped)
    anchor = _anchor(messages, users, last, client)
    if turn == "tool":
        return Ask("", ("tool",), len(message.text), client, turn, earlier, anchor)
    instruction = _user_ask(message.text, client, earlier, turn, unwrapped).instruction
    return Ask(instruction, (), 0, client, turn, earlier, anchor)


def turn_of(request: ChatRequest) -> Turn:
    """How the request's last turn is classified (see the module), without reading its
    material: what decides whether the conversation's stored mode is needed."""
    if request.prompt is not None:
        return "new"
    messages = request.messages
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    last = _last_turn(messages, users)
    return "new" if last is None else _turn_of(messages[last])


def _last_turn(messages: tuple[Message, ...], users: list[int]) -> int | None:
    """The index of the turn being decided: the last message, or with an assistant prefill
    last, the user turn before it."""
    if not users:
        return None
    return len(messages) - 1 if messages[-1].role in ("user", "tool") else users[-1]


def _anchor(
    messages: tuple[Message, ...], users: list[int], before: int, client: str
) -> Ask | None:
    """The latest user turn before `before` that asks something of its own."""
    earlier = [u for u in users if u < before]
    for n in range(len(earlier) - 1, -1, -1):
        message = messages[earlier[n]]
        turn, unwrapped = _classify(message)
        if turn != "new":
            continue
        ask = _user_ask(message.text, client, n, "new", unwrapped)
        if ask.instruction:
            return ask
    return None


def _turn_of(message: Message) -> Turn:
    return _classify(message)[0]


def _classify(message: Message) -> tuple[Turn, Unwrapped | None]:
    """The turn's kind and, for a user turn, its text unwrapped (`_unwrapped`), which reading
    its ask needs again."""
    if message.role == "tool":
        return "tool", None
    text = message.text[:_MAX_SCAN]
    result = _CLINE_RESULT.match(text)
    if result is not None and result.group(1) != "attempt_completion":
        return "tool", None
    if result is not None and "<feedback>" not in text:
        return "tool", None
    unwrapped = _unwrapped(text)
    instruction = text
    if "<" in text:
        wrapped, stripped = unwrapped
        instruction = stripped if wrapped is None else wrapped
    head = instruction[:200].lower()
    if len(head) > 64 and len(_PUNCT.sub(" ", head[:64]).strip()) > 40:
        return "new", unwrapped  # the whole head's words are no shorter: not a "continue"
    words = _PUNCT.sub(" ", head).strip()
    if not words and text.strip():
        # context only (a Codex environment message): the work goes on
        return "continue", unwrapped
    if words and len(words) <= 40 and _CONTINUE.match(words):
        return "continue", unwrapped
    return "new", unwrapped


def _client(messages: tuple[Message, ...]) -> str:
    for message in messages[:4]:
        head = message.text[:400]
        if message.role == "system":
            if "You are Cline" in head:
                return "cline"
            if "Claude Code" in head:
                return "claude-code"
            if "Codex" in head:
                return "codex"
        elif message.role == "user":
            if "<environment_context>" in head or head.startswith("# AGENTS.md"):
                return "codex"
            if "<task>" in head or "<environment_details>" in head:
                return "cline"
            if "<system-reminder>" in head:
                return "claude-code"
    return "plain"


def _without_context(text: str) -> str:
    """`text` without its context blocks, each from its opening tag to the next closing tag of
    its name or the end: the closing tag found by `str.find` (a lazy regex up to it cost
    18 us on a 1.4 KB block)."""
    kept: list[str] = []
    pos = 0
    while (opening := _CONTEXT_OPEN.search(text, pos)) is not None:
        closing = f"</{opening.group(1)}>"
        end = text.find(closing, opening.end())
        kept.append(text[pos : opening.start()])
        pos = len(text) if end == -1 else end + len(closing)
    kept.append(text[pos:])
    return "".join(kept)


def _strip_wrappers(text: str) -> str | None:
    """The instruction inside a client's wrapper (<task>, <feedback>), None when there is no
    such block."""
    found = [m.group(2) for m in _INSTRUCTION_BLOCK.finditer(text)]
    return "\n".join(found).strip() if found else None


def _unwrapped(text: str) -> Unwrapped:
    """(the instruction inside the client's <task>/<feedback> blocks, None without them; `text`
    without its context blocks and AGENTS.md heading)."""
    tagged = "<" in text  # the regexes below run only where they can match
    wrapped = _strip_wrappers(text) if tagged else None
    stripped = _without_context(text) if tagged else text
    if "AGENTS.md" in stripped:
        stripped = _AGENTS_MD.sub("", stripped)
    return wrapped, stripped


def _user_ask(
    raw: str, client: str, earlier: int, turn: Turn, unwrapped: Unwrapped | None = None
) -> Ask:
    """`unwrapped`: `_unwrapped` of the text's first `_MAX_SCAN` characters, where it was read
    already (classifying the turn)."""
    text = raw[:_MAX_SCAN]
    kinds: set[str] = set()
    material = len(raw) - len(text)
    wrapped, stripped = _unwrapped(text) if unwrapped is None else unwrapped
    if wrapped is not None or len(stripped) < len(text):
        kinds.add("context")
        material += len(text) - len(stripped)
    if wrapped is not None:
        stripped = wrapped
    body, code = remove_fences(stripped) if "```" in stripped else (stripped, "")
    if code:
        kinds.add(code_kind(code))
    body, docs = remove_documents(body) if "<" in body else (body, "")
    if docs:
        kinds.add(document_kind(docs))
    material += len(code) + len(docs)
    prose, pasted = split_lines(body, kinds)
    material += pasted
    instruction = instruction_of(prose, kinds, body)
    material += max(len("\n".join(prose)) - len(instruction), 0)
    if _QUOTE_MARKS.search(instruction) is not None:
        quoted = len(instruction)
        instruction = _QUOTED.sub("“…”", instruction)
        if len(instruction) < quoted:
            kinds.add("quote")
            material += quoted - len(instruction)
    ordered = tuple(k for k in MATERIAL_KINDS if k in kinds)
    return Ask(_clip(instruction), ordered, material, client, turn, earlier)


def _clip(text: str) -> str:
    if len(text) <= _MAX_INSTRUCTION:
        return text
    head = _MAX_INSTRUCTION * 2 // 3
    return f"{text[:head]}\n{text[head - _MAX_INSTRUCTION :]}"

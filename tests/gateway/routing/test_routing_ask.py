"""The ask apart from its material: each client's wrapper, pasted material, and how a turn is
classified (new, continue, tool)."""

from __future__ import annotations

from gateway.routing.ask import ask_of, turn_of
from providers.types import ChatRequest, Message, ToolCall

CLINE_SYSTEM = "You are Cline, a highly skilled software engineer.\n\n====\n\nTOOL USE\n..."
CLAUDE_SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude.\n..."
CODEX_SYSTEM = "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI."
ENVIRONMENT = (
    "<environment_details>\n# VSCode Visible Files\nsrc/app.py\n\n# Current Time\n"
    "11/9/2025, 11:05:40 PM\n\n# Current Working Directory (/srv/x) Files\npyproject.toml\n"
    "src/app.py\nsrc/scheduler.py\ntests/test_deadlock.py\n\n# Current Mode\nACT MODE\n"
    "</environment_details>"
)
REMINDER = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
    "# claudeMd\nContents of CLAUDE.md: debug the race condition tests before finishing; design "
    "notes in docs/architecture.md.\n</system-reminder>\n"
)
AGENTS_MD = (
    "# AGENTS.md instructions for /home/dev/shop\n\n<INSTRUCTIONS>\n## Build & test\n"
    "- `make test` runs unit tests; prove every invariant with a test.\n</INSTRUCTIONS>"
)
CODEX_ENV = (
    "<environment_context>\n  <cwd>/home/dev/shop</cwd>\n  <approval_policy>on-request"
    "</approval_policy>\n  <sandbox_mode>workspace-write</sandbox_mode>\n</environment_context>"
)
LOG = "\n".join(
    f"2025-11-22 03:14:0{i}.221 ERROR [pool-3-thread-{i}] OrderService - possible deadlock, "
    f"lock wait exceeded 5000ms for key=inventory:SKU-{i}"
    for i in range(8)
)


def request(*messages: Message) -> ChatRequest:
    return ChatRequest(model="m", messages=messages)


def test_cline_task_is_the_ask_and_environment_details_are_context() -> None:
    text = f"<task>\nRename `load` to `load_config` in src/app.py.\n</task>\n\n{ENVIRONMENT}"
    ask = ask_of(request(Message("system", CLINE_SYSTEM), Message("user", text)))
    assert ask.instruction == "Rename `load` to `load_config` in src/app.py."
    assert (ask.client, ask.turn, ask.material) == ("cline", "new", ("context",))
    assert ask.material_chars >= len(ENVIRONMENT)


def test_cline_tool_results_continue_and_feedback_is_a_new_ask() -> None:
    first = Message("user", f"<task>\nfind why the scheduler deadlocks\n</task>\n{ENVIRONMENT}")
    called = Message("assistant", "<read_file>\n<path>src/scheduler.py</path>\n</read_file>")
    result = Message(
        "user", f"[read_file for 'src/scheduler.py'] Result:\nimport threading\n{ENVIRONMENT}"
    )
    ask = ask_of(request(Message("system", CLINE_SYSTEM), first, called, result))
    assert (ask.turn, ask.instruction, ask.material) == ("tool", "", ("tool",))
    assert ask.anchor is not None and ask.anchor.instruction == "find why the scheduler deadlocks"
    feedback = Message(
        "user",
        "[attempt_completion] Result:\n\nThe user has provided feedback on the results.\n"
        f"<feedback>\nperfect. what files did you touch?\n</feedback>\n\n{ENVIRONMENT}",
    )
    ask = ask_of(request(Message("system", CLINE_SYSTEM), first, called, result, feedback))
    assert (ask.turn, ask.instruction) == ("new", "perfect. what files did you touch?")


def test_claude_code_reminders_are_context_and_tool_results_continue() -> None:
    opened = "<system-reminder>\nThe user opened src/app.py in the IDE.\n</system-reminder>\n"
    text = f"{REMINDER}{opened}Add a docstring to parse_args."
    user = Message("user", text)
    ask = ask_of(request(Message("system", CLAUDE_SYSTEM), user))
    assert ask.instruction == "Add a docstring to parse_args."
    assert (ask.client, ask.material) == ("claude-code", ("context",))
    call = ToolCall("call_1", "Read", '{"file_path": "src/app.py"}')
    called = Message("assistant", "", tool_calls=(call,))
    result = Message("tool", "     1\tdef parse_args():\n     2\t    ...", tool_call_id="call_1")
    follow = request(Message("system", CLAUDE_SYSTEM), user, called, result)
    ask = ask_of(follow)
    assert ask.turn == "tool" and turn_of(follow) == "tool"
    assert ask.anchor is not None and ask.anchor.instruction == "Add a docstring to parse_args."


def test_codex_agents_md_and_environment_context_are_not_the_ask() -> None:
    messages = (
        Message("system", CODEX_SYSTEM),
        Message("user", AGENTS_MD),
        Message("user", CODEX_ENV),
        Message("user", "Fix the typo in the README title."),
    )
    ask = ask_of(request(*messages))
    assert (ask.instruction, ask.client, ask.turn) == (
        "Fix the typo in the README title.",
        "codex",
        "new",
    )
    # a context-only message after a task continues it
    ask = ask_of(request(*messages, Message("assistant", "Done."), Message("user", CODEX_ENV)))
    assert ask.turn == "continue"
    assert ask.anchor is not None and ask.anchor.instruction == "Fix the typo in the README title."


def test_pasted_material_is_not_the_ask() -> None:
    ask = ask_of(
        request(Message("user", f"Translate the last log line into plain English.\n\n{LOG}"))
    )
    assert ask.instruction == "Translate the last log line into plain English."
    assert "log" in ask.material and ask.material_chars >= len(LOG)
    fenced = "What does this print?\n```python\nfor i in range(3):\n    print(i)\n```"
    ask = ask_of(request(Message("user", fenced)))
    assert (ask.instruction, ask.material) == ("What does this print?", ("code",))
    email = (
        "Summarize this thread in one sentence:\n"
        "From: Ana <ana@example.com>\nTo: ops@example.com\nSubject: outage\n"
        "> We saw a deadlock in the scheduler and a race in the cache; design review on Monday.\n"
        "> Root cause analysis is still open."
    )
    ask = ask_of(request(Message("user", email)))
    assert ask.instruction == "Summarize this thread in one sentence:"
    assert "quote" in ask.material
    document = (
        "Here are the release notes:\n"
        + "\n\n".join(
            f"Version 4.{i}: fixed a race condition in the scheduler, redesigned the cache "
            f"eviction, and proved the lock ordering safe under load."
            for i in range(6)
        )
        + "\n\nWhat is the latest version number?"
    )
    ask = ask_of(request(Message("user", document)))
    assert ask.instruction == "Here are the release notes:\nWhat is the latest version number?"
    assert "document" in ask.material


def test_pasted_code_and_config_lines_are_told_from_prose() -> None:
    """A line is code when indented, keyword-led or ending in ; { } (trailing blanks aside), but
    not when it ends like a sentence; a short `key: value` line is configuration."""
    text = (
        "Which port does this listen on?\n"
        "server {   \n"
        "  listen 8080;  \n"
        "}\t\n"
        "    \n"
        "timeout_s: 30\n"
        "    Indented prose ends like a sentence.\n"
        "def main():"
    )
    ask = ask_of(request(Message("user", text)))
    assert ask.material == ("code", "config")
    lines = [line.strip() for line in ask.instruction.split("\n") if line.strip()]
    assert lines == ["Which port does this listen on?", "Indented prose ends like a sentence."]


def test_a_short_ask_is_all_instruction() -> None:
    text = "How many ways can 5 people sit at a round table if two of them refuse to sit together?"
    ask = ask_of(request(Message("user", text)))
    assert (ask.instruction, ask.material, ask.material_chars) == (text, (), 0)
    chinese = "掷一个骰子直到六个面都出现过，期望要掷多少次？"
    assert ask_of(request(Message("user", chinese))).instruction == chinese


def test_turns_are_classified_new_continue_or_tool() -> None:
    hard = Message("user", "Expected number of rolls of a die until all six faces appear?")
    answer = Message("assistant", "14.7")
    for text in ("continue", "Go on.", "ok, keep going", "继续", "好的，继续"):
        assert turn_of(request(hard, answer, Message("user", text))) == "continue", text
    for text in ("Now format it as a table.", "And the variance? Derive it.", "What's TCP?"):
        assert turn_of(request(hard, answer, Message("user", text))) == "new", text
    assert turn_of(request(hard)) == "new"
    assert turn_of(ChatRequest(model="m", messages=(), prompt="continue")) == "new"
    # an assistant prefill last: the user turn before it is decided
    assert (
        turn_of(request(hard, answer, Message("user", "go on"), Message("assistant", "So")))
        == "continue"
    )


def test_long_quoted_text_inside_the_ask_is_material() -> None:
    text = "Rewrite this more politely: 'Your invoice is late again and we will stop shipping now.'"
    ask = ask_of(request(Message("user", text)))
    assert (ask.instruction, ask.material) == ("Rewrite this more politely: “…”", ("quote",))
    chinese = "把这句话改写得正式一点：“我们这周肯定搞不完，下周再说吧，别催了，大家都很忙的。”"
    assert ask_of(request(Message("user", chinese))).instruction == "把这句话改写得正式一点：“…”"
    short = 'Who said "to be or not to be"?'  # a short quotation is what the ask is about
    assert ask_of(request(Message("user", short))).instruction == short


def test_fenced_blocks_are_material_however_they_end() -> None:
    """A fence runs from its opening line to the next fence or the end of the text: one left
    open, two in a row, and a fence's language line all stay out of the ask."""
    cases = {
        "Rename `x` to `count`.\n```js\nlet x = 1;\n```\nKeep the rest.": (
            "Rename `x` to `count`.\nKeep the rest.",
            ("code",),
        ),
        "Why does this fail?\n```\nimport os\nos.remove('/')": ("Why does this fail?", ("code",)),
        "Compare:\n```\na = 1\n```\n```\nb = 2\n```\nwhich is shorter?": (
            "which is shorter?",
            ("code", "config"),  # "Compare:" alone on its line reads as a config key
        ),
        "What is this? ```": ("What is this?", ()),
    }
    for text, (instruction, material) in cases.items():
        ask = ask_of(request(Message("user", text)))
        assert (ask.instruction, ask.material) == (instruction, material), text


MINUTES = (
    "Here are the notes from Tuesday's sync:\n\n"
    "Attendees: Ana, Bo, Chen, Dita\n"
    "- Release moved to Dec 12 because QA needs two more days on the payment flow.\n"
    "ACTION: Bo to update the release calendar and tell support.\n"
    "- Ana raised the flaky login test again; nobody owns it yet.\n"
    "ACTION: Chen to triage the flaky login test by Thursday.\n\n"
    "List the action items assigned to Chen."
)
MAIL = (
    "From: Maria Lopez <maria@acme.com>\nTo: team@acme.com\nSubject: Friday\n\n"
    "Hi all, the office will be closed on Friday for maintenance of the heating system.\n"
    "Please take your laptops home on Thursday evening.\n\n"
    "Translate the last line to French."
)


def test_pasted_prose_is_material_of_its_own_kind() -> None:
    """Minutes, mail and notices are prose material: the ask around them is what is scored."""
    ask = ask_of(request(Message("user", MINUTES)))
    assert ask.instruction == (
        "Here are the notes from Tuesday's sync:\nList the action items assigned to Chen."
    )
    assert "prose" in ask.material and "config" not in ask.material
    ask = ask_of(request(Message("user", MAIL)))
    assert ask.instruction == "Translate the last line to French." and "prose" in ask.material
    notice = (
        "Во сколько сбор?\n\n"
        "Сбор участников экскурсии в 8:30 у главного входа. Возьмите паспорт и воду."
    )
    ask = ask_of(request(Message("user", notice)))
    assert (ask.instruction, ask.material) == ("Во сколько сбор?", ("prose", "document"))


def test_code_and_premises_are_not_prose_material() -> None:
    ask = ask_of(request(Message("user", f"Why does this deadlock?\n\n{LOG}")))
    assert "prose" not in ask.material
    fenced = "Warum zählt das eins zu wenig?\n```python\nv = cache.get('v') or 0\n```"
    assert ask_of(request(Message("user", fenced))).material == ("code",)
    # a premise, then its question: one ask, nothing pasted
    puzzle = (
        "There are five houses in a row, each a different colour. The Brit lives in the red one."
        "\n\nWho owns the fish?"
    )
    ask = ask_of(request(Message("user", puzzle)))
    assert (ask.material, ask.instruction.endswith("Who owns the fish?")) == ((), True)
    # a few words and a colon alone are a lead-in, not a configuration key
    check = "Check my proof:\n\nClaim: n^2 + n is even. Proof: n^2 + n = n(n + 1), ... QED"
    ask = ask_of(request(Message("user", check)))
    assert ask.instruction == "Check my proof:"


def test_a_titled_document_pasted_before_the_ask_is_prose_material() -> None:
    notice = (
        "[공지] 사내 식당 운영 시간 변경\n"
        "12월 1일부터 사내 식당 운영 시간이 아래와 같이 변경됩니다.\n"
        "점심 11:30~13:30, 저녁 17:30~19:00\n"
        "메뉴 관련 건의는 총무팀 내선 3021로 연락 바랍니다.\n"
        "금요일 저녁에 식당 열어?"
    )
    ask = ask_of(request(Message("user", notice)))
    assert ask.instruction == "금요일 저녁에 식당 열어?" and "prose" in ask.material
    # a first line that is no title leaves the lines one ask
    lines = "Quick question\nThere are 5 boxes.\nEach label lies.\nHow many ways?"
    assert ask_of(request(Message("user", lines))).instruction == lines


def test_continuing_turns_are_recognised_in_every_language() -> None:
    hard = Message("user", "Wie viele Wege gibt es, 10 Bonbons auf 4 Kinder zu verteilen?")
    answer = Message("assistant", "84")
    for text in (
        "Weiter bitte",
        "continua",
        "¡Sigue!",
        "Continuez",
        "続けて",
        "계속해 줘",
        "продолжай",
    ):
        assert turn_of(request(hard, answer, Message("user", text))) == "continue", text
    for text in ("Warum?", "continua a explicar a segunda parte com um exemplo"):
        assert turn_of(request(hard, answer, Message("user", text))) == "new", text

"""The documents stay true: docs/configuration.md is what scripts/config_docs.py makes of the
settings models today, every setting has a description, and the product's text carries no
internal history (work-item numbers, tuning diary)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[1]

# The product's text (what a user or an operator reads), its benchmarks and its tests.
SCANNED = (
    "README.md",
    "docs",
    "gateway",
    "providers",
    "plumbing",
    "backend",
    "scripts",
    "benchmarks",
    "testkit",
    "tests",
)
# No leading word boundary on the numbered words: in source, "\nStop 24" follows a letter.
HISTORY = re.compile(
    r"stop \d+\b"  # "stop 25": a tuning round
    r"|\(stop \d+\)"
    r"|issues?[ -]?\d+"  # "issue 14", "Issue-14"
    r"|issues? (?:before|after|since) \d+"
    r"|_issue\d+"  # "_issue14_targets"
    r"|\bthat morning\b|\bthis morning\b|\ban hour earlier\b",
    re.IGNORECASE,
)


def _generator() -> ModuleType:
    path = ROOT / "scripts" / "config_docs.py"
    spec = importlib.util.spec_from_file_location("config_docs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def _text_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    files = [*root.rglob("*.py"), *root.rglob("*.md")]
    return sorted(f for f in files if "__pycache__" not in f.parts)


def _hits(top: str) -> dict[str, list[str]]:
    """Files under `top` (relative to the repository) with history words: path -> lines."""
    found: dict[str, list[str]] = {}
    for path in _text_files(ROOT / top):
        if path == Path(__file__).resolve():
            continue  # its own examples of what the pattern finds
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = [
            f"{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), 1)
            if HISTORY.search(line)
        ]
        if lines:
            found[path.relative_to(ROOT).as_posix()] = lines
    return found


def test_configuration_reference_is_current() -> None:
    generator = _generator()
    written = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert written == generator.render(), "docs/configuration.md is stale: run " + (
        "python scripts/config_docs.py"
    )
    assert generator.main(["--check"]) == 0


def test_reference_names_every_setting_with_its_environment_variable() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for line in (
        "`GATEWAY_SERVER__PORT`",
        "`GATEWAY_ENGINE__MAX_NUM_SEQS`",
        "`GATEWAY_ROUTING__PREFIX__WAIT_COST_TOKENS`",
        "`GATEWAY_PROVIDERS__NAME__BASE_URL`",
        "`GATEWAY_CLUSTER__SECRET`",
        "## `[[routing.rules]]`",
    ):
        assert line in text


def test_a_setting_without_a_description_is_refused() -> None:
    generator = _generator()

    class Undocumented(BaseModel):
        documented: int = Field(default=1, description="Has one.")
        bare: int = 2

    with pytest.raises(ValueError, match="bare has no description"):
        list(generator._sections(Undocumented, "[example]", "An example.", ("example",)))


def test_history_pattern_finds_what_it_is_meant_to() -> None:
    found = ("Stop 24 took", "(stop 25)", "issue 14", "Issue-14", "_issue14_x", "\\nIssue 14")
    for text in (*found, "the issues before 14"):
        assert HISTORY.search(text), text
    for text in ("stop_reason", "asyncio.ensure_future(stop.wait())", "stop sequences"):
        assert not HISTORY.search(text), text


@pytest.mark.parametrize("top", SCANNED)
def test_no_internal_history_in_the_product(top: str) -> None:
    assert _hits(top) == {}

"""Real Chromium for end-to-end tests, driven by Playwright for Python.

`browser_page`: a fresh page (its own context: no cookies) of a headless Chromium launched from
the system's binary (`executable_path`: Debian's `chromium`, installed by scripts/setup.sh;
Playwright's own download is not needed). When the test fails, the page's screenshot is saved
as `failure.png` in the test's tmp dir, and its path printed."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Generator
from pathlib import Path

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


def chromium_path() -> str | None:
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return found
    return None


@pytest.fixture
async def browser_page(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[object]:
    executable = chromium_path()
    if executable is None:
        pytest.skip("no chromium binary: scripts/setup.sh installs it")
    playwright_api = pytest.importorskip("playwright.async_api")
    async with playwright_api.async_playwright() as driver:
        browser = await driver.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        context = await browser.new_context(accept_downloads=True)
        page = await context.new_page()
        page.set_default_timeout(15_000)
        try:
            yield page
        finally:
            if request.node.stash.get(_FAILED, True):
                shot = tmp_path / "failure.png"
                try:
                    await page.screenshot(path=str(shot), full_page=True)
                    print(f"screenshot of the failed page: {shot}")
                except Exception as exc:  # a crashed page cannot be photographed
                    print(f"no screenshot: {exc}")
            await context.close()
            await browser.close()

"""schemathesis over the usage store's reports, with the store on (SQLite, with a few
records): positive and negative query strings; no answer may be a 5xx or an error out of
shape."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from gateway.openapi import build_openapi
from testkit.threaded import ADMIN_KEY, ThreadedGateway, assert_api_answer

SCHEMA = schemathesis.openapi.from_dict(build_openapi())
LABELS = (
    "GET /admin/usage/summary",
    "GET /admin/usage/records",
    "GET /admin/usage/export",
    "GET /admin/keys/{id}/usage",
)
OPERATIONS = {
    result.ok().label: result.ok()
    for result in SCHEMA.get_all_operations()
    if result.ok().label in LABELS
}


@pytest.fixture(scope="module")
def served() -> Iterator[ThreadedGateway]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'usage.db'}"
        with ThreadedGateway(usage={"enabled": True, "url": url, "block_ms": 50}) as gateway:
            for _ in range(3):  # a few records to report
                requests.post(
                    f"{gateway.root}/v1/chat/completions",
                    json={"model": "echo-model", "messages": [{"role": "user", "content": "x"}]},
                    headers={"Authorization": f"Bearer {gateway.key}"},
                    timeout=30,
                ).raise_for_status()
            yield gateway


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("label", LABELS)
def test_no_report_answer_is_a_5xx(
    served: ThreadedGateway, label: str, mode: GenerationMode
) -> None:
    operation = OPERATIONS[label]
    session = requests.Session()

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: schemathesis.Case) -> None:
        headers = {**(case.headers or {}), "Authorization": f"Bearer {ADMIN_KEY}"}
        resp = case.call(base_url=served.root, session=session, headers=headers, timeout=30)
        if resp.status_code == 200 and label.endswith("export"):
            assert "text/csv" in str(resp.headers["content-type"])
            return
        assert_api_answer(resp.status_code, resp.headers, resp.content, label)

    check()
    session.close()

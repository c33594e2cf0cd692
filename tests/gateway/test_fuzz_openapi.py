"""schemathesis over the gateway's own OpenAPI document (served at `/openapi.json`): every
operation, with bodies, query and path parameters that fit the schema (positive) and that break
it (negative). No answer may be a 5xx, and every error must be OpenAI error JSON with an
`x-request-id`. About 1,600 cases in all; shrinking is off so that a failure is reported at
once, with the example that failed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from gateway.openapi import build_openapi
from testkit.threaded import ADMIN_KEY, ThreadedGateway, assert_api_answer

SCHEMA = schemathesis.openapi.from_dict(build_openapi())
OPERATIONS = {result.ok().label: result.ok() for result in SCHEMA.get_all_operations()}
# Examples per operation and mode: the rich bodies get the most.
EXAMPLES = {
    "POST /v1/chat/completions": 120,
    "POST /v1/responses": 120,
    "POST /v1/completions": 120,
    "POST /admin/keys": 100,
    "PATCH /admin/keys/{id}": 100,
    "GET /admin/usage": 80,
}
# Operations with nothing a negative case could break (no body, no parameters).
NOTHING_TO_BREAK = {"GET /healthz", "GET /readyz", "GET /metrics"}


@pytest.fixture(scope="module")
def served() -> Iterator[ThreadedGateway]:
    with ThreadedGateway() as gateway:
        yield gateway


def test_the_served_document_is_the_generated_one(served: ThreadedGateway) -> None:
    resp = requests.get(f"{served.root}/openapi.json", timeout=10)
    assert resp.status_code == 200 and resp.headers["x-request-id"]
    document = resp.json()
    assert document == build_openapi() and document["openapi"].startswith("3.1")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/admin/keys"} <= set(
        document["paths"]
    )
    chat = document["components"]["schemas"]["ChatBody"]["properties"]
    assert chat["max_tokens"]["anyOf"][0]["maximum"] == 2**24


CASES = [
    pytest.param(label, mode, id=f"{mode.value} {label}")
    for label in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if not (mode is GenerationMode.NEGATIVE and label in NOTHING_TO_BREAK)
]


@pytest.mark.parametrize(("label", "mode"), CASES)
def test_no_answer_is_a_5xx_or_an_error_out_of_shape(
    served: ThreadedGateway, label: str, mode: GenerationMode
) -> None:
    operation = OPERATIONS[label]
    secret = ADMIN_KEY if operation.path.startswith("/admin") else served.key
    session = requests.Session()

    @settings(
        max_examples=EXAMPLES.get(label, 25),
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: schemathesis.Case) -> None:
        body = case.body
        # Half of the bodies name a served model, so that cases reach the upstream too.
        if isinstance(body, dict) and "model" in body and len(repr(body)) % 2 == 0:
            body["model"] = "echo-model"
        headers = {**(case.headers or {}), "Authorization": f"Bearer {secret}"}
        resp = case.call(base_url=served.root, session=session, headers=headers, timeout=30)
        assert_api_answer(resp.status_code, resp.headers, resp.content, label)

    check()
    session.close()

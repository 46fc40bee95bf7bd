"""API fuzzing: Schemathesis generates requests from the server's own OpenAPI schema (valid ones
and ones that break it) and sends them to a real ``xmc-serve`` on 127.0.0.1. A few hundred
requests in all: no 5xx, every 4xx a JSON body with a one-line ``error`` (and, for a bad request,
the ``field`` at fault), every 2xx conforming to the schema. Hypothesis runs derandomized, so a
failure reproduces."""

from __future__ import annotations

import re

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis", reason="pip install schemathesis (requirements.txt)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from model_helpers import save_toy_xrlinear  # noqa: E402
from schemathesis.generation.modes import GenerationMode  # noqa: E402
from serve_helpers import start  # noqa: E402

EXAMPLES = 100  # per operation and mode: /predict and /labels x 2 modes x 100 + the probes ~ 400 requests


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder, _ = save_toy_xrlinear(tmp_path_factory.mktemp("fuzz") / "xrlinear")
    served = start(folder, "--max-texts", "16", "--max-text-chars", "500", "--max-k", "20", "--max-body-bytes", "20000")
    try:
        yield served
    finally:
        served.stop()


def _check(case, response: httpx.Response, schema_fields: set[str]) -> None:
    status = response.status_code
    where = f"{case.method} {case.path} {case.body!r} {case.query!r} -> {status} {response.text[:300]}"
    assert status < 500, where
    if status >= 400:
        assert response.headers["content-type"].startswith("application/json"), where
        body = response.json()
        assert isinstance(body.get("error"), str) and body["error"] and "\n" not in body["error"], where
        assert "Traceback" not in body["error"], where
        if status in (400, 413, 422):
            field = body.get("field")
            assert isinstance(field, str) and field, where
            head = re.split(r"[.\[]", field, maxsplit=1)[0]
            sent_fields = set(case.body) if isinstance(case.body, dict) else set()
            sent_fields |= set(case.query or {})
            # names a field of the schema, or the unknown one that was sent
            assert head == "body" or head in schema_fields or head in sent_fields, where
            assert field in body["error"] or head in body["error"] or status == 400, where


def test_generated_requests_get_no_5xx_and_4xx_name_the_field(served):
    schema = schemathesis.openapi.from_url(f"{served.base}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/predict", "/labels", "/health", "/metrics"}
    sent = {"total": 0, "4xx": 0, "2xx": 0}
    with httpx.Client(base_url=served.base, timeout=30) as client:
        for op in operations:
            fields = {p.name for p in op.query} | {"texts", "k", "Authorization", "Content-Length"}
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                if mode is GenerationMode.NEGATIVE and not (len(op.body) or len(op.query)):
                    continue  # nothing to break in a request without inputs

                @settings(
                    max_examples=EXAMPLES,
                    deadline=None,
                    database=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=op.as_strategy(generation_mode=mode))
                def fuzz(case):
                    kwargs = case.as_transport_kwargs(base_url=served.base)
                    response = client.request(
                        kwargs["method"],
                        kwargs["url"],
                        params=kwargs.get("params"),
                        headers=kwargs.get("headers"),
                        json=kwargs.get("json"),
                        content=kwargs.get("data") if "json" not in kwargs else None,
                    )
                    sent["total"] += 1
                    sent["4xx" if response.status_code >= 400 else "2xx"] += 1
                    _check(case, response, fields)  # noqa: B023 (fuzz runs at once, in this iteration)
                    if mode is GenerationMode.POSITIVE and response.status_code < 300:  # noqa: B023
                        case.validate_response(response)  # the answer conforms to the schema

                fuzz()
    print(f"fuzzing: {sent}")
    assert sent["total"] >= 250 and sent["4xx"] >= 50 and sent["2xx"] >= 50, sent
    # the server is still fine after all that
    r = httpx.post(f"{served.base}/predict", json={"texts": ["still serving"], "k": 3}, timeout=30)
    assert r.status_code == 200 and len(r.json()["predictions"][0]["labels"]) <= 3

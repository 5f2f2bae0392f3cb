"""Structured output through ``fastdeploy-mtp serve`` (MTP, K=3) and the splitwise router: OpenAI's
``response_format`` and vLLM's ``guided_*`` fields constrain the output (the same text as the
offline engine under the same constraint), bad or competing constraints are a 400 naming the
field, and ``/metrics`` counts the grammar's work and its forced drafts.

Every server is stopped with SIGTERM and must exit 0 leaving nothing behind.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS  # noqa: E402
from fastdeploy_mtp.runtime.grammar import MAX_GUIDED_CHARS  # noqa: E402
from fastdeploy_mtp.runtime.sampling_params import SamplingParams  # noqa: E402
from tests.support.servers import (  # noqa: E402
    http_get,
    http_post as post,
    scrape_metrics,
    serving,
    splitwise_instances,
    splitwise_router,
)

MODEL = "fastdeploy-mtp-tiny"
MTP3 = '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 3}'
REGEX = r"[0-9]{3}-[a-z]{2,5}"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
    "additionalProperties": False,
}
PROMPT = DEMO_PROMPTS[1][:40]


@pytest.fixture(scope="module")
def server():
    yield from serving(["--speculative-config", MTP3, "--max-num-seqs", "4"])


def client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def complete(url: str, stream: bool = False, **extra: Any) -> tuple[str, str]:
    """(text, finish reason) of a completion of :data:`PROMPT` with ``extra_body=extra``."""
    r = client(url).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=60, stream=stream, extra_body=extra
    )
    if not stream:
        return r.choices[0].text, r.choices[0].finish_reason
    text, reason = "", None
    for chunk in r:
        text += chunk.choices[0].text
        reason = chunk.choices[0].finish_reason or reason
    return text, reason


@pytest.fixture(scope="module")
def offline_regex() -> str:
    """The offline engine's text under :data:`REGEX` (greedy, MTP K=3)."""
    from fastdeploy_mtp.config import SpeculativeConfig
    from fastdeploy_mtp.entrypoints.offline import run_requests

    sampling = SamplingParams(guided={"kind": "regex", "spec": REGEX})
    reqs, texts, _ = run_requests(
        [PROMPT], 60, SpeculativeConfig.from_json(MTP3), 4, "offline", None, sampling
    )
    assert reqs[0].finish_reason == "stop"
    return texts[0]


def test_guided_regex_equals_the_offline_engine_streamed_or_not(server, offline_regex):
    assert re.fullmatch(REGEX, offline_regex)
    assert complete(server.base_url, guided_regex=REGEX) == (offline_regex, "stop")
    assert complete(server.base_url, stream=True, guided_regex=REGEX) == (offline_regex, "stop")


def test_response_format_json_schema_and_json_object(server):
    c = client(server.base_url)
    messages = [{"role": "user", "content": "Describe a user as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}}
    r = c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=60, response_format=fmt
    )
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"name", "ok"} and len(value["name"]) <= 8 and type(value["ok"]) is bool
    assert r.choices[0].finish_reason == "stop"
    r = c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=60, response_format={"type": "json_object"}
    )
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # the tiny model may not close its object within max_tokens
        assert text.startswith("{")


def test_guided_json_choice_and_grammar(server):
    text, reason = complete(server.base_url, guided_json=json.dumps(SCHEMA))
    assert reason == "stop" and set(json.loads(text)) == {"name", "ok"}
    assert complete(server.base_url, guided_choice=["yes", "no", "maybe so"])[0] in (
        "yes",
        "no",
        "maybe so",
    )
    text, reason = complete(server.base_url, guided_grammar='root ::= "x=" [0-9] [0-9]')  # GBNF
    assert reason == "stop" and re.fullmatch(r"x=[0-9]{2}", text)
    text, reason = complete(server.base_url, guided_grammar='start: "y=" /[a-c]+/ ";"')  # Lark
    assert reason == "stop" and re.fullmatch(r"y=[a-c]+;", text)


@pytest.mark.parametrize(
    "extra, param, why",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "frob"}},
                }
            },
            "response_format",
            "frob",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "schema",
        ),
        ({"guided_regex": "[0-9"}, "guided_regex", "regex"),
        ({"guided_json": "{not json"}, "guided_json", "JSON"),
        ({"guided_choice": []}, "guided_choice", "non-empty"),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar", "undefined_rule"),
        ({"guided_regex": "[0-9]+", "guided_choice": ["a"]}, "guided_choice", "at most one"),
        (
            {"response_format": {"type": "json_object"}, "guided_regex": "a"},
            "guided_regex",
            "at most one",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "tools"),
    ],
)
def test_a_bad_or_second_constraint_is_a_400_naming_the_field(server, extra, param, why):
    status, answer = post(
        server.base_url + "/v1/completions", {"prompt": "x", "max_tokens": 4, **extra}
    )
    error = answer["error"]
    assert status == 400 and error["param"] == param and why in error["message"], answer


def test_text_response_format_with_a_regex_is_one_constraint(server):
    body = {
        "prompt": PROMPT,
        "max_tokens": 60,
        "response_format": {"type": "text"},
        "guided_regex": "[a-z]{4}",
    }
    status, answer = post(server.base_url + "/v1/completions", body)
    assert status == 200 and re.fullmatch("[a-z]{4}", answer["choices"][0]["text"]), answer


def test_metrics_count_the_grammar_work(server):
    complete(server.base_url, guided_regex="[0-9 ]{20}")  # the model would draft text here
    m = scrape_metrics(server.base_url)
    # the MTP layer (K = S = 3) drafts under the grammar: its drafts are checked, none is cut
    assert (
        m["fastdeploy:guided_drafts_checked_total"] > 0
        and m["fastdeploy:guided_drafts_cut_total"] == 0
    )
    assert m["fastdeploy:guided_rounds_total"] > 0 and m["fastdeploy:guided_seconds_total"] > 0
    text = http_get(server.base_url + "/metrics")[1]
    for name in ("guided_drafts_checked", "guided_drafts_cut", "guided_seconds", "guided_rounds"):
        assert f"# HELP fastdeploy:{name}_total " in text


def test_metrics_count_the_grammars_forced_drafts_inside_the_draft_counters(server):
    """The schema forces its keys and punctuation: those drafts are offered and, the request
    ending at EOS on this byte model, all accepted; they are also in the draft counters."""
    forced = "fastdeploy:spec_decode_num_forced_draft_tokens_total"
    names = (
        forced,
        "fastdeploy:spec_decode_num_accepted_forced_draft_tokens_total",
        "fastdeploy:spec_decode_num_draft_tokens_total",
        "fastdeploy:spec_decode_num_accepted_tokens_total",
    )
    before = scrape_metrics(server.base_url)
    text, reason = complete(server.base_url, guided_json=json.dumps(SCHEMA))
    after = scrape_metrics(server.base_url)
    assert reason == "stop" and set(json.loads(text)) == {"name", "ok"}
    offered, accepted, drafts, drafts_accepted = (after[n] - before[n] for n in names)
    assert accepted == offered > 0 and drafts >= offered and drafts_accepted >= accepted
    assert after[forced + '{method="mtp"}'] == after[forced]
    page = http_get(server.base_url + "/metrics")[1]
    assert "# HELP " + forced + " Draft tokens a constrained request's grammar forced" in page
    assert "also counted in spec_decode_num_draft_tokens" in page


def test_a_constraint_through_the_router_and_a_decode_instance(offline_regex):
    with (
        splitwise_instances(("prefill", MTP3), ("decode", MTP3)) as (p, d),
        splitwise_router(p, d) as url,
    ):
        assert complete(url, guided_regex=REGEX) == (offline_regex, "stop")
        status, answer = post(
            url + "/v1/completions", {"prompt": "x", "guided_regex": "(", "max_tokens": 4}
        )
        assert status == 400 and answer["error"]["param"] == "guided_regex", answer
        decode = scrape_metrics(d.base_url)
        assert decode["fastdeploy:guided_rounds_total"] > 0


def test_tensor_parallel_ranks_cut_and_mask_alike(offline_regex):
    """With two ranks every rank runs the same matchers: the output is the offline engine's."""
    for srv in serving(
        ["--speculative-config", MTP3, "--max-num-seqs", "4", "--tensor-parallel-size", "2"]
    ):
        assert complete(srv.base_url, guided_regex=REGEX) == (offline_regex, "stop")
        text, reason = complete(srv.base_url, guided_json=SCHEMA)
        assert reason == "stop" and set(json.loads(text)) == {"name", "ok"}
        assert scrape_metrics(srv.base_url)["fastdeploy:guided_drafts_checked_total"] > 0


def test_a_grammar_only_the_tokenizer_refuses_fails_alone_and_the_server_keeps_serving(server):
    # it compiles without a tokenizer (the API check passes) but names a token id past the
    # vocabulary: refused once the request starts, which must not fail the step of the others
    url = server.base_url + "/v1/completions"
    running: dict[str, Any] = {}
    other = threading.Thread(
        target=lambda: running.update(
            r=post(url, {"prompt": PROMPT, "max_tokens": 150, "ignore_eos": True})
        )
    )
    other.start()
    time.sleep(0.5)  # the other request is decoding
    status, answer = post(
        url, {"prompt": "x", "max_tokens": 4, "guided_grammar": "start: <[99999]>"}
    )
    other.join()
    assert status == 400 and answer["error"]["param"] == "guided", answer
    assert "99999" in answer["error"]["message"]
    status, answer = running["r"]
    assert status == 200 and answer["choices"][0]["finish_reason"] == "length", answer
    assert complete(server.base_url, guided_choice=["yes", "no"])[0] in ("yes", "no")


def refused_in_process(field: str, value: Any) -> str:
    """The message of the 400 naming ``field`` that an in-process app answers a completion
    constrained by ``field: value`` with (no request may reach the backend)."""
    from fastapi.testclient import TestClient
    from prometheus_client import CollectorRegistry

    from fastdeploy_mtp.models.tiny import ASSETS_DIR
    from fastdeploy_mtp.serving.openai.app import create_app
    from fastdeploy_mtp.tokenization import load_tokenizer

    class NeverSubmits:
        fatal = None
        registry = CollectorRegistry()

        def validate(self, req: Any) -> None:
            raise AssertionError("the body must be refused before a request is made")

    app = create_app(NeverSubmits(), "m", load_tokenizer(ASSETS_DIR))  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as http:
        r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.json()
    return str(r.json()["error"]["message"])


def test_a_guided_json_text_nested_too_deep_to_parse_is_a_400():
    deep = '{"type": "array", "items": ' * 5000 + "{}" + "}" * 5000  # past Python's recursion limit
    assert "nested" in refused_in_process("guided_json", deep)


def test_a_constraint_too_large_to_compile_quickly_is_a_400():
    # 100,000 choices took llguidance ~19 s to validate, on the API server's event loop
    many = [f"option {i}" for i in range(20_000)]
    assert f"at most {MAX_GUIDED_CHARS}" in refused_in_process("guided_choice", many)

"""Tenants of one deployment (:mod:`fastdeploy_mtp.tenancy`) through ``serve`` and the router:

* two API keys (``--api-key-file``), the same prompt: no prefix-cache hit across the keys (the
  hit counter of ``/metrics`` does not move), hits within a key, and every answer equal;
* ``cache_salt`` separates requests under one key; ``--prefix-cache-scope global`` lets every
  key share;
* ``/metrics`` asks for the metrics key (no tenant key opens it); FastAPI's ``/docs``,
  ``/redoc`` and ``/openapi.json`` are not served;
* through the router over a prefill and a decode instance, the router's keys separate the
  instances' prefix caches the same way (the namespace travels to both instances).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.handover import router_command
from tests.support.servers import (
    ServerProcess,
    scrape_metrics,
    splitwise_instances,
    stopped_cleanly,
)

KEYS = ("sk-tenant-a-" + "a" * 20, "sk-tenant-b-" + "b" * 20)
METRICS_KEY = "sk-scraper-" + "m" * 20
HITS = "fastdeploy:prefix_cache_hits_total"
MTP1 = '{"method": "mtp", "num_speculative_tokens": 1}'
# 16-token KV blocks: a prompt of a few hundred bytes covers many whole blocks
BASE = "The harbor master wrote down every ship that came in, its cargo and its crew. "


def prompt(tag: str) -> str:
    """A prompt of its own per test (no test finds another's blocks)."""
    return f"[{tag}] " + BASE * 3


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tenants") / "keys"
    path.write_text("# one key per tenant\n" + "\n".join(KEYS) + "\n")
    os.chmod(path, 0o600)
    return str(path)


def tenant_server(key_file: str, *extra: str) -> ServerProcess:
    args = ["--speculative-config", MTP1, "--api-key-file", key_file]
    return ServerProcess([*args, "--metrics-api-key", METRICS_KEY, *extra])


@pytest.fixture(scope="module")
def server(key_file: str) -> Iterator[ServerProcess]:
    srv = tenant_server(key_file)
    yield srv
    stopped_cleanly(srv)


def hits(url: str) -> float:
    return scrape_metrics(url, headers={"Authorization": f"Bearer {METRICS_KEY}"})[HITS]


def completion(url: str, key: str, text: str, salt: str | None = None) -> tuple[str, float]:
    """The greedy answer to ``text`` sent with ``key`` (and ``cache_salt`` ``salt``), and how
    many prompt tokens it found in the prefix cache (the hit counter's change)."""
    before = hits(url)
    extra = {"ignore_eos": True, **({} if salt is None else {"cache_salt": salt})}
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    answer = client.completions.create(model=None, prompt=text, max_tokens=8, extra_body=extra)
    return answer.choices[0].text, hits(url) - before


def test_two_keys_never_share_prefix_cache_blocks(server: ServerProcess) -> None:
    url, text = server.base_url, prompt("keys")
    a1, a2, b1, b2 = (completion(url, k, text) for k in (KEYS[0], KEYS[0], KEYS[1], KEYS[1]))
    assert a1[1] == 0 and b1[1] == 0, (a1, b1)  # B's first request: nothing of A's found
    assert a2[1] >= 16 * 10 and b2[1] == a2[1], (a2, b2)  # each key hits its own blocks
    assert a1[0] == a2[0] == b1[0] == b2[0]


def test_cache_salt_separates_requests_under_one_key(server: ServerProcess) -> None:
    url, text = server.base_url, prompt("salt")
    plain = completion(url, KEYS[0], text)
    s1 = completion(url, KEYS[0], text, "salt-1")
    s1_again = completion(url, KEYS[0], text, "salt-1")
    s2 = completion(url, KEYS[0], text, "salt-2")
    other_key = completion(url, KEYS[1], text, "salt-1")
    assert [plain[1], s1[1], s2[1], other_key[1]] == [0, 0, 0, 0]
    assert s1_again[1] >= 16 * 10
    assert len({plain[0], s1[0], s1_again[0], s2[0], other_key[0]}) == 1


def test_metrics_take_only_the_metrics_key_and_no_schema_pages(server: ServerProcess) -> None:
    url = server.base_url
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.get("/metrics").status_code == 401
        for key in KEYS:  # a tenant's key does not open it
            refused = http.get("/metrics", headers={"Authorization": f"Bearer {key}"})
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "invalid_api_key"
        ok = http.get("/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"})
        assert ok.status_code == 200 and HITS in ok.text
        assert http.get("/health").status_code == 200
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert http.get(path).status_code == 404, path
        models = http.get("/v1/models", headers={"Authorization": f"Bearer {METRICS_KEY}"})
        assert models.status_code == 401  # the metrics key opens /metrics only


def test_global_scope_lets_every_key_share(key_file: str) -> None:
    srv = tenant_server(key_file, "--prefix-cache-scope", "global")
    try:
        text = prompt("global")
        a = completion(srv.base_url, KEYS[0], text)
        b = completion(srv.base_url, KEYS[1], text)
        salted = completion(srv.base_url, KEYS[1], text, "own")
        assert a[1] == 0 and b[1] >= 16 * 10 and salted[1] == 0
        assert a[0] == b[0] == salted[0]
    finally:
        stopped_cleanly(srv)


def test_the_router_keeps_tenants_apart_on_both_instances(key_file: str) -> None:
    with (
        splitwise_instances(("prefill", MTP1), ("decode", MTP1)) as (prefill, decode),
        router_command(prefill.base_url, decode.base_url, "--api-key-file", key_file) as router,
    ):
        text = prompt("router")
        answers = []
        for key in (KEYS[0], KEYS[1], KEYS[0]):
            before = (scrape_metrics(prefill.base_url)[HITS], scrape_metrics(decode.base_url)[HITS])
            client = openai.OpenAI(base_url=router + "/v1", api_key=key, max_retries=0)
            got = client.completions.create(
                model=None, prompt=text, max_tokens=8, extra_body={"ignore_eos": True}
            )
            after = (scrape_metrics(prefill.base_url)[HITS], scrape_metrics(decode.base_url)[HITS])
            answers.append((got.choices[0].text, after[0] - before[0], after[1] - before[1]))
        (a1, a1_p, a1_d), (b1, b1_p, b1_d), (a2, a2_p, a2_d) = answers
        # the first request of each key finds nothing on either instance; A's second finds
        # its prompt on the prefill instance and on the decode instance (no transfer needed)
        assert (a1_p, a1_d, b1_p, b1_d) == (0, 0, 0, 0), answers
        assert a2_p >= 16 * 10 and a2_d >= 16 * 10, answers
        assert a1 == b1 == a2

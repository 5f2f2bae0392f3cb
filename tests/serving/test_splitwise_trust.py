"""Splitwise against a hostile local user and a hostile router-side caller: another uid
(``nobody``) cannot read, release or redirect a request's KV through the prefill
instance's KV port, a hand-over changed on the way (block ids of another request, an
inconsistent slot state) is refused by the decode instance, and so are KV bytes changed
between the two instances. Every refusal is counted in
``/metrics``; the victim's own request still decodes exactly as the mixed engine does.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fastdeploy_mtp.models import ByteTokenizer
from tests.splitwise import test_kv_mac
from tests.splitwise.test_kv_mac import flip_a_byte
from tests.support.handover import resigned
from tests.support.hostile import run_as_nobody
from tests.support.servers import (
    offline,
    scrape_metrics,
    splitwise_instances,
    splitwise_post,
)

relays = test_kv_mac.relays  # the fixture

MTP3 = '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 3}'
MAX_TOKENS = 12
VICTIM_TEXT = "def area(r): return 3.14159 * r * r  # the circle's area, for every radius r"
OTHER_TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def pd():
    """A prefill instance and a decode instance (KV over TCP, the cross-host path)."""
    with splitwise_instances(("prefill", MTP3), ("decode", MTP3, "--kv-transport", "tcp")) as (
        p,
        d,
    ):
        yield p, d


def prefill(p: Any, request_id: str, text: str) -> dict[str, Any]:
    """The decode request body of ``text`` after the prefill instance's hand-over."""
    body = {
        "request_id": request_id,
        "prompt_token_ids": list(text.encode()),
        "max_tokens": MAX_TOKENS,
    }
    status, first = splitwise_post(p.base_url + "/v1/splitwise/prefill", body)
    assert status == 200 and first["handoff"], first
    return {**body, "output_token_ids": first["output_token_ids"], "handoff": first["handoff"]}


def decode(d: Any, request: dict[str, Any]) -> tuple[int, Any]:
    return splitwise_post(d.base_url + "/v1/splitwise/decode", request)


def decoded_text(request: dict[str, Any], events: list[dict[str, Any]]) -> str:
    assert events[-1] == {"finish_reason": "length"}, events
    ids = [*request["output_token_ids"], *(t for e in events[:-1] for t in e.get("token_ids", []))]
    return ByteTokenizer().decode(ids)


def test_another_user_cannot_fetch_check_or_release_a_requests_kv(pd):
    p, d = pd
    victim = prefill(p, "victim-1", VICTIM_TEXT)
    port = int(victim["handoff"]["kv"]["address"].rsplit(":", 1)[1])
    before = scrape_metrics(p.base_url)
    token = victim["handoff"]["kv"]["token"]
    # the hostile user knows the request id (the client chose it) and, in the last two
    # tries, even the transfer token: without the deployment's secret nothing is served
    script = f"""
import json
answers = []
for op in ("fetch", "check", "release"):
    tries = ({{}}, {{"token": "A" * 43}}, {{"token": {token!r}}},
             {{"token": {token!r}, "mac": "0" * 64}})
    for extra in tries:
        request = {{"op": op, "request_id": "victim-1", **extra}}
        a = zmtp_request("127.0.0.1", {port}, [json.dumps(request).encode()])
        answers.append(None if a is None else [x.decode("latin-1") for x in a])
print(json.dumps(answers))
"""
    answers = run_as_nobody(script)
    assert len(answers) == 12
    for answer in answers:  # every one answered with one refusal frame, no data frame
        assert answer is not None and len(answer) == 1, answer
        reply = json.loads(answer[0])
        assert reply["ok"] is False and "offer" not in reply, reply
    after = scrape_metrics(p.base_url)
    key = 'fastdeploy:dropped_messages_total{channel="kv"}'
    assert after[key] - before[key] == 12
    assert after["fastdeploy:splitwise_kv_blocks_held"] > 0  # nothing was released
    status, events = decode(d, victim)
    assert status == 200
    assert (
        decoded_text(victim, events) == offline([VICTIM_TEXT], spec=MTP3, max_tokens=MAX_TOKENS)[0]
    )


def test_a_hand_over_changed_on_the_way_is_refused_and_the_victim_still_decodes(pd):
    p, d = pd
    victim = prefill(p, "victim-2", VICTIM_TEXT)
    mine = prefill(p, "mine-2", OTHER_TEXT)
    before = scrape_metrics(d.base_url)
    redirected = json.loads(json.dumps(mine))
    n = len(
        mine["handoff"]["kv"]["block_ids"]
    )  # as many of the victim's blocks as the decode side expects
    redirected["handoff"]["kv"]["block_ids"] = victim["handoff"]["kv"]["block_ids"][:n]
    state = redirected["handoff"]["state"]["target"]
    inconsistent = []
    for name, value in (("seq_lens_decoder", 1000), ("step_idx", 1024), ("prompt_lens", 5)):
        bad = json.loads(json.dumps(mine))
        bad["handoff"]["state"]["target"][name] = {**state[name], "v": [value]}
        inconsistent.append((name, bad))
    history = json.loads(json.dumps(mine))
    tokens = history["handoff"]["state"]["target"]["token_ids_all"]
    tokens["v"] = [tokens["v"][0] ^ 1, *tokens["v"][1:]]
    inconsistent.append(("token_ids_all", history))

    # 1. without the secret, any change breaks the prefill instance's signature
    for _, bad in [("block_ids", redirected), *inconsistent]:
        status, body = decode(d, bad)
        assert status == 400 and "signature does not match" in body["error"]["message"], body
    # so does sending someone else's hand-over for one's own prompt
    status, body = decode(d, {**mine, "handoff": victim["handoff"]})
    assert status == 400 and "signature does not match" in body["error"]["message"], body
    # 2. even signed (a caller holding the secret), an inconsistent state is refused ...
    for name, bad in inconsistent:
        status, body = decode(d, {**bad, "handoff": resigned(bad["handoff"], bad)})
        assert status == 400 and name in body["error"]["message"], (name, body)
    # ... and block ids that are not the offer's make the pull fail before a byte is read
    status, events = decode(
        d, {**redirected, "handoff": resigned(redirected["handoff"], redirected)}
    )
    assert status == 200 and "error" in events[-1], events
    assert (
        "`block_ids` differs from what the prefill instance offered"
        in events[-1]["error"]["message"]
    )
    after = scrape_metrics(d.base_url)
    key = 'fastdeploy:dropped_messages_total{channel="handoff"}'
    assert after[key] - before[key] == 6 + len(inconsistent)
    # the victim's KV was neither read nor released: it decodes as the mixed engine does
    status, events = decode(d, victim)
    assert status == 200
    assert (
        decoded_text(victim, events) == offline([VICTIM_TEXT], spec=MTP3, max_tokens=MAX_TOKENS)[0]
    )


def test_kv_bytes_changed_on_the_way_fail_the_request_and_are_counted(pd, relays):
    """A man in the middle of the KV port (the hand-over points the decode instance at it,
    re-signed as a caller holding the secret could): a byte flipped in a data frame fails the
    request with one line naming the refused blocks, counted as ``channel="kv"`` on the
    decode instance; the next hand-over decodes as the mixed engine does."""
    p, d = pd
    victim = prefill(p, "victim-3", VICTIM_TEXT)
    upstream = victim["handoff"]["kv"]["address"]
    relay = relays(upstream, lambda op, frames: flip_a_byte(frames) if op == "fetch" else frames)
    moved = json.loads(json.dumps(victim))
    moved["handoff"]["kv"]["address"] = relay.address
    key = 'fastdeploy:dropped_messages_total{channel="kv"}'
    before = scrape_metrics(d.base_url)
    status, events = decode(d, {**moved, "handoff": resigned(moved["handoff"], moved)})
    assert status == 200 and "error" in events[-1], events
    message = events[-1]["error"]["message"]
    assert "do not match the prefill instance's tag" in message and "\n" not in message
    assert scrape_metrics(d.base_url)[key] - before[key] == 1
    again = prefill(p, "victim-4", VICTIM_TEXT)
    status, events = decode(d, again)
    assert status == 200
    assert (
        decoded_text(again, events) == offline([VICTIM_TEXT], spec=MTP3, max_tokens=MAX_TOKENS)[0]
    )

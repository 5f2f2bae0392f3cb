"""Splitwise serving end to end: real prefill and decode instances (``fastdeploy-mtp serve
--splitwise-role ...``, each with its cache manager and worker) behind the router, talked to
with the ``openai`` client. Output must equal the mixed (offline) engine's token for token,
over both KV transports, and the faults must fail only what they hit and free the blocks.

Instances are stopped in the reverse order of their start, so that each one's check "no
``/dev/shm`` name left" is not confused by an instance started after it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS  # noqa: E402
from tests.support.handover import resigned  # noqa: E402
from tests.support.servers import (  # noqa: E402
    ServerProcess,
    alive,
    http_post as post,
    offline,
    own_names,
    scrape_metrics as metrics,
    shm_names,
    splitwise_instance as instance,
    splitwise_instances as instances,
    splitwise_post,
    splitwise_router as router,
)

MTP3 = '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 3}'
MTP1 = '{"method": "mtp", "num_speculative_tokens": 1, "num_model_steps": 1}'
HYBRID = (
    '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 1, '
    '"mtp_strategy": "with_ngram"}'
)
MAX_TOKENS = 24
TRANSFER_TIMEOUT = 8  # seconds: the decode instances' --kv-transfer-timeout


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


async def complete_all(
    url: str, prompts: list[str], max_tokens: int = MAX_TOKENS, stagger: float = 0.0
) -> list[str]:
    """Every prompt at once (request i ``stagger * i`` s late), half of them streamed."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)

    async def one(i: int, prompt: str) -> str:
        await asyncio.sleep(stagger * i)
        if i % 2:
            stream = await client.completions.create(
                model="fastdeploy-mtp-tiny", prompt=prompt, max_tokens=max_tokens, stream=True
            )
            return "".join([c.choices[0].text async for c in stream if c.choices])
        out = await client.completions.create(
            model="fastdeploy-mtp-tiny", prompt=prompt, max_tokens=max_tokens
        )
        return out.choices[0].text

    try:
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    finally:
        await client.close()


def blocks_all_back(*servers: ServerProcess) -> bool:
    for srv in servers:
        m = metrics(srv.base_url)
        if (
            m["fastdeploy:splitwise_kv_blocks_held"] != 0
            or m["fastdeploy:num_requests_running"] != 0
        ):
            return False
    return True


@pytest.fixture(scope="module")
def mtp3():
    """A prefill instance (chunked prefill) and two decode instances (shared memory, TCP),
    MTP K = S = 3."""
    timeout = ("--kv-transfer-timeout", str(TRANSFER_TIMEOUT))
    with instances(
        ("prefill", MTP3, "--prefill-chunk-size", "7"),  # every demo prompt takes several chunks
        ("decode", MTP3, "--kv-transport", "shm", *timeout),
        ("decode", MTP3, "--kv-transport", "tcp", *timeout),
    ) as s:
        yield dict(zip(("prefill", "shm", "tcp"), s))


@pytest.fixture(scope="module")
def expected_mtp3():
    return offline(DEMO_PROMPTS, spec=MTP3)


# ---- equivalence ---------------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_demo_prompts_through_prefill_and_decode_equal_mixed(mtp3, expected_mtp3, transport):
    p, d = mtp3["prefill"], mtp3[transport]
    before = metrics(d.base_url)
    with router(p, d) as url:
        got = asyncio.run(complete_all(url, DEMO_PROMPTS))
    assert got == expected_mtp3
    after = metrics(d.base_url)
    n = len(DEMO_PROMPTS)

    def delta(name: str) -> float:
        return after[f"fastdeploy:{name}"] - before[f"fastdeploy:{name}"]

    assert (
        delta(f'splitwise_kv_transfers_total{{transport="{transport}"}}') == n
    )  # counted per transport
    assert delta("splitwise_kv_transfers_total") == n
    assert delta(f'splitwise_kv_transfer_bytes_total{{transport="{transport}"}}') > 0
    # the decode instance's first verify round checked the prefill instance's 3 drafts per
    # request and accepted some of them
    assert delta("splitwise_first_round_draft_tokens_total") == 3 * n
    assert delta("splitwise_first_round_accepted_tokens_total") >= n // 2
    wait_for(lambda: blocks_all_back(p, d))


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_decode_instance_that_holds_the_prefix_pulls_only_the_rest(mtp3, transport):
    """Prefix caching on both instances: once the decode instance imported one request with
    a system prompt, later requests with the same system prompt find its blocks in the decode
    instance's own cache, and the transfer moves only the blocks after it."""
    p, d = mtp3["prefill"], mtp3[transport]
    system = f"[{transport}] The harbor office answers questions about ships and tides, briefly. "
    prompts = [
        system + q
        for q in ("Which ship left first?", "When is the next tide?", "Who keeps the lamp?")
    ]
    name = f'fastdeploy:splitwise_kv_transfer_bytes_total{{transport="{transport}"}}'
    got = []
    with router(p, d) as url:
        before = metrics(d.base_url)[name]
        got += asyncio.run(complete_all(url, prompts[:1]))
        first = metrics(d.base_url)[name] - before
        got += asyncio.run(complete_all(url, prompts[1:]))
        later = metrics(d.base_url)[name] - before - first
    assert got == offline(prompts, spec=MTP3)
    # 96-byte prompts (16-token blocks): about 7 blocks offered each; the later two already
    # hold the system prompt's 4 whole blocks and pull about 3
    assert 0 < later / 2 < 0.6 * first, (first, later)
    wait_for(lambda: blocks_all_back(p, d))


def test_staggered_requests_with_different_lengths_equal_mixed(mtp3):
    prompts = [DEMO_PROMPTS[i % len(DEMO_PROMPTS)][: 6 + 5 * i] for i in range(10)]
    with router(mtp3["prefill"], mtp3["tcp"]) as url:
        got = asyncio.run(complete_all(url, prompts, max_tokens=16, stagger=0.05))
    assert got == offline(prompts, max_tokens=16, spec=MTP3)


def test_a_request_that_ends_at_its_first_token_never_reaches_the_decode_instance(mtp3):
    before = metrics(mtp3["tcp"].base_url)["fastdeploy:splitwise_kv_transfers_total"]
    with router(mtp3["prefill"], mtp3["tcp"]) as url:
        got = asyncio.run(complete_all(url, DEMO_PROMPTS[:4], max_tokens=1))
    assert got == offline(DEMO_PROMPTS[:4], max_tokens=1, spec=MTP3)
    assert metrics(mtp3["tcp"].base_url)["fastdeploy:splitwise_kv_transfers_total"] == before
    wait_for(lambda: blocks_all_back(mtp3["prefill"]))


@pytest.mark.parametrize("spec", [HYBRID, MTP1], ids=["hybrid-ngram", "mtp-k1"])
def test_other_speculation_set_ups_prefill_and_decode_equal_mixed(spec):
    with instances(("prefill", spec), ("decode", spec)) as (p, d), router(p, d) as url:
        got = asyncio.run(complete_all(url, DEMO_PROMPTS))
        assert metrics(d.base_url)["fastdeploy:splitwise_first_round_accepted_tokens_total"] > 0
    assert got == offline(DEMO_PROMPTS, spec=spec)


# ---- protocol checks -------------------------------------------------------------------------
def test_instances_refuse_openai_requests_and_foreign_handoffs(mtp3):
    p, d = mtp3["prefill"], mtp3["tcp"]
    status, body = post(p.base_url + "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert status == 400 and "router" in body["error"]["message"]
    status, first = splitwise_post(
        p.base_url + "/v1/splitwise/prefill",
        {"request_id": "f1", "prompt_token_ids": [100, 101, 102], "max_tokens": 8},
    )
    assert status == 200 and first["finished"] is False and len(first["output_token_ids"]) == 1
    assert len(first["draft_token_ids"]) == 3 and all(
        0 <= t < 512 for t in first["draft_token_ids"]
    )
    handoff = first["handoff"]
    request = {
        "request_id": "f1",
        "prompt_token_ids": [100, 101, 102],
        "output_token_ids": first["output_token_ids"],
        "max_tokens": 8,
    }
    # a prefill instance of this deployment with one more MTP layer (signed: it holds the secret)
    bad = json.loads(json.dumps(handoff))
    bad["kv"]["layout"]["caches"] += bad["kv"]["layout"]["caches"][-2:]  # one more MTP layer's pair
    status, body = splitwise_post(
        d.base_url + "/v1/splitwise/decode", {**request, "handoff": resigned(bad, request)}
    )
    assert status == 400 and "first unmatched: mtp layer 0 key" in body["error"]["message"], body
    bad = json.loads(json.dumps(handoff))
    del bad["state"]["draft"]["pre_ids"]
    status, body = splitwise_post(
        d.base_url + "/v1/splitwise/decode", {**request, "handoff": resigned(bad, request)}
    )
    assert status == 400 and "pre_ids" in body["error"]["message"], body
    # the real handoff still works after the refusals
    status, events = splitwise_post(
        d.base_url + "/v1/splitwise/decode", {**request, "handoff": handoff}
    )
    assert status == 200 and events[-1] == {"finish_reason": "length"}
    assert sum(len(e.get("token_ids", [])) for e in events) == 8 - 1
    wait_for(lambda: blocks_all_back(p, d))


def test_a_second_instance_with_the_same_device_ids_is_refused(mtp3):
    args = list(mtp3["prefill"].proc.args)  # type: ignore[arg-type]
    taken = args[args.index("--device-ids") + 1]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastdeploy_mtp.entrypoints.cli",
            "serve",
            "--splitwise-role",
            "decode",
            "--device-ids",
            taken,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        out.returncode == 2
        and "--device-ids" in out.stderr
        and "belongs to a running deployment" in out.stderr
    ), out.stderr


# ---- faults ----------------------------------------------------------------------------------
def test_a_full_decode_instance_back_pressures_the_router_and_nothing_is_lost(mtp3, expected_mtp3):
    with (
        instances(("decode", MTP3, "--max-num-seqs", "1", "--max-waiting-requests", "1")) as (
            small,
        ),
        router(mtp3["prefill"], small) as url,
    ):
        got = asyncio.run(complete_all(url, DEMO_PROMPTS[:5]))
        retries = metrics(url)["fastdeploy:router_decode_retries_total"]
    assert got == expected_mtp3[:5]
    assert retries > 0  # the decode instance said 429 and the router waited instead of dropping


def test_a_prefill_instance_that_dies_or_lets_the_hold_expire_fails_the_request_on_the_decode_side(
    mtp3,
):
    d_tcp, d_shm = mtp3["tcp"], mtp3["shm"]
    shm_before = shm_names()
    p = instance("prefill", MTP3, "--kv-hold-timeout", "2")
    handoffs: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}

    def prefill(rid: str) -> None:
        body = {"request_id": rid, "prompt_token_ids": list(b"def f(x): return"), "max_tokens": 12}
        status, out = splitwise_post(p.base_url + "/v1/splitwise/prefill", body)
        assert status == 200 and out["handoff"], out
        handoffs[rid] = (body, out)

    def decode(server: ServerProcess, rid: str) -> tuple[float, list[dict[str, Any]]]:
        body, out = handoffs[rid]
        t0 = time.monotonic()
        status, events = splitwise_post(
            server.base_url + "/v1/splitwise/decode",
            {**body, "output_token_ids": out["output_token_ids"], "handoff": out["handoff"]},
        )
        assert status == 200, events
        return time.monotonic() - t0, events

    try:
        # 1. nobody fetched within the hold timeout: the prefill instance frees the blocks, and
        #    a decode instance that asks later is told the offer expired
        prefill("late")
        assert metrics(p.base_url)["fastdeploy:splitwise_kv_blocks_held"] > 0
        wait_for(
            lambda: metrics(p.base_url)["fastdeploy:splitwise_kv_blocks_held"] == 0, timeout=30
        )
        _, events = decode(d_tcp, "late")
        assert "error" in events[-1] and "expired" in events[-1]["error"]["message"], events
        # 2. two more requests are handed off, then the prefill instance dies before any
        #    decode instance fetched their blocks
        prefill("gone-tcp")
        prefill("gone-shm")
    finally:
        os.kill(p.proc.pid, signal.SIGKILL)  # its children follow it (parent-death signal)
        p.proc.wait(30)
    wait_for(lambda: not any(alive(c) for c in p.children), timeout=30)
    try:
        # and they removed its names
        wait_for(
            lambda: not own_names(shm_names() - shm_before, p.queue_port, p.device_ids), timeout=30
        )
    except AssertionError:
        raise AssertionError(
            "the killed prefill instance's children left "
            f"{own_names(shm_names() - shm_before, p.queue_port, p.device_ids)}:\n{p.output()}"
        ) from None
    p.leftovers()  # removes the token queue a SIGKILLed engine cannot (the next start would)
    p.close_log()
    # the decode instances fail those requests with an error naming the prefill instance,
    # within the bounded transfer timeout
    address = handoffs["gone-tcp"][1]["handoff"]["kv"]["address"]
    for server, rid in ((d_tcp, "gone-tcp"), (d_shm, "gone-shm")):
        took, events = decode(server, rid)
        assert "error" in events[-1], events
        message = events[-1]["error"]["message"]
        assert "KV transfer failed" in message and address in message, message
        assert took < TRANSFER_TIMEOUT + 10
        assert metrics(server.base_url)["fastdeploy:splitwise_kv_transfer_failures_total"] >= 1
    # ... and free the blocks they had given the requests, and go on serving
    wait_for(lambda: blocks_all_back(d_tcp, d_shm))
    with router(mtp3["prefill"], d_tcp) as url:
        assert asyncio.run(complete_all(url, DEMO_PROMPTS[:2])) == offline(
            DEMO_PROMPTS[:2], spec=MTP3
        )


def test_tensor_parallel_prefill_and_decode_and_a_tp_mismatch(mtp3):
    tp2 = ("--tensor-parallel-size", "2")
    with (
        instances(
            ("prefill", MTP3, *tp2, "--kv-hold-timeout", "3"),
            ("decode", MTP3, *tp2, "--kv-transport", "tcp"),
        ) as (
            p,
            d,
        ),
        router(p, d) as url,
    ):
        got = asyncio.run(complete_all(url, DEMO_PROMPTS[:3]))
        assert metrics(d.base_url)["fastdeploy:splitwise_kv_transfers_total"] == 3
        # a tp-1 decode instance cannot take a tp-2 prefill instance's blocks
        body = {"request_id": "tp", "prompt_token_ids": [100, 101, 102], "max_tokens": 8}
        status, out = splitwise_post(p.base_url + "/v1/splitwise/prefill", body)
        assert status == 200
        status, err = splitwise_post(
            mtp3["tcp"].base_url + "/v1/splitwise/decode",
            {**body, "output_token_ids": out["output_token_ids"], "handoff": out["handoff"]},
        )
        assert status == 400 and "tensor_parallel_size" in err["error"]["message"], err
        wait_for(lambda: blocks_all_back(p), timeout=30)  # nobody took that offer: it expires
    assert got == offline(DEMO_PROMPTS[:3], spec=MTP3)

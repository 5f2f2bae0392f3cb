"""Splitwise checks shared by the serving tests: :func:`handed_over_every_cache` (one request
handed from a prefill instance to a decode instance, its KV descriptor counted cache by cache)
and :func:`router_command` (``fastdeploy-mtp router`` as a child process)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import numpy as np

from fastdeploy_mtp.credentials import splitwise_secret
from fastdeploy_mtp.distributed import find_free_port_range
from fastdeploy_mtp.splitwise.handoff import sign_handoff
from tests.support.servers import http_get, scrape_metrics, splitwise_post


def resigned(handoff: dict, request: dict) -> dict:
    """``handoff`` signed again with this test run's splitwise secret for ``request`` (its
    ``request_id``, ``prompt_token_ids``, ``output_token_ids``): what a prefill instance of
    this deployment would send if its caches, state or descriptor were these. Lets a test
    reach the checks behind the signature with a deliberately different hand-over."""
    signature = sign_handoff(
        splitwise_secret(),
        request["request_id"],
        request["prompt_token_ids"],
        request["output_token_ids"],
        handoff["state"],
        handoff["kv"],
    )
    return {**handoff, "signature": signature}


#: bytes per element of the cache dtypes a descriptor names
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def handed_over_every_cache(
    prefill: str,
    decode: str,
    request_id: str,
    prompt_ids: list[int],
    *,
    target_layers: int,
    mtp_layers: int,
    tensor_parallel_size: int,
    max_tokens: int = 8,
    kinds: tuple[str, ...] = ("key", "value"),
) -> list[int]:
    """One greedy request of ``max_tokens`` through ``prefill`` and then ``decode`` (base URLs):
    its hand-over offers every cache of every rank (per rank the ``kinds`` caches -- a key and
    a value, or one ``("latent",)`` cache -- of each of ``target_layers`` target layers, then of
    each of ``mtp_layers`` MTP layers, each under its own name), the decode instance refuses it
    with a differing cache spec (naming the last MTP layer's last cache) and then takes exactly
    all of those caches' blocks (but those its prefix cache already holds). Returns the
    request's output token ids (the prefill's first ones and the decode's)."""
    body = {"request_id": request_id, "prompt_token_ids": prompt_ids, "max_tokens": max_tokens}
    status, first = splitwise_post(prefill + "/v1/splitwise/prefill", body)
    assert status == 200 and first["finished"] is False, first
    kv = first["handoff"]["kv"]
    caches = kv["layout"]["caches"]
    assert kv["layout"]["tensor_parallel_size"] == tensor_parallel_size
    per_owner = {
        o: [(c["layer"], c["kind"]) for c in caches if c["owner"] == o] for o in ("target", "mtp")
    }
    assert per_owner == {
        "target": [(n, k) for n in range(target_layers) for k in kinds],
        "mtp": [(n, k) for n in range(mtp_layers) for k in kinds],
    }
    per_rank = len(kinds) * (target_layers + mtp_layers)
    assert [len(rank) for rank in kv["shm_names"]] == [per_rank] * tensor_parallel_size
    for r, names in enumerate(
        kv["shm_names"]
    ):  # FastDeploy's names, the MTP layers after the target's
        expected_names = [
            f"{k}_caches_{n}_rank{r}" for n in range(target_layers + mtp_layers) for k in kinds
        ]
        assert [name.rsplit(".device", 1)[0] for name in names] == expected_names
    request = {**body, "output_token_ids": first["output_token_ids"]}
    last = f"mtp layer {mtp_layers - 1} {kinds[-1]}"
    other = "float16" if caches[-1]["dtype"] == "bfloat16" else "bfloat16"
    for change, message in (
        (
            lambda c: c[-1].update(dtype=other),
            f"cache {per_rank - 1} ({last}): dtype {other} on the prefill",
        ),
        (lambda c: c.pop(), f"first unmatched: {last}"),
    ):
        bad = json.loads(json.dumps(first["handoff"]))
        change(bad["kv"]["layout"]["caches"])
        status, err = splitwise_post(decode + "/v1/splitwise/decode", {**request, "handoff": bad})
        assert status == 400 and "signature does not match" in err["error"]["message"], (
            err
        )  # changed on the way
        status, err = splitwise_post(
            decode + "/v1/splitwise/decode", {**request, "handoff": resigned(bad, request)}
        )
        assert status == 400 and message in err["error"]["message"], err
    before = scrape_metrics(decode)
    status, events = splitwise_post(
        decode + "/v1/splitwise/decode", {**request, "handoff": first["handoff"]}
    )
    assert status == 200 and events[-1] == {"finish_reason": "length"}, events
    after = scrape_metrics(decode)
    one_block = sum(
        int(np.prod(c["shape"][1:])) * _ITEMSIZE[c["dtype"]] for c in caches
    )  # every cache of one rank
    moved = (
        after["fastdeploy:splitwise_kv_transfer_bytes_total"]
        - before["fastdeploy:splitwise_kv_transfer_bytes_total"]
    )
    # the decode instance's prefix cache may already hold the prompt's first blocks (an
    # earlier request with this prompt): those are not transferred
    hits = (
        after["fastdeploy:prefix_cache_hits_total"] - before["fastdeploy:prefix_cache_hits_total"]
    )
    block_size = caches[0]["shape"][2]  # [num_blocks, heads, block_size, head_dim]
    assert hits % block_size == 0
    assert (
        moved == tensor_parallel_size * (len(kv["block_ids"]) - int(hits) // block_size) * one_block
    )
    return [*first["output_token_ids"], *(t for e in events[:-1] for t in e.get("token_ids", []))]


@contextlib.contextmanager
def router_command(
    prefill: str, decode: str, *extra: str, start_timeout: float = 60.0
) -> Iterator[str]:
    """``fastdeploy-mtp router --prefill prefill --decode decode *extra`` on a free loopback
    port, in a child process of its own session; yields its base URL once ``/health`` is 200.
    On exit it gets SIGTERM and must exit 0 (killed, and the test failed, if it does not)."""
    port = find_free_port_range(1)
    cmd = [sys.executable, "-m", "fastdeploy_mtp.entrypoints.cli", "router", "--port", str(port)]
    cmd += ["--prefill", prefill, "--decode", decode, "--start-timeout", str(start_timeout), *extra]
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def output() -> str:
        log.seek(0)
        return log.read()

    try:
        deadline = time.monotonic() + start_timeout
        while True:
            assert proc.poll() is None, f"the router exited with {proc.returncode}:\n{output()}"
            with contextlib.suppress(OSError):
                if http_get(url + "/health", timeout=2)[0] == 200:
                    break
            assert time.monotonic() < deadline, f"the router did not become healthy:\n{output()}"
            time.sleep(0.1)
        yield url
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (
            f"the router exited with {proc.returncode} on SIGTERM:\n{output()}"
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()

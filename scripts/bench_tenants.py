"""Tenant isolation benchmark: what the prefix cache's timing channel shows, and what the
namespaces cost, in one run.

A ``fastdeploy-mtp serve`` with two API keys (``--api-key-file``) gets, per round, a fresh
prompt of ``--prompt-bytes`` bytes (one token per byte for the shipped model), streamed with
the ``openai`` client, in this order: key A (a miss), key A again (a hit: what a probing
client would see if the cache were shared), key B (the same prompt from another tenant:
isolated, so a miss again), key A with a ``cache_salt`` (a miss). The table gives the
client-side time to the first token (median over ``--rounds`` rounds) and its ratio to the
first miss: a B row near 1.0 means the other tenant learns nothing from the time. The same
rounds against a server with ``--prefix-cache-scope global`` show the channel the default
closes (B finds A's blocks). Beside it, in this process: microseconds per request of the
namespace (:func:`fastdeploy_mtp.tenancy.cache_namespace`) and of the block keys with and
without one.

    python scripts/bench_tenants.py [--rounds 8] [--prompt-bytes 768] [--json out.json]
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import openai  # noqa: E402
from bench_report import bench_parser, print_table, write_json  # noqa: E402

from fastdeploy_mtp.runtime.block_pool import block_keys  # noqa: E402
from fastdeploy_mtp.tenancy import ClientKeys, cache_namespace  # noqa: E402
from tests.support.servers import ServerProcess, stopped_cleanly  # noqa: E402

KEYS = ("sk-bench-tenant-a-" + "a" * 16, "sk-bench-tenant-b-" + "b" * 16)
ORDER = [("A, first (miss)", 0, None), ("A, again (hit)", 0, None)]
ORDER += [("B, same prompt", 1, None), ("A, with cache_salt", 0, "bench-salt")]


def ttft(url: str, key: str, prompt: str, salt: str | None) -> float:
    """Seconds from sending a streamed completion to its first token."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    extra = {"ignore_eos": True, **({} if salt is None else {"cache_salt": salt})}
    t0 = time.perf_counter()
    stream = client.completions.create(
        model=None, prompt=prompt, max_tokens=4, stream=True, extra_body=extra
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - t0
            break
    for _ in stream:  # drain
        pass
    return first


def rounds(url: str, count: int, size: int) -> dict[str, float]:
    """Median TTFT per row of :data:`ORDER` over ``count`` fresh prompts."""
    times: dict[str, list[float]] = {label: [] for label, _, _ in ORDER}
    base = "The harbor office logs each ship, its cargo, its crew and its next port. "
    for r in range(count + 1):  # round 0 warms the server up
        prompt = (f"[round {r}] " + base * (size // len(base) + 1))[:size]
        for label, key, salt in ORDER:
            t = ttft(url, KEYS[key], prompt, salt)
            if r:
                times[label].append(t)
    return {label: statistics.median(ts) for label, ts in times.items()}


def namespace_costs() -> list[list[str]]:
    """Microseconds per request: the namespace, and the block keys of a 768-token prompt with
    and without it."""
    tokens = list(range(768))
    tenant = ClientKeys(KEYS).tenant(0)
    ns = cache_namespace(tenant, "bench-salt")
    n = 2000
    us = {
        "cache_namespace (tenant + salt)": timeit.timeit(
            lambda: cache_namespace(tenant, "bench-salt"), number=n
        ),
        "block_keys, 768 tokens, global": timeit.timeit(
            lambda: block_keys(tokens, 16, True), number=n
        ),
        "block_keys, 768 tokens, namespaced": timeit.timeit(
            lambda: block_keys(tokens, 16, True, ns), number=n
        ),
    }
    return [[name, f"{t / n * 1e6:.1f}"] for name, t in us.items()]


def main() -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request
    ap = bench_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--prompt-bytes", type=int, default=768)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        key_file = os.path.join(tmp, "keys")
        with open(key_file, "w") as f:
            f.write("\n".join(KEYS) + "\n")
        os.chmod(key_file, 0o600)
        results = {}
        for scope in ("per-key", "global"):
            srv = ServerProcess(
                ["--api-key-file", key_file, "--prefix-cache-scope", scope],
                slots=None,
            )
            try:
                results[scope] = rounds(srv.base_url, args.rounds, args.prompt_bytes)
            finally:
                stopped_cleanly(srv)
    rows, table = [], []
    for label, _, _ in ORDER:
        cells = [label]
        for scope in ("per-key", "global"):
            t = results[scope][label]
            miss = results[scope][ORDER[0][0]]
            cells += [f"{t * 1e3:.1f}", f"{t / miss:.2f}"]
            rows.append({"scope": scope, "row": label, "ttft_s": t, "ratio_to_miss": t / miss})
        table.append(cells)
    header = ["request", "per-key TTFT ms", "/miss", "global TTFT ms", "/miss"]
    print(f"time to first token, median of {args.rounds} prompts of {args.prompt_bytes} bytes")
    print_table(header, table)
    print()
    print_table(["per request", "µs"], namespace_costs())
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

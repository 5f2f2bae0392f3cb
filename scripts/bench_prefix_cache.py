"""Prefix-caching benchmark: a shared-system-prompt workload against ``fastdeploy-mtp serve``
with prefix caching on and off, MTP on and off, in one run.

Every client sends one streamed chat-style completion: the same long system prompt, then a
question of its own (and every question is asked twice, as a second wave, the way a retry
or a regenerate would). Per configuration it reports the client-side time to first token
(p50 / p99), output tokens/s, and from the server's ``/metrics`` the prefix-cache hit rate
(prompt tokens found in the cache / prompt tokens looked up), the mean of the server's
``fastdeploy:time_to_first_token_seconds`` histogram when the server exports it, and the
peak KV-cache use. Ratios between rows of one run are what to compare.

    python scripts/bench_prefix_cache.py [--clients 16] [--system-bytes 768] [--max-tokens 32]
                                         [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from bench_report import bench_parser, print_table, write_json  # noqa: E402

from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS  # noqa: E402
from tests.support.servers import ServerProcess  # noqa: E402

NO_SPEC = ["--speculative-config", '{"method": null}']
MTP3 = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}']
CONFIGS = [
    ("MTP K=3 S=3, prefix caching on", [*MTP3, "--enable-prefix-caching"]),
    ("MTP K=3 S=3, prefix caching off", [*MTP3, "--no-enable-prefix-caching"]),
    ("no speculation, prefix caching on", [*NO_SPEC, "--enable-prefix-caching"]),
    ("no speculation, prefix caching off", [*NO_SPEC, "--no-enable-prefix-caching"]),
]


def system_prompt(size: int) -> str:
    """A system prompt of ``size`` bytes (one token per byte for the byte-level model)."""
    text = "You are a careful assistant for a harbor office. Answer in one short paragraph. "
    while len(text) < size:
        text += text
    return text[:size]


def scrape(url: str) -> dict[str, float]:
    """The server's ``/metrics`` as ``{name{labels}: value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        body = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


async def one_client(client, prompt: str, max_tokens: int) -> tuple[float, int]:
    """(TTFT seconds, output tokens) of one streamed completion."""
    t0 = time.perf_counter()
    stream = await client.completions.create(
        model="fastdeploy-mtp-tiny", prompt=prompt, max_tokens=max_tokens, stream=True
    )
    ttft, tokens = None, 0
    async for chunk in stream:
        piece = chunk.choices[0].text if chunk.choices else ""
        if piece and ttft is None:
            ttft = time.perf_counter() - t0
        tokens += len(piece.encode())
    return ttft or 0.0, tokens


async def run_workload(url: str, args: argparse.Namespace, peak: list[float]) -> dict[str, float]:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    system = system_prompt(args.system_bytes)
    questions = [DEMO_PROMPTS[i % len(DEMO_PROMPTS)][:60] for i in range(args.clients)]
    prompts = [f"{system}\nuser: {q} (#{i})\nassistant:" for i, q in enumerate(questions)]

    async def watch() -> None:
        while True:
            m = await asyncio.to_thread(scrape, url)
            peak[0] = max(peak[0], m.get("fastdeploy:kv_cache_usage_perc", 0.0))
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch())
    try:
        t0 = time.perf_counter()
        results = []
        for _wave in range(2):
            results += await asyncio.gather(
                *(one_client(client, p, args.max_tokens) for p in prompts)
            )
        wall = time.perf_counter() - t0
    finally:
        watcher.cancel()
        await client.close()
    ttfts = np.array([r[0] for r in results]) * 1e3
    return {
        "ttft_p50_ms": float(np.percentile(ttfts, 50)),
        "ttft_p99_ms": float(np.percentile(ttfts, 99)),
        "tokens_per_s": sum(r[1] for r in results) / wall,
    }


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument(
        "--clients", type=int, default=16, help="concurrent clients per wave (two waves)"
    )
    ap.add_argument(
        "--system-bytes", type=int, default=768, help="length of the shared system prompt"
    )
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument(
        "--only", default=None, help="run only the configurations whose label contains this"
    )
    args = ap.parse_args()
    rows = []
    for label, extra in CONFIGS:
        if args.only and args.only not in label:
            continue
        print(f"[bench_prefix_cache] {label}", file=sys.stderr, flush=True)
        server = ServerProcess(
            [*extra, "--max-num-seqs", str(args.max_num_seqs), "--max-model-len", "2048"]
        )
        try:
            peak = [0.0]
            row = asyncio.run(run_workload(server.base_url, args, peak))
            m = scrape(server.base_url)
        finally:
            server.stop()
            server.close_log()
        queries = m.get("fastdeploy:prefix_cache_queries_total", 0.0)
        count = m.get("fastdeploy:time_to_first_token_seconds_count", 0.0)
        ttft_sum = m.get("fastdeploy:time_to_first_token_seconds_sum", 0.0)
        row.update(
            config=label,
            hit_rate=m.get("fastdeploy:prefix_cache_hits_total", 0.0) / queries if queries else 0.0,
            server_ttft_mean_ms=1e3 * ttft_sum / count if count else 0.0,
            peak_kv_usage=peak[0],
        )
        rows.append(row)
    print(
        f"\n{args.clients} clients x 2 waves, system prompt {args.system_bytes} bytes, "
        f"{args.max_tokens} tokens\n"
    )
    header = ["config", "prefix hit rate", "TTFT p50 ms", "TTFT p99 ms", "server TTFT mean ms"]
    print_table(
        [*header, "tok/s", "peak KV use"],
        (
            (
                r["config"],
                f"{r['hit_rate']:.2f}",
                f"{r['ttft_p50_ms']:.0f}",
                f"{r['ttft_p99_ms']:.0f}",
                f"{r['server_ttft_mean_ms']:.0f}",
                f"{r['tokens_per_s']:.0f}",
                f"{r['peak_kv_usage']:.2f}",
            )
            for r in rows
        ),
    )
    write_json(args.json, rows, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

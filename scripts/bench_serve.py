"""Serving benchmark: N concurrent streaming clients against ``fastdeploy-mtp serve`` over
loopback, for several server configurations in one run (MTP on/off, TP 1/2), as a table.

Per configuration it starts a server (cache manager + workers), warms it up, runs the
clients (each streams one completion of a demo prompt with the ``openai`` client), stops it,
and reports: output tokens/s over the whole run, and p50/p99 of time-to-first-token (TTFT)
and inter-token latency (ITL: the gaps between streamed chunks, divided by the tokens each
chunk carried — speculation delivers several tokens per chunk). Ratios between rows of one
run are what to compare; absolute numbers depend on the machine.

    python scripts/bench_serve.py [--clients 16,64,128] [--max-tokens 64] [--json out.json]
                                  [--pd] [--netns] [--model DIR]
    python scripts/bench_serve.py --batch-sizes 1,2,4,8,16,32,64,128 [--repeat 3] [--model DIR]

Every client's completion runs to ``--max-tokens`` (``ignore_eos``: the end-of-text token is
masked), so every configuration does the same work and tokens/s counts real tokens.

``--batch-sizes`` compares two mixed servers, no speculation and the default speculation
(no speculation flags), both started once and up together: a batch size B is one round of B
concurrent clients on each, back to back (so that a ratio compares rounds seconds apart).
Per batch size the table gives tokens/s of each, their ratio, and from the growth of the
speculative server's ``/metrics`` counters over its rounds the drafts offered per decoding
slot per round, the mean accepted length and the method mix (each method's share of the
drafts offered: the per-method counter where the server has one, else the configured
method's). ``--repeat N`` runs every round N times (all batch sizes, then again) and prints
median [min, max] of tokens/s and of the ratio, each ratio taken between the rounds of the
same repeat. ``--model DIR`` serves another model folder in every configuration.

``--clients`` takes a comma-separated list: each configuration's server is started once and
runs one round per client count. The mixed servers run ``--token-channel shm`` with the
default ``--max-num-seqs`` (from the KV memory: 256 slots for the shipped model on most
hosts; ``--max-num-seqs N`` overrides it). During each round ``/metrics`` is scraped every
50 ms and the table reports the peak of ``fastdeploy:num_requests_running`` (sequences
holding a slot at once) and, per client count and TP size, the throughput of each MTP row
over the no-speculation row (``MTP/no-MTP``).

With ``--pd`` it compares splitwise deployments instead: a mixed server against a prefill
instance + a decode instance + ``fastdeploy-mtp router`` (KV over shared memory and over
TCP and through the Mooncake transfer engine), all on this host, same clients. On one
machine P and D share the CPU cores, so PD cannot win throughput here; the table shows what
the hand-over costs in TTFT and ITL per transport (``scripts/bench_kv_transfer.py`` measures
the transports' throughput across a network link). With ``--netns`` every process runs on a
host of its own (network namespaces joined by a bridge: ``tests/support/netns.py``), the
clients on the router's, so the KV and the HTTP traffic cross a real link.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from bench_report import bench_parser, median_range, print_table, write_json  # noqa: E402

from fastdeploy_mtp.distributed import find_free_port_range  # noqa: E402
from fastdeploy_mtp.entrypoints.demo_sweep import (  # noqa: E402
    SWEEP_COLUMNS,
    SWEEP_LEGEND,
    batch_sizes,
    mix_text,
    per_step,
)
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS  # noqa: E402
from tests.support.netns import Hosts  # noqa: E402
from tests.support.servers import ServerProcess, router_command, scrape_metrics  # noqa: E402

NO_SPEC = ["--speculative-config", '{"method": null}']
HYBRID = [
    "--speculative-config",
    '{"method": "mtp", "num_speculative_tokens": 3, "mtp_strategy": "with_ngram"}',
]
MTP3 = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}']
TP2 = ["--tensor-parallel-size", "2"]
#: ``--batch-sizes``: plain decoding against the default speculation (no flags)
SWEEP_CONFIGS = [("no speculation", NO_SPEC), ("default speculation", [])]
CONFIGS = [
    ("no speculation, tp 1", NO_SPEC),
    ("MTP K=3 S=1 +ngram, tp 1", HYBRID),
    ("MTP K=3 S=3, tp 1", MTP3),
    ("no speculation, tp 2", NO_SPEC + TP2),
    ("MTP K=3 S=1 +ngram, tp 2", HYBRID + TP2),
]

PD_CONFIGS = [
    ("mixed, MTP K=3 S=1 +ngram", "mixed", HYBRID),
    ("PD shm, MTP K=3 S=1 +ngram", "shm", HYBRID),
    ("PD tcp, MTP K=3 S=1 +ngram", "tcp", HYBRID),
    ("PD mooncake, MTP K=3 S=1 +ngram", "mooncake", HYBRID),
    ("mixed, MTP K=3 S=3", "mixed", MTP3),
    ("PD shm, MTP K=3 S=3", "shm", MTP3),
    ("PD tcp, MTP K=3 S=3", "tcp", MTP3),
    ("PD mooncake, MTP K=3 S=3", "mooncake", MTP3),
    ("mixed, no speculation", "mixed", NO_SPEC),
    ("PD tcp, no speculation", "tcp", NO_SPEC),
]


@contextlib.contextmanager
def deployment(
    kind: str, spec: list[str], hosts: Hosts | None = None
) -> Iterator[tuple[str, list[int]]]:
    """A mixed server (``kind == "mixed"``) or P + D + router with KV transport ``kind``;
    yields (base URL, exit codes filled in at the end). With ``hosts`` the server (or P, D and
    the router) run on hosts of their own (``prefill``, ``decode``, ``router``)."""
    if hosts is not None:
        with _netns_deployment(kind, spec, hosts) as out:
            yield out
        return
    codes: list[int] = []
    if kind == "mixed":
        srv = ServerProcess(spec, slots=None)
        try:
            yield srv.base_url, codes
        finally:
            codes.append(srv.stop())
            srv.close_log()
        return
    base = 900 + os.getpid() % 50 * 4
    offered = (
        ["--kv-transport", "mooncake"] if kind == "mooncake" else []
    )  # P registers its caches with the engine
    p = ServerProcess(
        [*spec, "--splitwise-role", "prefill", "--device-ids", str(base), *offered], slots=None
    )
    d = None
    router = None
    log = tempfile.TemporaryFile()
    try:
        d = ServerProcess(
            [
                *spec,
                "--splitwise-role",
                "decode",
                "--device-ids",
                str(base + 1),
                "--kv-transport",
                kind,
            ],
            slots=None,
        )
        port = find_free_port_range(1)
        cmd = router_command(port)
        router = subprocess.Popen(
            [*cmd, "--prefill", p.base_url, "--decode", d.base_url],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(router, log, url, lambda fn: fn())
        yield url, codes
    finally:
        if router is not None:
            router.send_signal(signal.SIGINT)
            codes.append(router.wait(30))
        for srv in (d, p):
            if srv is not None:
                codes.append(srv.stop())
                srv.close_log()
        log.close()


def _wait_healthy(
    router: subprocess.Popen, log: Any, url: str, reach: Callable[[Callable[[], None]], None]
) -> None:
    """Wait (120 s at most) until the router at ``url`` answers ``/health``, probing through
    ``reach`` (which runs the probe where the router can be reached); its log if it fails."""
    deadline = time.monotonic() + 120
    while True:
        try:
            reach(lambda: urllib.request.urlopen(url + "/health", timeout=2).close())
            return
        except OSError:
            if router.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"the router did not start:\n{log.read().decode()}") from None
            time.sleep(0.2)


@contextlib.contextmanager
def _netns_deployment(kind: str, spec: list[str], hosts: Hosts) -> Iterator[tuple[str, list[int]]]:
    codes: list[int] = []
    servers: list[ServerProcess] = []
    router = None
    log = tempfile.TemporaryFile()
    try:
        if kind == "mixed":
            servers.append(ServerProcess(spec, on=(hosts, "prefill"), slots=None))
            yield servers[0].base_url, codes
            return
        offered = ["--kv-transport", "mooncake"] if kind == "mooncake" else []
        servers.append(
            ServerProcess(
                [*spec, "--splitwise-role", "prefill", *offered], on=(hosts, "prefill"), slots=None
            )
        )
        d_args = [*spec, "--splitwise-role", "decode", "--kv-transport", kind]
        servers.append(ServerProcess(d_args, on=(hosts, "decode"), slots=None))
        port = find_free_port_range(1)
        url = f"http://{hosts.addresses['router']}:{port}"
        cmd = router_command(port)
        cmd += [
            "--host",
            hosts.addresses["router"],
            "--prefill",
            servers[0].base_url,
            "--decode",
            servers[1].base_url,
        ]
        router = subprocess.Popen(
            hosts.command("router", cmd), stdout=log, stderr=subprocess.STDOUT
        )
        _wait_healthy(router, log, url, lambda fn: hosts.call("router", fn))
        yield url, codes
    finally:
        if router is not None:
            router.send_signal(signal.SIGINT)
            codes.append(router.wait(30))
        for srv in reversed(servers):
            codes.append(srv.stop())
            srv.close_log()
        log.close()


async def one_client(c, model: str, prompt: str, max_tokens: int) -> tuple[float, list[float], int]:
    """Returns (TTFT, per-token inter-arrival gaps, tokens) of one streamed completion, which
    runs to ``max_tokens`` (``ignore_eos``: the end-of-text token is masked)."""
    t0 = time.perf_counter()
    stream = await c.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    ttft, last, gaps, text = None, None, [], ""
    async for chunk in stream:
        now = time.perf_counter()
        piece = chunk.choices[0].text if chunk.choices else ""
        if not piece:
            continue
        if ttft is None:
            ttft = now - t0
        elif last is not None:
            n = max(1, len(piece.encode()))  # byte model: one token per byte
            gaps.extend([(now - last) / n] * n)
        last = now
        text += piece
    return (ttft or 0.0), gaps, max_tokens


async def run_clients(base_url: str, clients: int, max_tokens: int) -> dict[str, Any]:
    """One round: a warm-up request, then ``clients`` concurrent streams (the demo prompts,
    cycled); their throughput and latencies, and in ``"spec"`` how the server's speculation
    counters (:data:`SPEC_COUNTERS`, per method too) grew over the round."""
    import openai

    c = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=600)
    try:
        model = (await c.models.list()).data[0].id
        await one_client(c, model, DEMO_PROMPTS[0], 8)  # warm-up
        before = scrape_metrics(base_url)
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(
                one_client(c, model, DEMO_PROMPTS[i % len(DEMO_PROMPTS)], max_tokens)
                for i in range(clients)
            )
        )
        wall = time.perf_counter() - t0
        spec = spec_deltas(before, scrape_metrics(base_url))
    finally:
        await c.close()
    ttfts = np.array([r[0] for r in results]) * 1e3
    gaps = np.array([g for r in results for g in r[1]]) * 1e3
    tokens = sum(r[2] for r in results)
    return {
        "tokens_per_s": tokens / wall,
        "ttft_p50_ms": float(np.percentile(ttfts, 50)),
        "ttft_p99_ms": float(np.percentile(ttfts, 99)),
        "itl_p50_ms": float(np.percentile(gaps, 50)) if gaps.size else 0.0,
        "itl_p99_ms": float(np.percentile(gaps, 99)) if gaps.size else 0.0,
        "wall_s": wall,
        "spec": spec,
    }


#: the speculation counters of ``/metrics`` a round reports the growth of
SPEC_COUNTERS = {
    "drafts": "fastdeploy:spec_decode_num_draft_tokens_total",
    "decode_steps": "fastdeploy:spec_decode_num_decode_steps_total",
    "emitted": "fastdeploy:spec_decode_num_emitted_tokens_total",
}
#: drafts offered per drafting method (the engine counts each request's own method)
BY_METHOD = "fastdeploy:spec_decode_num_draft_tokens_by_method_total"


def spec_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """How the :data:`SPEC_COUNTERS` grew from the ``before`` to the ``after`` scrape
    (:func:`scrape_metrics` samples), and in ``"methods"`` the drafts offered per method."""
    grown = {k: after.get(name, 0.0) - before.get(name, 0.0) for k, name in SPEC_COUNTERS.items()}
    methods = {}
    for key, value in after.items():
        label = re.search(r'method="([^"]*)"', key) if key.startswith(BY_METHOD + "{") else None
        if label is not None:
            methods[label[1]] = methods.get(label[1], 0.0) + value - before.get(key, 0.0)
    return {**grown, "methods": methods}


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument(
        "--clients",
        type=lambda text: [int(c) for c in text.split(",")],
        default=[16],
        help="concurrent streaming clients, comma-separated for one round each (default 16)",
    )
    ap.add_argument(
        "--max-num-seqs", type=int, default=None, help="the mixed servers' slots (default: serve's)"
    )
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--only", default=None, help="run only the configurations whose label contains this"
    )
    ap.add_argument(
        "--pd", action="store_true", help="splitwise: mixed vs prefill + decode + router"
    )
    ap.add_argument(
        "--netns",
        action="store_true",
        help="run the server (or prefill, decode and router) and the clients on hosts of their "
        "own: network namespaces joined by a bridge (needs root and iproute2; the shm rows are "
        "left out)",
    )
    ap.add_argument(
        "--batch-sizes",
        type=batch_sizes,
        default=None,
        help="instead of the configurations: no speculation against the default, one round per "
        "batch size B (B concurrent clients), comma-separated, e.g. 1,2,4,8,16,32,64,128",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="with --batch-sizes: rounds per batch size, reported as median [min, max] (default 1)",
    )
    ap.add_argument(
        "--model", default=None, help="the servers' model folder (default: the shipped one)"
    )
    args = ap.parse_args()
    if args.repeat < 1 or (args.repeat > 1 and args.batch_sizes is None):
        ap.error(f"--repeat {args.repeat}: must be >= 1, and more than 1 needs --batch-sizes")
    if args.batch_sizes is not None and args.pd:
        ap.error("--batch-sizes: compares mixed servers; not with --pd")
    model = [] if args.model is None else ["--model", args.model]
    mixed = [*MIXED, *_slots(args), *model]
    if args.pd:
        configs = [(label, kind, [*spec, *model]) for label, kind, spec in PD_CONFIGS]
    else:
        chosen = CONFIGS if args.batch_sizes is None else SWEEP_CONFIGS
        configs = [(label, "mixed", [*extra, *mixed]) for label, extra in chosen]
    hosts = Hosts(["prefill", "decode", "router"]) if args.netns else None
    try:
        sweep = args.batch_sizes is not None and hosts is None
        rows = _run_interleaved(configs, args) if sweep else _run(configs, args, hosts)
    finally:
        if hosts is not None:
            hosts.close()
    return _report(rows, args)


#: the mixed servers' token channel (any number of slots)
MIXED = ["--token-channel", "shm"]


def _slots(args: argparse.Namespace) -> list[str]:
    return [] if args.max_num_seqs is None else ["--max-num-seqs", str(args.max_num_seqs)]


class PeakRunning:
    """Scrapes ``url/metrics`` every 50 ms in a thread (started by ``with``) and keeps the
    peak of ``fastdeploy:num_requests_running`` (``None`` if the server has no such gauge,
    e.g. a router)."""

    def __init__(self, url: str, reach: Callable[..., Any]):
        self.url, self.reach, self.peak = url, reach, None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.is_set():
            try:
                value = self.reach(scrape_metrics, self.url, 5).get(
                    "fastdeploy:num_requests_running"
                )
            except (OSError, AssertionError):
                value = None
            if value is not None:
                self.peak = max(self.peak or 0, int(value))
            self._done.wait(0.05)

    def __enter__(self) -> PeakRunning:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def _run(
    configs: list[tuple[str, str, list[str]]], args: argparse.Namespace, hosts: Hosts | None
) -> list[dict]:
    rows = []
    for label, kind, extra in configs:
        if args.only and args.only not in label:
            continue
        if hosts is not None and kind == "shm":
            continue  # no shared memory across hosts
        print(f"[bench_serve] {label}: starting", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        with deployment(kind, extra, hosts) as (url, codes):
            startup = time.perf_counter() - t0
            found = []
            rounds = [(r, n) for r in range(args.repeat) for n in args.batch_sizes or args.clients]
            for r, n in rounds:
                found.append(_one_round(label, url, n, r, startup, args, hosts))
        for row in found:
            row["exit_code"] = max(codes, default=0)
        rows += found
    return rows


def _one_round(
    label: str,
    url: str,
    n: int,
    r: int,
    startup: float,
    args: argparse.Namespace,
    hosts: Hosts | None,
) -> dict:
    """Round ``r`` of ``n`` concurrent clients against the server of configuration ``label``
    at ``url`` (run from the router's host with ``hosts``): its row."""
    again = f" (repeat {r + 1}/{args.repeat})" if args.repeat > 1 else ""
    print(
        f"[bench_serve] {label}: up in {startup:.1f} s; {n} clients{again}",
        file=sys.stderr,
        flush=True,
    )
    clients = run_clients(url, n, args.max_tokens)
    reach = (
        (lambda fn, *a: fn(*a)) if hosts is None else (lambda fn, *a: hosts.call("router", fn, *a))
    )
    with PeakRunning(url, reach) as peak:
        row = asyncio.run(clients) if hosts is None else hosts.call("router", asyncio.run, clients)
    row.update(config=label, clients=n, repeat=r, startup_s=startup, peak_running=peak.peak)
    return row


def _run_interleaved(
    configs: list[tuple[str, str, list[str]]], args: argparse.Namespace
) -> list[dict]:
    """``--batch-sizes``: every configuration's server up at once, and each round run on one
    server right after the other (same batch size, same repeat), so that a ratio compares two
    rounds a few seconds apart, not two servers started minutes apart on a machine whose speed
    drifts. An idle server costs the other only memory."""
    chosen = [
        (label, extra) for label, kind, extra in configs if not args.only or args.only in label
    ]
    rows: list[dict] = []
    with contextlib.ExitStack() as stack:
        servers = []
        for label, extra in chosen:
            print(f"[bench_serve] {label}: starting", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            url, codes = stack.enter_context(deployment("mixed", extra))
            servers.append((label, url, codes, time.perf_counter() - t0))
        for r in range(args.repeat):
            for n in args.batch_sizes:
                for label, url, _, startup in servers:
                    rows.append(_one_round(label, url, n, r, startup, args, None))
    codes_of = {label: max(codes, default=0) for label, _, codes, _ in servers}
    for row in rows:
        row["exit_code"] = codes_of[row["config"]]
    return rows


def _mtp_ratio(row: dict, rows: list[dict]) -> str:
    """This row's tokens/s over the no-speculation row of the same TP size and client count."""
    tp = row["config"].rsplit(", ", 1)[-1]
    base = [
        r for r in rows if r["config"].startswith("no speculation") and r["config"].endswith(tp)
    ]
    base = [r for r in base if r["clients"] == row["clients"]]
    if not base or row["config"].startswith("no speculation"):
        return "-"
    return f"{row['tokens_per_s'] / base[0]['tokens_per_s']:.2f}x"


def _report(rows: list[dict], args: argparse.Namespace) -> int:
    write_json(args.json, rows)
    ok = 0 if all(r["exit_code"] == 0 for r in rows) else 1
    if args.batch_sizes is not None:
        if args.repeat > 1:
            print(f"tokens/s and ratio: median [min, max] over {args.repeat} rounds")
        print_table(["batch", *SWEEP_COLUMNS, "peak running"], sweep_lines(rows))
        print(SWEEP_LEGEND)
        return ok
    base = rows[0]["tokens_per_s"] if rows else 1.0
    header = ["config", "clients", "peak running", "startup s", "tokens/s", "vs first"]
    header += ["MTP/no-MTP", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms"]
    print_table(header, (_cells(r, rows, base) for r in rows))
    return ok


def sweep_lines(rows: list[dict]) -> list[list[str]]:
    """The ``--batch-sizes`` table, one line per batch size (``clients``) of ``rows`` (one
    per round: ``config`` one of :data:`SWEEP_CONFIGS`' labels, ``repeat``, ``tokens_per_s``,
    ``peak_running``, ``spec``: :func:`spec_deltas`). Each ratio divides the speculative
    round by the plain round of the same repeat; the draft columns sum the speculative rounds."""
    plain, spec = (label for label, _ in SWEEP_CONFIGS)
    lines = []
    for n in dict.fromkeys(r["clients"] for r in rows):
        base, mine = (
            sorted((r for r in rows if r["config"] == c and r["clients"] == n), key=_repeat)
            for c in (plain, spec)
        )
        ratios = [m["tokens_per_s"] / b["tokens_per_s"] for b, m in zip(base, mine)]
        total = {k: sum(m["spec"][k] for m in mine) for k in SPEC_COUNTERS}
        methods: dict[str, float] = {}
        for m in mine:
            for name, count in m["spec"]["methods"].items():
                methods[name] = methods.get(name, 0.0) + count
        peaks = [r["peak_running"] for r in base + mine if r["peak_running"] is not None]
        lines.append(
            [
                str(n),
                median_range([r["tokens_per_s"] for r in base]),
                median_range([r["tokens_per_s"] for r in mine]),
                median_range(ratios, 2, "x"),
                f"{per_step(total['drafts'], total['decode_steps']):.2f}",
                f"{per_step(total['emitted'], total['decode_steps']):.2f}",
                mix_text(methods),
                str(max(peaks)) if peaks else "-",
            ]
        )
    return lines


def _repeat(row: dict) -> int:
    return row["repeat"]


def _cells(r: dict, rows: list[dict], base: float) -> list[str]:
    return [
        r["config"],
        str(r["clients"]),
        "-" if r["peak_running"] is None else str(r["peak_running"]),
        f"{r['startup_s']:.1f}",
        f"{r['tokens_per_s']:.0f}",
        f"{r['tokens_per_s'] / base:.2f}x",
        _mtp_ratio(r, rows),
        f"{r['ttft_p50_ms']:.0f}",
        f"{r['ttft_p99_ms']:.0f}",
        f"{r['itl_p50_ms']:.1f}",
        f"{r['itl_p99_ms']:.1f}",
    ]


if __name__ == "__main__":
    sys.exit(main())

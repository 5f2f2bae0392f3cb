"""``fastdeploy-mtp serve``: start the cache manager and the workers, then the HTTP server.

Start-up prints one line per stage to stderr (config, cache manager, each worker, listening).
SIGINT/SIGTERM stop every process and remove every shared-memory name and the token queue;
a lost worker fails the requests in flight and the server exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import SpeculativeConfig


@dataclass
class ServeOptions:
    """The ``serve`` command's options (see :func:`add_serve_args`)."""

    model: str
    speculative_config: SpeculativeConfig
    host: str = "127.0.0.1"
    port: int = 8000
    tensor_parallel_size: int = 1
    max_num_seqs: int | None = None
    max_model_len: int = 1024
    engine_worker_queue_port: int | None = None
    device_ids: list[int] | None = None
    served_model_name: str | None = None
    step_timeout: float = 300.0
    prefill_chunk_size: int = 0
    splitwise_role: str = "mixed"
    splitwise_port: int | None = None
    kv_transport: str = "auto"
    kv_transfer_timeout: float = 60.0
    kv_hold_timeout: float = 120.0
    kv_advertise_host: str | None = None
    max_waiting_requests: int | None = None


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """The server's own arguments (the speculative ones are added by the CLI)."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--model", default=None, help="checkpoint directory (default: the shipped tiny checkpoint)")
    p.add_argument("--served-model-name", default=None, help="model id in the API (default: fastdeploy-mtp-tiny)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="worker processes, one per rank")
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="batch slots (default: 8, or fewer if kernel.msgmax cannot carry the token message of 8)",
    )
    p.add_argument("--max-model-len", type=int, default=1024, help="longest prompt + output (default 1024)")
    p.add_argument(
        "--engine-worker-queue-port", type=int, default=None, help="engine<->worker loopback port (default: a free one)"
    )
    p.add_argument("--device-ids", default=None, help="device id per rank in the cache names (default 0..tp-1)")
    p.add_argument(
        "--prefill-chunk-size",
        type=int,
        default=0,
        help="most prompt tokens of one request per step (chunked prefill; default 0: only the step's token budget)",
    )
    sw = p.add_argument_group("splitwise (disaggregated prefill/decode; see `fastdeploy-mtp router`)")
    sw.add_argument(
        "--splitwise-role",
        choices=("mixed", "prefill", "decode"),
        default="mixed",
        help="mixed (default): a whole server; prefill: runs prompts and hands requests over; decode: continues them",
    )
    sw.add_argument(
        "--splitwise-port", type=int, default=None, help="prefill: TCP port the KV blocks are served on (default: free)"
    )
    sw.add_argument(
        "--kv-transport",
        choices=("auto", "shm", "tcp"),
        default="auto",
        help="decode: pull KV blocks by shared-memory name or over TCP (auto: shm when the prefill's caches are local)",
    )
    sw.add_argument(
        "--kv-transfer-timeout", type=float, default=60.0, help="decode: seconds one KV transfer may take (default 60)"
    )
    sw.add_argument(
        "--kv-advertise-host",
        default=None,
        help="prefill: the host name decode instances reach the KV port at (default --host; with --host 0.0.0.0, "
        "this machine's name)",
    )
    sw.add_argument(
        "--kv-hold-timeout",
        type=float,
        default=120.0,
        help="prefill: seconds handed-off KV blocks wait for a decode instance (default 120)",
    )
    sw.add_argument(
        "--max-waiting-requests",
        type=int,
        default=None,
        help="decode: handed-over requests that may queue for a slot before the router is told to wait (429; "
        "default: --max-num-seqs)",
    )


def _fit_max_num_seqs(requested: int | None) -> int:
    """Slots whose token message fits ``kernel.msgmax``: the requested number (an error if it
    does not fit), or the most up to 8."""
    from ..ops import messaging

    msgmax = messaging.read_msgmax()
    fits = messaging.topk_slots_within(msgmax)
    if requested is None:
        if fits < 1:
            raise ValueError(f"kernel.msgmax ({msgmax} bytes) cannot carry a token message for even one slot")
        return min(8, fits)
    if requested > fits:
        need = messaging.topk_message_bytes(requested)
        raise ValueError(
            f"--max-num-seqs {requested}: the workers' token message (FastDeploy's SysV layout) for {requested} slots "
            f"is {need} bytes and kernel.msgmax is {msgmax}; raise it (`sysctl -w kernel.msgmax={need}`) "
            f"or use --max-num-seqs {fits} or fewer"
        )
    return requested


def serve(opts: ServeOptions, log: object = None) -> int:
    """Run the server until SIGINT/SIGTERM (returns 0) or a lost process (returns 1)."""
    import uvicorn

    from ..models import ByteTokenizer, kv_cache_shape
    from ..ops.messaging import MAX_DRAFT_TOKENS as MAX_TOKENS_PER_STEP  # K + 1 tokens per slot and step
    from ..runtime.engine import Engine
    from .app import create_app, run_http
    from .engine_client import AsyncEngine
    from .layout import ServeLayout
    from .workers import RemoteRunner, free_port

    t0 = time.perf_counter()

    def progress(line: str) -> None:
        print(f"[serve {time.perf_counter() - t0:6.2f}s] {line}", file=sys.stderr, flush=True)

    spec = opts.speculative_config
    if spec.enabled and spec.num_speculative_tokens + 1 > MAX_TOKENS_PER_STEP:
        raise ValueError(
            f"num_speculative_tokens {spec.num_speculative_tokens}: the token message carries at most "
            f"{MAX_TOKENS_PER_STEP} tokens per request and step, so at most {MAX_TOKENS_PER_STEP - 1} drafts"
        )
    if opts.tensor_parallel_size < 1:
        raise ValueError(f"--tensor-parallel-size must be >= 1, got {opts.tensor_parallel_size}")
    tp = opts.tensor_parallel_size
    device_ids = opts.device_ids or list(range(tp))
    if len(device_ids) != tp:
        raise ValueError(f"--device-ids names {len(device_ids)} devices for --tensor-parallel-size {tp}")
    if opts.engine_worker_queue_port is not None and opts.engine_worker_queue_port == opts.port:
        raise ValueError(f"--engine-worker-queue-port {opts.port} is the HTTP --port; they must differ")
    if opts.splitwise_role == "prefill" and spec.enabled:
        # its workers send first tokens with mtp_save_first_token, whose message (7176 bytes)
        # fits the default kernel.msgmax for its 256 slots
        from ..ops.messaging import FIRST_TOKEN_MAX_BSZ

        max_num_seqs = opts.max_num_seqs or 8
        if not 0 < max_num_seqs <= FIRST_TOKEN_MAX_BSZ:
            raise ValueError(f"--max-num-seqs {max_num_seqs}: must be in [1, {FIRST_TOKEN_MAX_BSZ}]")
    else:
        max_num_seqs = _fit_max_num_seqs(opts.max_num_seqs)
    if opts.splitwise_role != "mixed":
        _refuse_taken_cache_names(spec.enabled, tp, device_ids, opts.model)
    layout = ServeLayout(
        model=opts.model,
        speculative_config=spec.to_json(),
        max_num_seqs=max_num_seqs,
        max_model_len=opts.max_model_len,
        tensor_parallel_size=tp,
        engine_worker_queue_port=opts.engine_worker_queue_port or free_port(avoid=opts.port),
        device_ids=device_ids,
        splitwise_role=opts.splitwise_role,
    )
    arch = layout.arch()
    kv_cache_shape(arch, 1, tp)  # refuses a TP size the heads do not divide, naming the field
    from ..cli import speculation_label  # the same name of the mode as demo and generate

    mode = speculation_label(spec)
    role = "" if opts.splitwise_role == "mixed" else f"splitwise {opts.splitwise_role}, "
    progress(
        f"config: {opts.model}, {role}{mode}, tp {tp}, {max_num_seqs} slots, max_model_len {opts.max_model_len}, "
        f"engine-worker port {layout.engine_worker_queue_port}, device ids {device_ids}"
    )
    stopping = {"code": 0}

    def interrupted(signum: int, frame: object) -> None:  # during start-up: unwind and clean up
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    runner = None
    async_engine = None
    kv_source = None
    try:
        runner = RemoteRunner(layout, progress, step_timeout=opts.step_timeout, log=log, reserved_port=opts.port)
        tokenizer = ByteTokenizer()

        def detokenize(ids: list[int]) -> str:  # for stop strings; padding ids have no text
            return tokenizer.decode([t for t in ids if t < arch.ori_vocab_size])

        engine = Engine(
            layout.fd_config(0, arch),
            runner=runner,
            max_positions=arch.max_position_embeddings,
            prefill_chunk_size=opts.prefill_chunk_size,
            detokenize=detokenize,
        )
        held: dict[str, uvicorn.Server] = {}

        def on_fatal(reason: str) -> None:
            progress(f"fatal: {reason}; stopping")
            stopping["code"] = 1
            if "server" in held:
                held["server"].should_exit = True

        if opts.splitwise_role == "mixed":
            async_engine = AsyncEngine(engine, on_fatal)
        else:
            async_engine, kv_source = _splitwise_engine(opts, engine, runner, on_fatal, max_num_seqs, progress)
        app = create_app(async_engine, opts.served_model_name or "fastdeploy-mtp-tiny", tokenizer, arch.ori_vocab_size)
        if opts.splitwise_role != "mixed":
            from .splitwise_api import SplitwiseEngine, add_splitwise_routes

            assert isinstance(async_engine, SplitwiseEngine)
            add_splitwise_routes(app, async_engine)
        started = run_http(app, opts.host, opts.port, progress, t0, on_server=lambda s: held.update(server=s))
        if not started and stopping["code"] == 0:
            return 1  # e.g. the port was taken (uvicorn said why)
        return stopping["code"]
    except KeyboardInterrupt:
        progress("interrupted during start-up; stopping")
        return 130
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if async_engine is not None:
            async_engine.stop()
        if kv_source is not None:
            kv_source.close()
        if runner is not None:
            progress("stopping the workers and the cache manager")
            runner.close()
            progress("stopped")


def _refuse_taken_cache_names(spec_enabled: bool, tp: int, device_ids: list[int], model: str) -> None:
    """Two instances on one host (a prefill and a decode instance) must not share KV cache
    names, which FastDeploy derives from the rank and the device id only."""
    from ..ipc.kv_caches import cache_names

    for rank, device in enumerate(device_ids):
        name = cache_names(0, 1, rank, device)[0]
        if os.path.exists(os.path.join("/dev/shm", name)):
            raise ValueError(
                f"--device-ids {','.join(map(str, device_ids))}: the KV cache name /dev/shm/{name} is taken "
                "(another instance on this host uses device id "
                f"{device}); give each instance its own --device-ids, or remove the name if no server runs"
            )


def _splitwise_engine(
    opts: ServeOptions,
    engine: Any,
    runner: Any,
    on_fatal: Callable[[str], None],
    max_num_seqs: int,
    progress: Callable[[str], None],
) -> tuple[Any, Any]:
    """The :class:`~.splitwise_api.SplitwiseEngine` of a prefill or decode instance (and, for
    a prefill instance, its KV source, listening)."""
    from ..splitwise.kv_transfer import KVLayout, KVSource
    from .splitwise_api import SplitwiseEngine

    caches = runner.host_caches()
    layout = KVLayout.of_caches(caches, *runner.num_cache_layers())
    if opts.splitwise_role == "decode":
        se = SplitwiseEngine(
            engine,
            on_fatal,
            layout=layout,
            caches=caches,
            transport=opts.kv_transport,
            transfer_timeout=opts.kv_transfer_timeout,
            max_waiting=opts.max_waiting_requests or max_num_seqs,
        )
        progress(f"decode instance: KV transport {opts.kv_transport}, transfer timeout {opts.kv_transfer_timeout:g} s")
        return se, None
    holder: dict[str, SplitwiseEngine] = {}
    source = KVSource(
        caches,
        layout,
        on_release=lambda rid, reason: holder["se"].released(rid, reason),
        shm_names=runner.cache_names(),
        host=opts.host,
        port=opts.splitwise_port or 0,
        hold_timeout=opts.kv_hold_timeout,
        advertise_host=opts.kv_advertise_host,
    )
    try:
        holder["se"] = SplitwiseEngine(engine, on_fatal, kv_source=source)
    except BaseException:
        source.close()
        raise
    progress(f"prefill instance: KV blocks served on {source.address} (held up to {opts.kv_hold_timeout:g} s)")
    return holder["se"], source


def default_model() -> str:
    from ..models import ASSETS_DIR

    return os.fspath(ASSETS_DIR)

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
from dataclasses import dataclass

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
    from .api_server import AsyncEngine, create_app
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
    max_num_seqs = _fit_max_num_seqs(opts.max_num_seqs)
    layout = ServeLayout(
        model=opts.model,
        speculative_config=spec.to_json(),
        max_num_seqs=max_num_seqs,
        max_model_len=opts.max_model_len,
        tensor_parallel_size=tp,
        engine_worker_queue_port=opts.engine_worker_queue_port or free_port(avoid=opts.port),
        device_ids=device_ids,
    )
    arch = layout.arch()
    kv_cache_shape(arch, 1, tp)  # refuses a TP size the heads do not divide, naming the field
    mode = "no speculation" if not spec.enabled else f"MTP K={spec.num_speculative_tokens} S={spec.num_model_steps}"
    if spec.enabled and spec.mtp_strategy == "with_ngram":
        mode += " +ngram"
    progress(
        f"config: {opts.model}, {mode}, tp {tp}, {max_num_seqs} slots, max_model_len {opts.max_model_len}, "
        f"engine-worker port {layout.engine_worker_queue_port}"
    )
    stopping = {"code": 0}

    def interrupted(signum: int, frame: object) -> None:  # during start-up: unwind and clean up
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    runner = None
    async_engine = None
    try:
        runner = RemoteRunner(layout, progress, step_timeout=opts.step_timeout, log=log, reserved_port=opts.port)
        engine = Engine(layout.fd_config(0, arch), runner=runner, max_positions=arch.max_position_embeddings)
        server: uvicorn.Server | None = None

        def on_fatal(reason: str) -> None:
            progress(f"fatal: {reason}; stopping")
            stopping["code"] = 1
            if server is not None:
                server.should_exit = True

        async_engine = AsyncEngine(engine, on_fatal)
        app = create_app(
            async_engine, opts.served_model_name or "fastdeploy-mtp-tiny", ByteTokenizer(), arch.ori_vocab_size
        )
        config = uvicorn.Config(
            app, host=opts.host, port=opts.port, log_level="info", access_log=False, timeout_graceful_shutdown=5
        )
        server = uvicorn.Server(config)
        progress(f"ready in {time.perf_counter() - t0:.1f} s: listening on http://{opts.host}:{opts.port}")

        def requested_stop(signum: int, frame: object) -> None:
            # uvicorn handles SIGINT/SIGTERM while it runs and raises the signal again once it
            # has stopped; this handler takes that second delivery, so the clean-up below runs
            progress(f"{signal.Signals(signum).name} received")

        for sig in old:
            signal.signal(sig, requested_stop)
        server.run()
        if not server.started and stopping["code"] == 0:
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
        if runner is not None:
            progress("stopping the workers and the cache manager")
            runner.close()
            progress("stopped")


def default_model() -> str:
    from ..models import ASSETS_DIR

    return os.fspath(ASSETS_DIR)

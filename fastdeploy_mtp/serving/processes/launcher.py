"""``fastdeploy-mtp serve``: start the cache manager and the workers, then the HTTP server.

Start-up prints one line per stage to stderr (config, cache manager, each worker, listening),
each stamped with the seconds since the process started (``--log-level info``, the default;
``debug`` adds Paddle's, glog's and uvicorn's own lines and how the processes stop). SIGINT
(Ctrl-C, at any moment: one line, exit status 130) and SIGTERM (exit status 0) stop every
process and remove every shared-memory name and the token queue; a lost worker fails the
requests in flight and the server exits with status 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...engine_args import UsageError, speculation_label
from .layout import ServeLayout
from .planning import block_bytes, plan_layout
from .serve_options import ServeOptions
from .start_up import Progress, apply_log_level, import_paddle, interruptible, process_started

if TYPE_CHECKING:
    from ...models.model_config import ModelConfig as ArchConfig
    from ...tokenization import GenerationDefaults, Tokenizer


def serve(opts: ServeOptions, log: object = None) -> int:
    """Run the server until SIGTERM (returns 0), SIGINT (130) or a lost process (1)."""
    t0 = process_started()  # the ready line counts from here
    progress = Progress("serve", t0, opts.log_level)
    apply_log_level(opts.log_level)
    try:
        import_paddle()  # (a Ctrl-C during the import comes after it: no half-imported Paddle)
    except KeyboardInterrupt:
        progress.warning("interrupted")
        return 130
    from ...models import kv_cache_shape

    try:
        layout = plan_layout(opts)
        arch = layout.arch()
        tp = layout.tensor_parallel_size
        kv_cache_shape(arch, 1, tp)  # refuses a TP size the heads do not divide, naming the field
    except ValueError as exc:  # each names the option at fault: a usage error (exit status 2)
        raise UsageError(str(exc)) from None
    # the same name of the mode as demo and generate
    mode = speculation_label(opts.speculative_config)
    role = "" if opts.splitwise_role == "mixed" else f"splitwise {opts.splitwise_role}, "
    mib = layout.total_block_num * block_bytes(layout, arch) / 2**20
    progress(
        f"config: {opts.model}, {role}{mode}, tp {tp}, {layout.max_num_seqs} slots, "
        f"{layout.total_block_num} KV blocks ({mib:.0f} MiB per rank), "
        f"{layout.max_num_batched_tokens} batched tokens per step, prefix caching "
        f"{'on' if layout.enable_prefix_caching else 'off'}, token channel "
        f"{layout.token_channel}, max_model_len {opts.max_model_len}, engine-worker port "
        f"{layout.engine_worker_queue_port}, device ids {layout.device_ids}"
    )

    running = _Running()
    # during start-up: one line at once, then unwind and clean up (a second Ctrl-C cannot stop it)
    with interruptible(lambda: progress.warning("interrupted during start-up: stopping")):
        try:
            return _run(opts, layout, arch, running, progress, t0, log)
        except KeyboardInterrupt:
            return 130
        finally:
            running.close(progress)


def served_model_name(opts: ServeOptions, arch: ArchConfig) -> str:
    """The model id in the API: ``--served-model-name``, else ``fastdeploy-mtp-tiny`` for the
    shipped byte model and the model folder as given for any other (vLLM's default)."""
    from ...models.model_config import TINY_MODEL_TYPE

    if opts.served_model_name:
        return opts.served_model_name
    return "fastdeploy-mtp-tiny" if arch.model_type == TINY_MODEL_TYPE else opts.model


@dataclass
class _Running:
    """What :func:`serve` started, for its clean-up, and how it is ending."""

    runner: Any = None  # RemoteRunner: the workers and the cache manager
    async_engine: Any = None
    kv_source: Any = None  # a prefill instance's KV server
    server: Any = None  # the uvicorn.Server, once run_http has one
    listener: Any = None  # the HTTP socket, bound before any process starts
    code: int = 0  # the exit status once the server stops: 1 after a fatal error

    def close(self, progress: Progress) -> None:
        """Stop what was started, the engine first (it drives the workers)."""
        if self.async_engine is not None:
            self.async_engine.stop()
        if self.kv_source is not None:
            self.kv_source.close()
        if self.runner is not None:
            progress.debug("stopping the workers and the cache manager")
            self.runner.close()
            progress.debug("stopped")
        if self.listener is not None:
            self.listener.close()


def _tokenizer(
    opts: ServeOptions, arch: ArchConfig, progress: Callable[[str], None]
) -> tuple[Tokenizer, GenerationDefaults, list[int]]:
    """The served model's tokenizer, its generation defaults and the ids that end a response
    (the tokenizer's, ``generation_config.json``'s and the architecture's); a usage error
    naming ``--tokenizer`` or ``--model`` when the folder has none."""
    from ...tokenization import load_generation_config, load_tokenizer

    try:
        tokenizer = load_tokenizer(opts.model, opts.tokenizer)
        defaults = load_generation_config(opts.model)
    except (ValueError, OSError) as exc:
        flag = f"--tokenizer {opts.tokenizer}" if opts.tokenizer else f"--model {opts.model}"
        raise UsageError(f"{flag}: {exc}") from None
    eos_ids = list(
        dict.fromkeys([*tokenizer.eos_token_ids, *defaults.eos_token_ids, *arch.eos_token_ids])
    )
    progress(
        f"tokenizer: {tokenizer.source} ({tokenizer.vocab_size} ids), EOS ids {eos_ids or 'none'}"
    )
    return tokenizer, defaults, eos_ids


def _run(
    opts: ServeOptions,
    layout: ServeLayout,
    arch: ArchConfig,
    running: _Running,
    progress: Progress,
    t0: float,
    log: object,
) -> int:
    """Start the workers, the engine and the HTTP server (recording each in ``running``) and
    serve until the server stops; returns the exit status."""
    from ...assembly import build_engine
    from ...credentials import DroppedMessages, http_token, splitwise_secret
    from ...tenancy import options_keys
    from ..engine_client.engine_loop import AsyncEngine
    from ..openai.app import create_app
    from ..openai.http_auth import Access
    from ..openai.http_server import bind_listener, run_http
    from .remote_runner import RemoteRunner

    # before any worker starts: bad credentials, a taken port or a bad tokenizer folder fail fast
    keys = options_keys(opts)
    secret = (
        None if opts.splitwise_role == "mixed" else splitwise_secret(opts.splitwise_secret_file)
    )
    running.listener = bind_listener(opts.host, opts.port)
    tokenizer, defaults, eos_ids = _tokenizer(opts, arch, progress)
    dropped = DroppedMessages()  # every refused message of this deployment, shown in /metrics
    running.runner = runner = RemoteRunner(
        layout,
        progress,
        step_timeout=opts.step_timeout,
        log=log,
        reserved_port=opts.port,
        dropped=dropped,
    )
    engine = build_engine(
        layout.fd_config(0, arch),
        runner=runner,
        max_positions=arch.max_position_embeddings,
        prefill_chunk_size=opts.prefill_chunk_size,
        detokenize=tokenizer.decode,  # for stop strings; padding ids have no text
    )

    def on_fatal(reason: str) -> None:
        progress.error(f"fatal: {reason}; stopping")
        running.code = 1
        if running.server is not None:
            running.server.should_exit = True

    if opts.splitwise_role == "mixed":
        running.async_engine = AsyncEngine(engine, on_fatal, dropped)
    else:
        assert secret is not None
        from ..pd.instance import start_splitwise_engine

        running.async_engine, running.kv_source = start_splitwise_engine(
            opts, engine, runner, on_fatal, progress, dropped, secret
        )
    access = Access(keys, None if secret is None else http_token(secret), dropped)
    app = create_app(
        running.async_engine, served_model_name(opts, arch), tokenizer, defaults, eos_ids, access
    )
    if opts.splitwise_role != "mixed":
        from ..pd.endpoints import add_splitwise_routes
        from ..pd.splitwise_engine import SplitwiseEngine

        assert isinstance(running.async_engine, SplitwiseEngine)
        add_splitwise_routes(app, running.async_engine)
    code = run_http(
        app,
        opts.host,
        opts.port,
        progress,
        t0,
        on_server=lambda s: setattr(running, "server", s),
        sock=running.listener,
    )
    return running.code or code  # a fatal error's 1 first

"""``fastdeploy-mtp serve``: start the cache manager and the workers, then the HTTP server.

Start-up prints one line per stage to stderr (config, cache manager, each worker, listening).
SIGINT/SIGTERM stop every process and remove every shared-memory name and the token queue;
a lost worker fails the requests in flight and the server exits with status 1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..capacity import MAX_DEFAULT_SLOTS, plan_capacity
from ..config import SpeculativeConfig
from ..engine_args import UsageError, check_speculative_config, speculation_label
from .layout import ServeLayout
from .start_up import interruptible, progress_printer
from .token_channel import TOKEN_CHANNELS

if TYPE_CHECKING:
    from ..models.model_config import ModelConfig as ArchConfig


@dataclass
class ServeOptions:
    """The ``serve`` command's options (``fastdeploy_mtp.entrypoints.serve`` defines their flags)."""

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
    #: folder of the tokenizer files when not the model folder's (``--tokenizer``)
    tokenizer: str | None = None
    #: ``--dtype``: ``"auto"`` (the folder's own; float32 on the CPU), or a dtype name
    dtype: str = "auto"
    #: ``--api-key`` (or ``FASTDEPLOY_MTP_API_KEY``): clients' ``Authorization: Bearer`` on ``/v1/*``
    api_key: str | None = None
    #: ``--splitwise-secret-file``: the splitwise secret's file (see :mod:`fastdeploy_mtp.credentials`)
    splitwise_secret_file: str | None = None
    #: ``--token-channel``: ``"shm"`` (any number of slots) or ``"sysv"`` (FastDeploy's message)
    token_channel: str = "shm"
    #: ``--kv-cache-memory``: KV bytes per rank (``None``: auto, see :mod:`fastdeploy_mtp.capacity`)
    kv_cache_memory: int | None = None
    #: ``--max-num-batched-tokens``: the token budget of one step (``None``: the default rule)
    max_num_batched_tokens: int | None = None
    #: ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``
    enable_prefix_caching: bool = True


def _fit_max_num_seqs(requested: int | None) -> int:
    """Slots whose token message fits ``kernel.msgmax``: the requested number (an error if it
    does not fit), or the most up to 8."""
    from ..ops import messaging

    msgmax = messaging.read_msgmax()
    fits = messaging.topk_slots_within(msgmax)
    if requested is None:
        if fits < 1:
            raise ValueError(
                f"kernel.msgmax ({msgmax} bytes) cannot carry a token message for even one slot"
            )
        return min(8, fits)
    if requested > fits:
        need = messaging.topk_message_bytes(requested)
        raise UsageError(
            f"--max-num-seqs {requested}: the workers' token message (FastDeploy's SysV layout) for {requested} slots "
            f"is {need} bytes and kernel.msgmax is {msgmax}; raise it (`sysctl -w kernel.msgmax={need}`) "
            f"or use --max-num-seqs {fits} or fewer"
        )
    return requested


def serve(opts: ServeOptions, log: object = None) -> int:
    """Run the server until SIGINT/SIGTERM (returns 0) or a lost process (returns 1)."""
    from ..models import kv_cache_shape

    t0 = time.perf_counter()
    progress = progress_printer("serve", t0)
    try:
        layout = _layout(opts)
        arch = layout.arch()
        tp = layout.tensor_parallel_size
        kv_cache_shape(arch, 1, tp)  # refuses a TP size the heads do not divide, naming the field
    except ValueError as exc:  # each names the option at fault: a usage error (exit status 2)
        raise UsageError(str(exc)) from None
    mode = speculation_label(
        opts.speculative_config
    )  # the same name of the mode as demo and generate
    role = "" if opts.splitwise_role == "mixed" else f"splitwise {opts.splitwise_role}, "
    mib = layout.total_block_num * _block_bytes(layout, arch) / 2**20
    progress(
        f"config: {opts.model}, {role}{mode}, tp {tp}, {layout.max_num_seqs} slots, {layout.total_block_num} KV "
        f"blocks ({mib:.0f} MiB per rank), {layout.max_num_batched_tokens} batched tokens per step, prefix caching "
        f"{'on' if layout.enable_prefix_caching else 'off'}, token channel {layout.token_channel}, "
        f"max_model_len {opts.max_model_len}, engine-worker port {layout.engine_worker_queue_port}, "
        f"device ids {layout.device_ids}"
    )

    running = _Running()
    try:
        with interruptible():  # during start-up: unwind and clean up
            return _run(opts, layout, arch, running, progress, t0, log)
    except KeyboardInterrupt:
        progress("interrupted during start-up; stopping")
        return 130
    finally:
        running.close(progress)


def _layout(opts: ServeOptions) -> ServeLayout:
    """The process layout of ``opts``, refusing what the processes cannot serve before any
    starts (each error names its option)."""
    from .workers import free_port

    spec = opts.speculative_config
    check_speculative_config(spec, opts.splitwise_role)
    if opts.tensor_parallel_size < 1:
        raise UsageError(f"--tensor-parallel-size must be >= 1, got {opts.tensor_parallel_size}")
    tp = opts.tensor_parallel_size
    device_ids = opts.device_ids or list(range(tp))
    if len(device_ids) != tp:
        raise UsageError(
            f"--device-ids names {len(device_ids)} devices for --tensor-parallel-size {tp}"
        )
    if opts.engine_worker_queue_port is not None and opts.engine_worker_queue_port == opts.port:
        raise UsageError(
            f"--engine-worker-queue-port {opts.port} is the HTTP --port; they must differ"
        )
    if opts.token_channel not in TOKEN_CHANNELS:
        raise UsageError(
            f"--token-channel must be one of {', '.join(TOKEN_CHANNELS)}, got {opts.token_channel!r}"
        )
    max_num_seqs, slot_cap = opts.max_num_seqs, MAX_DEFAULT_SLOTS
    if opts.splitwise_role == "prefill" and spec.enabled:
        # its workers send first tokens with mtp_save_first_token, whose message (7176 bytes)
        # fits the default kernel.msgmax for its 256 slots
        from ..ops.messaging import FIRST_TOKEN_MAX_BSZ

        slot_cap = FIRST_TOKEN_MAX_BSZ
        if max_num_seqs is not None and not 0 < max_num_seqs <= FIRST_TOKEN_MAX_BSZ:
            raise UsageError(
                f"--max-num-seqs {max_num_seqs}: must be in [1, {FIRST_TOKEN_MAX_BSZ}]"
            )
    elif opts.token_channel == "sysv":
        max_num_seqs = _fit_max_num_seqs(max_num_seqs)
    if opts.splitwise_role != "mixed" and opts.kv_transport == "mooncake":
        from ..splitwise.kv_layout import TransferError
        from ..splitwise.transports import mooncake

        try:
            mooncake.require()
        except TransferError as exc:
            raise UsageError(f"--kv-transport mooncake: {exc}") from None
    _refuse_taken_cache_names(device_ids)
    layout = ServeLayout(
        model=opts.model,
        speculative_config=spec.to_json(),
        max_num_seqs=max_num_seqs or 1,  # (planned below)
        max_model_len=opts.max_model_len,
        tensor_parallel_size=tp,
        engine_worker_queue_port=opts.engine_worker_queue_port or free_port(avoid=opts.port),
        device_ids=device_ids,
        splitwise_role=opts.splitwise_role,
        dtype=opts.dtype,
        token_channel=opts.token_channel,
        enable_prefix_caching=opts.enable_prefix_caching,
    )
    arch = layout.arch()
    try:
        plan = plan_capacity(
            block_size=arch.block_size,
            block_bytes=_block_bytes(layout, arch),
            max_model_len=opts.max_model_len,
            k=spec.num_speculative_tokens if spec.enabled else 0,
            max_num_seqs=max_num_seqs,
            slot_cap=slot_cap,
            kv_memory=opts.kv_cache_memory,
            tp=tp,
            max_num_batched_tokens=opts.max_num_batched_tokens,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    layout.max_num_seqs = plan.max_num_seqs
    layout.total_block_num = plan.total_block_num
    layout.max_num_batched_tokens = plan.max_num_batched_tokens
    return layout


def _block_bytes(layout: ServeLayout, arch: ArchConfig) -> int:
    """Bytes of one KV block of every cache of one rank (the MTP layers' included)."""
    from ..models.cache_spec import model_cache_specs

    uses_mtp = SpeculativeConfig.from_json(layout.speculative_config).uses_mtp
    return sum(s.nbytes for s in model_cache_specs(arch, 1, layout.tensor_parallel_size, uses_mtp))


def served_model_name(opts: ServeOptions, arch: ArchConfig) -> str:
    """The model id in the API: ``--served-model-name``, else ``fastdeploy-mtp-tiny`` for the
    shipped byte model and the model folder as given for any other (vLLM's default)."""
    from ..models.model_config import TINY_MODEL_TYPE

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

    def close(self, progress: Callable[[str], None]) -> None:
        """Stop what was started, the engine first (it drives the workers)."""
        if self.async_engine is not None:
            self.async_engine.stop()
        if self.kv_source is not None:
            self.kv_source.close()
        if self.runner is not None:
            progress("stopping the workers and the cache manager")
            self.runner.close()
            progress("stopped")
        if self.listener is not None:
            self.listener.close()


def _run(
    opts: ServeOptions,
    layout: ServeLayout,
    arch: ArchConfig,
    running: _Running,
    progress: Callable[[str], None],
    t0: float,
    log: object,
) -> int:
    """Start the workers, the engine and the HTTP server (recording each in ``running``) and
    serve until the server stops; returns the exit status."""
    from ..assembly import build_engine
    from ..credentials import DroppedMessages, api_key, http_token, splitwise_secret
    from ..tokenization import load_generation_config, load_tokenizer
    from .app import bind_listener, create_app, run_http
    from .engine_client import AsyncEngine
    from .http_auth import Access
    from .workers import RemoteRunner

    # before any worker starts: bad credentials, a taken port or a bad tokenizer folder fail fast
    key = api_key(opts.api_key)
    secret = (
        None if opts.splitwise_role == "mixed" else splitwise_secret(opts.splitwise_secret_file)
    )
    running.listener = bind_listener(opts.host, opts.port)
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
        progress(f"fatal: {reason}; stopping")
        running.code = 1
        if running.server is not None:
            running.server.should_exit = True

    if opts.splitwise_role == "mixed":
        running.async_engine = AsyncEngine(engine, on_fatal, dropped)
    else:
        assert secret is not None
        running.async_engine, running.kv_source = _splitwise_engine(
            opts, engine, runner, on_fatal, progress, dropped, secret
        )
    access = Access(key, None if secret is None else http_token(secret), dropped)
    app = create_app(
        running.async_engine, served_model_name(opts, arch), tokenizer, defaults, eos_ids, access
    )
    if opts.splitwise_role != "mixed":
        from .splitwise_api import SplitwiseEngine, add_splitwise_routes

        assert isinstance(running.async_engine, SplitwiseEngine)
        add_splitwise_routes(app, running.async_engine)
    started = run_http(
        app,
        opts.host,
        opts.port,
        progress,
        t0,
        on_server=lambda s: setattr(running, "server", s),
        sock=running.listener,
    )
    if not started and running.code == 0:
        return 1  # uvicorn could not start (it said why)
    return running.code


def _refuse_taken_cache_names(device_ids: list[int]) -> None:
    """Two deployments on one host must not share KV cache names, which FastDeploy derives
    from the rank and the device id only: refuse names a running process created (the
    creator's pid is in the segment's descriptor); a dead run's are replaced at start-up."""
    from ..ipc.kv_caches import cache_names
    from ..ipc.signals import process_alive

    for rank, device in enumerate(device_ids):
        name = cache_names(0, 1, rank, device)[0]
        creator = _segment_creator(os.path.join("/dev/shm", name))
        if creator is not None and process_alive(creator):
            raise UsageError(
                f"--device-ids {','.join(map(str, device_ids))}: the KV cache name /dev/shm/{name} belongs to a "
                f"running deployment (created by pid {creator}, device id {device}); give each server on this host "
                "its own --device-ids"
            )


def _segment_creator(path: str) -> int | None:
    """The creator pid recorded in a KV cache segment's descriptor (``None``: no such
    segment, or not one of ours)."""
    try:
        with open(path, "rb") as f:
            head = f.read(128)
    except OSError:
        return None
    if len(head) < 120 or int.from_bytes(head[72:80], "little") != 0x4350494D54504446:  # "FDPTMIPC"
        return None
    return int.from_bytes(head[112:120], "little", signed=True)


def _splitwise_engine(
    opts: ServeOptions,
    engine: Any,
    runner: Any,
    on_fatal: Callable[[str], None],
    progress: Callable[[str], None],
    dropped: Any,
    secret: bytes,
) -> tuple[Any, Any]:
    """The :class:`~.splitwise_api.SplitwiseEngine` of a prefill or decode instance (and, for
    a prefill instance, its KV source, listening), with the deployment's splitwise ``secret``."""
    from ..models.cache_spec import describe
    from ..splitwise.kv_layout import KVLayout
    from ..splitwise.kv_source import KVSource
    from .splitwise_api import SplitwiseEngine

    caches = runner.host_caches()
    layout = KVLayout.of_caches(caches, describe(runner.all_cache_specs()))
    if opts.splitwise_role == "decode":
        se = SplitwiseEngine(
            engine,
            on_fatal,
            layout=layout,
            caches=caches,
            transport=opts.kv_transport,
            transfer_timeout=opts.kv_transfer_timeout,
            max_waiting=opts.max_waiting_requests or runner.layout.max_num_seqs,
            dropped=dropped,
            secret=secret,
        )
        progress(
            f"decode instance: KV transport {opts.kv_transport}, transfer timeout {opts.kv_transfer_timeout:g} s"
        )
        return se, None
    holder: dict[str, SplitwiseEngine] = {}
    source = KVSource(
        caches,
        layout,
        on_release=lambda rid, reason: holder["se"].released(rid, reason),
        shm_names=runner.cache_names(),
        mooncake=opts.kv_transport == "mooncake",
        host=opts.host,
        port=opts.splitwise_port or 0,
        hold_timeout=opts.kv_hold_timeout,
        advertise_host=opts.kv_advertise_host,
        secret=secret,
        dropped=dropped,
    )
    try:
        holder["se"] = SplitwiseEngine(
            engine, on_fatal, kv_source=source, dropped=dropped, secret=secret
        )
    except BaseException:
        source.close()
        raise
    progress(
        f"prefill instance: KV blocks served on {source.address} (held up to {opts.kv_hold_timeout:g} s)"
    )
    return holder["se"], source

"""What ``serve``'s options make of the deployment before any process starts: the process
layout (:func:`plan_layout`: slots, KV blocks, the token budget, the engine-worker port),
refusing what the processes could not serve with a usage error naming the option.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...capacity import MAX_DEFAULT_SLOTS, plan_capacity
from ...config import SpeculativeConfig
from ...engine_args import UsageError, check_speculative_config
from ...models.model_config import has_linear_attention
from ..token_channel.base import TOKEN_CHANNELS
from .layout import ServeLayout
from .serve_options import ServeOptions

if TYPE_CHECKING:
    from ...models.model_config import ModelConfig as ArchConfig


def plan_layout(opts: ServeOptions) -> ServeLayout:
    """The process layout of ``opts``, refusing what the processes cannot serve before any
    starts (each error names its option)."""
    from .worker_group import free_port

    device_ids = _checked_device_ids(opts)
    max_num_seqs, slot_cap = _slots(opts)
    if opts.splitwise_role != "mixed" and opts.kv_transport == "mooncake":
        from ...splitwise.kv_layout import TransferError
        from ...splitwise.transports import mooncake

        try:
            mooncake.require()
        except TransferError as exc:
            raise UsageError(f"--kv-transport mooncake: {exc}") from None
    _refuse_taken_cache_names(device_ids)
    spec = opts.speculative_config
    layout = ServeLayout(
        model=opts.model,
        speculative_config=spec.to_json(),
        max_num_seqs=max_num_seqs or 1,  # (planned below)
        max_model_len=opts.max_model_len,
        tensor_parallel_size=len(device_ids),
        engine_worker_queue_port=opts.engine_worker_queue_port or free_port(avoid=opts.port),
        device_ids=device_ids,
        splitwise_role=opts.splitwise_role,
        dtype=opts.dtype,
        token_channel=opts.token_channel,
        log_level=opts.log_level,
    )
    arch = layout.arch()
    layout.enable_prefix_caching = _prefix_caching(opts, arch)
    try:
        plan = plan_capacity(
            block_size=arch.block_size,
            block_bytes=block_bytes(layout, arch),
            max_model_len=opts.max_model_len,
            k=spec.num_speculative_tokens if spec.enabled else 0,
            max_num_seqs=max_num_seqs,
            slot_cap=slot_cap,
            kv_memory=opts.kv_cache_memory,
            tp=len(device_ids),
            max_num_batched_tokens=opts.max_num_batched_tokens,
            slot_bytes=_state_bytes_per_slot(arch, spec, len(device_ids)),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    layout.max_num_seqs = plan.max_num_seqs
    layout.total_block_num = plan.total_block_num
    layout.max_num_batched_tokens = plan.max_num_batched_tokens
    return layout


def _state_bytes_per_slot(arch: ArchConfig, spec: SpeculativeConfig, tp: int) -> int:
    """Bytes of one slot's linear-attention states on one rank (0 without such layers)."""
    from ...models.linear_state import state_specs, verify_rows

    return sum(s.nbytes for s in state_specs(arch, 1, verify_rows(spec), tp))


def _prefix_caching(opts: ServeOptions, arch: ArchConfig) -> bool:
    """Whether prefix caching is on: as asked, else on; refused (with a splitwise role too)
    for a model with linear-attention layers, whose recurrent state neither a cached block
    nor a KV hand-over carries."""
    if not has_linear_attention(arch):
        return True if opts.enable_prefix_caching is None else opts.enable_prefix_caching
    why = (
        f"{opts.model} has linear-attention layers (Gated DeltaNet), whose per-request "
        "recurrent state is not in the KV blocks"
    )
    if opts.enable_prefix_caching:
        raise UsageError(f"--enable-prefix-caching: {why}, so a cached block cannot restore it")
    if opts.splitwise_role != "mixed":
        raise UsageError(
            f"--splitwise-role {opts.splitwise_role}: {why}, which a KV hand-over does not move"
        )
    return False


def _checked_device_ids(opts: ServeOptions) -> list[int]:
    """The device id of each rank, once the speculation, the TP size, the ports and the token
    channel of ``opts`` are ones the processes can serve."""
    check_speculative_config(opts.speculative_config, opts.splitwise_role)
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
            f"--token-channel must be one of {', '.join(TOKEN_CHANNELS)}, got "
            f"{opts.token_channel!r}"
        )
    _refuse_drafts_the_sysv_message_cannot_carry(opts)
    return device_ids


def _refuse_drafts_the_sysv_message_cannot_carry(opts: ServeOptions) -> None:
    """``--token-channel sysv`` sends each step's K + 1 tokens per request in FastDeploy's
    SysV message, which has room for ``MAX_DRAFT_TOKENS`` (6): refuse a larger K there. (A
    prefill instance with MTP sends ``mtp_save_first_token``'s 2 tokens per request instead,
    on either channel.)"""
    from ...ops.messaging import MAX_DRAFT_TOKENS

    spec = opts.speculative_config
    if opts.token_channel != "sysv" or not spec.enabled or opts.splitwise_role == "prefill":
        return
    k = spec.num_speculative_tokens
    if k + 1 > MAX_DRAFT_TOKENS:
        raise UsageError(
            f"--token-channel sysv: num_speculative_tokens {k} needs {k + 1} tokens per request "
            f"and step, but FastDeploy's SysV token message carries {MAX_DRAFT_TOKENS}; use "
            f"--token-channel shm (the default) or num_speculative_tokens <= {MAX_DRAFT_TOKENS - 1}"
        )


def _slots(opts: ServeOptions) -> tuple[int | None, int]:
    """The slots ``opts`` ask for (``None``: as many as the KV memory allows) and the most
    there may be (a splitwise prefill instance with MTP, or the ``sysv`` channel, bound them by
    their token message)."""
    max_num_seqs, slot_cap = opts.max_num_seqs, MAX_DEFAULT_SLOTS
    if opts.splitwise_role == "prefill" and opts.speculative_config.enabled:
        # its workers send first tokens with mtp_save_first_token, whose message (7176 bytes)
        # fits the default kernel.msgmax for its 256 slots
        from ...ops.messaging import FIRST_TOKEN_MAX_BSZ

        slot_cap = FIRST_TOKEN_MAX_BSZ
        if max_num_seqs is not None and not 0 < max_num_seqs <= FIRST_TOKEN_MAX_BSZ:
            raise UsageError(
                f"--max-num-seqs {max_num_seqs}: must be in [1, {FIRST_TOKEN_MAX_BSZ}]"
            )
    elif opts.token_channel == "sysv":
        max_num_seqs = _fit_max_num_seqs(max_num_seqs)
    return max_num_seqs, slot_cap


def _fit_max_num_seqs(requested: int | None) -> int:
    """Slots whose token message fits ``kernel.msgmax``: the requested number (an error if it
    does not fit), or the most up to 8."""
    from ...ops import messaging

    msgmax = messaging.read_msgmax()
    fits = messaging.topk_slots_within(msgmax)
    if requested is None:
        if fits < 1:
            raise ValueError(
                f"kernel.msgmax ({msgmax} bytes) cannot carry a token message for even one slot"
            )
        return min(8, fits)
    if requested > messaging.MAX_BSZ:
        raise UsageError(
            f"--max-num-seqs {requested}: FastDeploy's SysV token message has room for "
            f"{messaging.MAX_BSZ} slots; use --token-channel shm or --max-num-seqs {fits} or fewer"
        )
    if requested > fits:
        need = messaging.topk_message_bytes(requested)
        raise UsageError(
            f"--max-num-seqs {requested}: the workers' token message (FastDeploy's SysV layout) "
            f"for {requested} slots is {need} bytes and kernel.msgmax is {msgmax}; raise it "
            f"(`sysctl -w kernel.msgmax={need}`) or use --max-num-seqs {fits} or fewer"
        )
    return requested


def block_bytes(layout: ServeLayout, arch: ArchConfig) -> int:
    """Bytes of one KV block of every cache of one rank (the MTP layers' included)."""
    from ...models.cache_spec import model_cache_specs

    uses_mtp = SpeculativeConfig.from_json(layout.speculative_config).uses_mtp
    return sum(s.nbytes for s in model_cache_specs(arch, 1, layout.tensor_parallel_size, uses_mtp))


def _refuse_taken_cache_names(device_ids: list[int]) -> None:
    """Two deployments on one host must not share KV cache names, which FastDeploy derives
    from the rank and the device id only: refuse names a running process created (the
    creator's pid is in the segment's descriptor); a dead run's are replaced at start-up."""
    from ...ipc.kv_caches import cache_names
    from ...ipc.signals import process_alive

    for rank, device in enumerate(device_ids):
        name = cache_names(0, 1, rank, device)[0]
        creator = _segment_creator(os.path.join("/dev/shm", name))
        if creator is not None and process_alive(creator):
            raise UsageError(
                f"--device-ids {','.join(map(str, device_ids))}: the KV cache name /dev/shm/{name} "
                f"belongs to a running deployment (created by pid {creator}, device id {device}); "
                "give each server on this host its own --device-ids"
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

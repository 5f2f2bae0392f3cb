"""``fastdeploy-mtp serve``: the options of
:func:`fastdeploy_mtp.serving.processes.launcher.serve`."""

from __future__ import annotations

import argparse
from typing import Any

from ..capacity import parse_memory
from ..credentials import add_credential_args
from ..engine_args import (
    UsageError,
    add_max_num_seqs_arg,
    add_model_arg,
    add_speculative_args,
    model_arg,
    non_negative_int,
    options_from_args,
    port_number,
    positive_float,
    positive_int,
    resolve_model,
    resolve_speculative_config,
)
from ..serving.processes.serve_options import ServeOptions
from ..serving.token_channel.base import TOKEN_CHANNELS
from ..splitwise.transport import AUTO, transport_names
from ..tenancy import add_tenancy_args
from .offline import CommandError
from .option_flags import OptionFlags

#: the flags of :class:`ServeOptions`, each with its field's default
_FLAGS = OptionFlags(ServeOptions)


def register(sub: Any) -> None:
    """Add the ``serve`` subcommand to ``sub`` (an ``add_subparsers`` result)."""
    srv = sub.add_parser(
        "serve", help="OpenAI-compatible server (cache manager + one worker process per TP rank)"
    )
    add_speculative_args(srv)
    add_serve_args(srv)
    srv.set_defaults(func=cmd_serve)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """The server's arguments besides the speculative ones."""
    _FLAGS.add_listen_args(p)
    _FLAGS.add_log_level_arg(p)
    add_model_arg(p, positional=True)
    _FLAGS.add(
        p,
        "--served-model-name",
        help="model id in the API (default: the model folder; fastdeploy-mtp-tiny for the shipped "
        "one)",
    )
    _FLAGS.add(
        p, "--tensor-parallel-size", "-tp", type=positive_int, help="worker processes, one per rank"
    )
    add_max_num_seqs_arg(
        p,
        _FLAGS.defaults["max_num_seqs"],
        "batch slots (default: min(256, the KV blocks --kv-cache-memory holds / the blocks of a "
        "request a quarter of --max-model-len long); with --token-channel sysv: 8, or fewer if "
        "kernel.msgmax cannot carry the token message of 8)",
    )
    _FLAGS.add(
        p,
        "--max-model-len",
        type=positive_int,
        help="longest prompt + output (default %(default)s)",
    )
    _add_capacity_args(p)
    _FLAGS.add(
        p,
        "--engine-worker-queue-port",
        type=port_number,
        help="names the deployment: its runtime directory (the engine<->worker socket), its SysV "
        "token queue id and its cache_ready_signal suffix (default: a free port number)",
    )
    _FLAGS.add(
        p,
        "--step-timeout",
        type=positive_float,
        help="seconds one step of the workers may take before the deployment counts as hung: "
        "requests in flight fail, /health turns 503 and the server exits with status 1 (default "
        "%(default)g)",
    )
    p.add_argument(
        "--device-ids",
        type=_device_ids,
        metavar="ID,ID,...",
        default=None,
        help="the device id of each rank, comma-separated (e.g. 63,64 with "
        "--tensor-parallel-size 2): FastDeploy's KV cache names carry it, so two servers on one "
        "host need different ids (default 0..tp-1)",
    )
    _FLAGS.add(
        p,
        "--prefill-chunk-size",
        type=non_negative_int,
        help="most prompt tokens of one request per step (chunked prefill; default 0: only the "
        "step's token budget)",
    )
    add_tenancy_args(p)
    add_credential_args(p)
    _add_splitwise_args(p)


def _device_ids(text: str) -> list[int]:
    """argparse ``type`` of ``--device-ids``: comma-separated integers >= 0."""
    try:
        return [non_negative_int(d.strip()) for d in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated integers >= 0 (one per rank), got {text!r}"
        ) from None


def _kv_memory(text: str) -> int | None:
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_capacity_args(p: argparse.ArgumentParser) -> None:
    _FLAGS.add(
        p,
        "--kv-cache-memory",
        type=_kv_memory,
        metavar="SIZE",
        help="KV cache bytes per rank, every layer's (e.g. 512MiB, 2G); the KV blocks follow from "
        "it, never more than --max-num-seqs requests of --max-model-len can use (default auto: "
        "10%% of the host's available memory, at most half the free space of /dev/shm, split "
        "between the ranks)",
    )
    _FLAGS.add(
        p,
        "--max-num-batched-tokens",
        type=positive_int,
        metavar="N",
        help="tokens one step may run: every slot's decode row with its K drafts first, then "
        "prefill chunks up to the budget; at least max_num_seqs * (K + 1) + 1 (default: max(256, "
        "max_num_seqs * (K + 1) + 64))",
    )
    _FLAGS.add(
        p,
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        help="share the KV blocks of identical prompt prefixes between requests (default: on, "
        "except for models with linear-attention layers: Qwen3-Next, Qwen3.5)",
    )
    _FLAGS.add(
        p,
        "--token-channel",
        choices=TOKEN_CHANNELS,
        help="how worker rank 0 hands each step's tokens to the engine: shm (default; a private "
        "shared-memory segment, any --max-num-seqs) or sysv (FastDeploy's SysV message: 2,060 + "
        "1,032 bytes per slot, so kernel.msgmax bounds the slots, 5 on a default kernel; 6 "
        "tokens per request and step, so num_speculative_tokens <= 5)",
    )


def _add_splitwise_args(p: argparse.ArgumentParser) -> None:
    sw = p.add_argument_group(
        "splitwise (disaggregated prefill/decode; see `fastdeploy-mtp router`)"
    )
    _FLAGS.add(
        sw,
        "--splitwise-role",
        choices=("mixed", "prefill", "decode"),
        help="mixed (default): a whole server; prefill: runs prompts and hands requests over; "
        "decode: continues them",
    )
    _FLAGS.add(
        sw,
        "--splitwise-port",
        type=port_number,
        help="prefill: TCP port the KV blocks are served on (default: free)",
    )
    _FLAGS.add(
        sw,
        "--kv-transport",
        choices=(AUTO, *transport_names()),
        help="decode: how KV blocks are pulled: shm (same host), mooncake (the Mooncake transfer "
        "engine: RDMA, else its TCP), tcp (over the KV port); auto (default): shm when the "
        "prefill's caches are on this host, else mooncake when the prefill offers it, else tcp. "
        "prefill: mooncake registers the caches with the Mooncake transfer engine as well (needs "
        "the pd extra); shm and tcp are always offered",
    )
    _FLAGS.add(
        sw,
        "--kv-transfer-timeout",
        type=positive_float,
        help="decode: seconds one KV transfer may take (default %(default)g)",
    )
    _FLAGS.add(
        sw,
        "--kv-advertise-host",
        help="prefill: the host name decode instances reach the KV port (and the transfer engine) "
        "at (default --host; with --host 0.0.0.0, the address of the default route, else the "
        "first interface address that is not loopback)",
    )
    _FLAGS.add(
        sw,
        "--kv-hold-timeout",
        type=positive_float,
        help="prefill: seconds handed-off KV blocks wait for a decode instance (default "
        "%(default)g)",
    )
    _FLAGS.add(
        sw,
        "--max-waiting-requests",
        type=positive_int,
        help="decode: handed-over requests that may queue for a slot before the router is told to "
        "wait (429; default: --max-num-seqs)",
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """``fastdeploy-mtp serve``: see :mod:`fastdeploy_mtp.serving.processes.launcher`."""
    from ..serving.processes.launcher import serve

    spec = resolve_speculative_config(args)
    if args.splitwise_role == "mixed" and args.splitwise_port is not None:
        raise UsageError(
            "--splitwise-port is the KV port of a prefill instance: it needs --splitwise-role "
            "prefill"
        )
    opts = options_from_args(
        ServeOptions,
        args,
        model=resolve_model(model_arg(args), args.dtype, spec),
        speculative_config=spec,
    )
    from ..serving.token_channel.base import WorkerDiedError  # (serve imports Paddle itself)

    try:
        return serve(opts)
    except WorkerDiedError as exc:  # e.g. a worker that failed to start: one line, exit status 1
        raise CommandError(str(exc)) from None

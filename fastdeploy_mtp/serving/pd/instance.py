"""A splitwise instance's engine at ``serve``'s start-up: the
:class:`~.engine.SplitwiseEngine` of a prefill or decode instance over the deployment's KV
caches, and a prefill instance's KV source, listening."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .splitwise_engine import SplitwiseEngine

if TYPE_CHECKING:
    from ..processes.serve_options import ServeOptions


def start_splitwise_engine(
    opts: ServeOptions,
    engine: Any,
    runner: Any,
    on_fatal: Callable[[str], None],
    progress: Callable[[str], None],
    dropped: Any,
    secret: bytes,
) -> tuple[Any, Any]:
    """The :class:`~fastdeploy_mtp.serving.pd.endpoints.SplitwiseEngine` of a prefill or decode
    instance (and, for a prefill instance, its KV source, listening), with the deployment's
    splitwise ``secret``."""
    from ...models.cache_spec import describe
    from ...splitwise.kv_layout import KVLayout
    from ...splitwise.kv_source import KVSource

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
            f"decode instance: KV transport {opts.kv_transport}, transfer timeout "
            f"{opts.kv_transfer_timeout:g} s"
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
        f"prefill instance: KV blocks served on {source.address} (held up to "
        f"{opts.kv_hold_timeout:g} s)"
    )
    return holder["se"], source

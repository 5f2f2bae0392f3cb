"""KV caches shared by name between a cache-manager process and the workers.

FastDeploy's convention, which the cache manager (:mod:`fastdeploy_mtp.serving.cache_manager`),
the target runner and :class:`~fastdeploy_mtp.proposer.MTPProposer` all follow:

* one key and one value tensor per layer, named ``key_caches_{layer}_rank{r}.device{d}`` and
  ``value_caches_{layer}_rank{r}.device{d}``, where ``r = local_rank % tensor_parallel_size``
  and ``d`` is the worker's device id; the target's layers are ``0 .. L-1`` and the MTP
  layers follow them (``L .. L+M-1``);
* the creator publishes each tensor with ``set_data_ipc`` and then sets
  ``cache_ready_signal.<engine_worker_queue_port>[r] = 1`` (int32 ``[tp_size]``);
* a worker waits for its entry, then attaches every tensor with ``share_external_data``
  (no copy: on CPU both processes map the same pages).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from .. import ops

#: The signal a cache creator raises per rank once every cache of that rank is published.
CACHE_READY_SIGNAL = "cache_ready_signal"


def caches_are_managed(fd_config: Any) -> bool:
    """Whether a cache-manager process owns the KV caches (workers attach them by name):
    ``cache_config.cache_manager`` when it is ``True`` (set by ``fastdeploy-mtp serve``) or
    ``False``; when it is ``None`` or absent (a FastDeploy config), FastDeploy's rule: host
    swap blocks, an external KV store, or a splitwise role other than ``"mixed"``."""
    cc = fd_config.cache_config
    explicit = getattr(cc, "cache_manager", None)
    if explicit is not None:
        return bool(explicit)
    return (
        cc.num_cpu_blocks > 0
        or bool(cc.kvcache_storage_backend)
        or fd_config.scheduler_config.splitwise_role != "mixed"
    )


def cache_names(first_layer: int, num_layers: int, rank: int, device_id: int) -> list[str]:
    """IPC names of ``num_layers`` layers starting at ``first_layer``: key then value per
    layer, ``[key_caches_{l}_rank{rank}.device{device_id}, value_caches_..., ...]``."""
    return [
        f"{kind}_caches_{layer}_rank{rank}.device{device_id}"
        for layer in range(first_layer, first_layer + num_layers)
        for kind in ("key", "value")
    ]


def wait_cache_ready(parallel_config: Any, timeout: float) -> None:
    """Block until ``cache_ready_signal.<engine_worker_queue_port>`` holds 1 at this rank
    (``local_rank % tensor_parallel_size``). Waits up to ``timeout`` seconds for the signal to
    exist and then to be raised.

    Raises:
        fastdeploy_mtp.ipc.signals.IPCSignalError: timeout, or the creator died (then
            :class:`~fastdeploy_mtp.ipc.signals.CreatorGoneError`).
    """
    from .signals import IPCSignal

    tp = parallel_config.tensor_parallel_size
    rank = parallel_config.local_rank % tp
    signal = IPCSignal(
        CACHE_READY_SIGNAL,
        np.zeros([tp], np.int32),
        np.int32,
        suffix=parallel_config.engine_worker_queue_port,
        create=False,
        timeout=timeout,
    )
    try:
        signal.wait_for(lambda v: v[rank] == 1, timeout=timeout)
    finally:
        signal.close()


def attach_caches(names: list[str], shape: list[int], dtype: str = "float32") -> list[paddle.Tensor]:
    """``share_external_data`` for each name: tensors of ``shape`` and ``dtype`` on the
    published memory (the publisher's shape and dtype must match; the op checks the size)."""
    return [ops.share_external_data(input=paddle.empty([], dtype=dtype), shm_name=n, shape=shape) for n in names]


def detach_caches(tensors: list[paddle.Tensor], names: list[str]) -> None:
    """Undo :func:`attach_caches` (``unset_data_ipc`` with ``close_ipc=True``, the name stays)."""
    for tensor, name in zip(tensors, names):
        ops.unset_data_ipc(tmp_input=tensor, shm_name=name, close_ipc=True, unlink_shm=False)


def publish_caches(tensors: list[paddle.Tensor], names: list[str]) -> None:
    """``set_data_ipc`` each tensor under its name (the creator's side)."""
    for tensor, name in zip(tensors, names):
        ops.set_data_ipc(tmp_input=tensor, shm_name=name)


def unpublish_caches(tensors: list[paddle.Tensor], names: list[str]) -> None:
    """Remove the names :func:`publish_caches` created (the tensors keep their memory). Every
    name is tried even if one fails; the first failure is raised afterwards."""
    first: Exception | None = None
    for tensor, name in zip(tensors, names):
        try:
            ops.unset_data_ipc(tmp_input=tensor, shm_name=name, close_ipc=False, unlink_shm=True)
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first

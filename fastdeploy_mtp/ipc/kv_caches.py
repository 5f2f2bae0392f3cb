"""KV caches shared by name between a cache-manager process and the workers.

FastDeploy's convention, which the cache manager
(:mod:`fastdeploy_mtp.serving.processes.cache_manager`), the target runner and
:class:`~fastdeploy_mtp.proposer.MTPProposer` all follow:

* the caches are the model's cache spec (:mod:`fastdeploy_mtp.models.cache_spec`), each named
  ``{kind}_caches_{layer}_rank{r}.device{d}`` (:func:`spec_cache_names`): for key and value
  caches FastDeploy's ``key_caches_{layer}_rank{r}.device{d}`` and ``value_caches_...``, where
  ``r = local_rank % tensor_parallel_size`` and ``d`` is the worker's device id; the target's
  layers are ``0 .. L-1`` and the MTP layers follow them (``L .. L+M-1``);
* the creator publishes each tensor with ``set_data_ipc`` and then sets
  ``cache_ready_signal.<engine_worker_queue_port>[r] = 1`` (int32 ``[tp_size]``);
* a worker waits for its entry, then attaches every tensor with ``share_external_data``
  (no copy: on CPU both processes map the same pages).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import paddle

from .. import ops

if TYPE_CHECKING:
    from .signals import IPCSignal

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


class CacheLike(Protocol):
    """What naming and attaching need of a :class:`~fastdeploy_mtp.models.cache_spec.CacheSpec`."""

    @property
    def owner(self) -> str: ...
    @property
    def layer(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...


def spec_cache_names(
    specs: Sequence[CacheLike], rank: int, device_id: int, num_target_layers: int | None = None
) -> list[str]:
    """The IPC name of each cache of ``specs``: ``{kind}_caches_{n}_rank{rank}.device{device_id}``
    where ``n`` is the target layer, or for an MTP layer the target's layer count plus its
    index. ``num_target_layers`` defaults to the target layers in ``specs`` (give it for a
    list that holds only MTP caches)."""
    if num_target_layers is None:
        num_target_layers = len({s.layer for s in specs if s.owner == "target"})
    return [
        f"{s.kind}_caches_{s.layer + (num_target_layers if s.owner == 'mtp' else 0)}"
        f"_rank{rank}.device{device_id}"
        for s in specs
    ]


def attach_spec_caches(specs: Sequence[CacheLike], names: Sequence[str]) -> list[paddle.Tensor]:
    """``share_external_data`` for each cache: a tensor of its spec's shape and dtype on the
    memory published under its name (the op checks the size)."""
    return [
        ops.share_external_data(
            input=paddle.empty([], dtype=s.dtype), shm_name=n, shape=list(s.shape)
        )
        for s, n in zip(specs, names, strict=True)
    ]


def acquire_caches(
    specs: Sequence[CacheLike], fd_config: Any
) -> tuple[list[paddle.Tensor], list[str]]:
    """This rank's tensors for ``specs`` and the names they were attached under: when a
    cache-manager process owns the caches (:func:`caches_are_managed`), wait for
    ``cache_ready_signal`` and attach each by name (:func:`spec_cache_names`, rank
    ``local_rank % tensor_parallel_size``); else zeroed tensors of each spec's shape and dtype
    (and no names)."""
    if not caches_are_managed(fd_config):
        return [paddle.zeros(list(s.shape), dtype=s.dtype) for s in specs], []
    pc = fd_config.parallel_config
    wait_cache_ready(pc, fd_config.cache_config.cache_ready_timeout)
    names = spec_cache_names(specs, pc.local_rank % pc.tensor_parallel_size, pc.device_id)
    return attach_spec_caches(specs, names), names


def cache_ready_signal(
    tensor_parallel_size: int, port: int, create: bool, timeout: float = 0.0
) -> IPCSignal:
    """``cache_ready_signal.<port>`` (``port``: the deployment's ``engine_worker_queue_port``):
    int32 ``[tensor_parallel_size]``, 1 at a rank once its caches are published. The cache
    manager creates it (``create=True``); a worker opens it (``create=False``), waiting up to
    ``timeout`` seconds for it to exist."""
    from .signals import IPCSignal

    return IPCSignal(
        CACHE_READY_SIGNAL,
        np.zeros([tensor_parallel_size], np.int32),
        np.int32,
        suffix=port,
        create=create,
        timeout=timeout,
    )


def wait_cache_ready(parallel_config: Any, timeout: float) -> None:
    """Block until ``cache_ready_signal.<engine_worker_queue_port>`` holds 1 at this rank
    (``local_rank % tensor_parallel_size``). Waits up to ``timeout`` seconds for the signal to
    exist and then to be raised.

    Raises:
        fastdeploy_mtp.ipc.signals.IPCSignalError: timeout, or the creator died (then
            :class:`~fastdeploy_mtp.ipc.signals.CreatorGoneError`).
    """
    tp = parallel_config.tensor_parallel_size
    rank = parallel_config.local_rank % tp
    signal = cache_ready_signal(
        tp, parallel_config.engine_worker_queue_port, create=False, timeout=timeout
    )
    try:
        signal.wait_for(lambda v: v[rank] == 1, timeout=timeout)
    finally:
        signal.close()


def host_view(tensor: paddle.Tensor) -> np.ndarray:
    """A writable numpy view (no copy) of a CPU cache tensor; a bfloat16 tensor is viewed as
    int16, its bits (numpy has no bfloat16)."""
    if tensor.dtype == paddle.bfloat16:
        tensor = paddle.view(tensor, paddle.int16)
    return np.from_dlpack(tensor)


def detach_caches(tensors: list[paddle.Tensor], names: list[str]) -> None:
    """Undo :func:`attach_spec_caches` (``unset_data_ipc`` with ``close_ipc=True``, the name
    stays)."""
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

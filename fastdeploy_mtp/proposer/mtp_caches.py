"""The MTP layers' KV caches of :class:`~fastdeploy_mtp.proposer.MTPProposer` (a key and a value
cache for every MTP layer the model has): created here, or attached by name from a
cache-manager process, and published for one (FastDeploy's ``initialize_kv_cache`` /
``clear_mtp_cache`` / ``update_mtp_block_num`` surface)."""

from __future__ import annotations

import paddle

from ..config import FDConfig
from ..ipc.kv_caches import (
    attach_spec_caches,
    caches_are_managed,
    detach_caches,
    publish_caches,
    spec_cache_names,
    unpublish_caches,
    wait_cache_ready,
)
from ..models.cache_spec import CacheSpec, backend_specs, model_dtype
from ..models.interfaces import MTPModel


class MTPCaches:
    """The proposer's cache methods (a base of :class:`~fastdeploy_mtp.proposer.MTPProposer`,
    which sets the attributes below in its constructor).

    Attributes:
        caches: per MTP layer a key and a value tensor (empty until created or attached),
            as :attr:`cache_specs` describes them.
        cache_specs: the owner ``"mtp"`` part of the deployment's cache spec.
        num_gpu_blocks: blocks per cache (as many as the target's: the draft mirrors its
            block table).
    """

    fd_config: FDConfig
    model: MTPModel
    local_rank: int
    device_id: int
    caches: list[paddle.Tensor]
    cache_specs: list[CacheSpec]
    num_gpu_blocks: int
    _attached: list[str]  # IPC names of caches attached from another process
    _published: list[str]  # IPC names of caches this proposer published

    def cache_names(self) -> list[str]:
        """IPC names of the MTP layers' caches, key then value per layer (FastDeploy's
        ``key_caches_{layer}_rank{r}.device{d}``; MTP layers follow the target's layers)."""
        pc = self.fd_config.parallel_config
        return spec_cache_names(
            self.cache_specs or self._specs(1),  # names depend on owner, layer and kind only
            self.local_rank % pc.tensor_parallel_size,
            self.device_id,
            num_target_layers=self.fd_config.model_config.num_hidden_layers,
        )

    def _specs(self, num_blocks: int) -> list[CacheSpec]:
        """A key and a value cache per MTP layer of ``num_blocks`` blocks, the model's dtype."""
        backend = self.model.attn_backend
        return backend_specs(
            "mtp", self.model.num_cache_layers, backend, num_blocks, model_dtype(self.model)
        )

    def initialize_kv_cache(self, main_model_num_blocks: int, profile: bool = False) -> None:
        """Create or attach the MTP layers' KV caches (per layer a key and a value tensor of
        shape ``model.attn_backend.get_kv_cache_shape(main_model_num_blocks)`` and the model's
        ``config.dtype``, :attr:`cache_specs`; the draft
        mirrors the target's block table, so it has as many blocks as the target).

        FastDeploy's two paths: when ``profile`` or no cache-manager process owns the caches
        (:func:`~fastdeploy_mtp.ipc.kv_caches.caches_are_managed`: ``cache_config.cache_manager``
        if set, else no ``num_cpu_blocks``, no ``kvcache_storage_backend`` and
        ``splitwise_role == "mixed"``) the proposer creates them (and, with
        ``cache_config.share_mtp_cache``, publishes them with ``set_data_ipc`` under
        :meth:`cache_names`; never in a profile run). Otherwise it waits until
        ``cache_ready_signal.<engine_worker_queue_port>`` holds 1 at its rank
        (``local_rank % tensor_parallel_size``), then attaches every cache by name with
        ``share_external_data`` (no copy).

        Raises:
            ValueError: ``main_model_num_blocks <= 0``.
            fastdeploy_mtp.ipc.signals.IPCSignalError: the signal did not come in time
                (``cache_config.cache_ready_timeout``), or its creator died.
        """
        if main_model_num_blocks <= 0:
            raise ValueError(f"`main_model_num_blocks` must be > 0, got {main_model_num_blocks}")
        cc = self.fd_config.cache_config
        self.num_gpu_blocks = int(main_model_num_blocks)
        self.cache_specs = self._specs(self.num_gpu_blocks)
        if profile or not caches_are_managed(self.fd_config):
            self.caches = [paddle.zeros(list(s.shape), dtype=s.dtype) for s in self.cache_specs]
            if cc.share_mtp_cache and not profile:
                publish_caches(self.caches, self.cache_names())
                self._published = self.cache_names()
            return
        wait_cache_ready(self.fd_config.parallel_config, cc.cache_ready_timeout)
        self.caches = attach_spec_caches(self.cache_specs, self.cache_names())
        self._attached = self.cache_names()

    def clear_mtp_cache(self) -> None:
        """Release the MTP layer's KV caches: detach attached ones (``close_ipc=True``,
        ``unlink_shm=False``, as FastDeploy), unlink the names of published ones (their tensors
        keep their memory), then drop every cache tensor."""
        detach_caches(self.caches, getattr(self, "_attached", []))
        unpublish_caches(self.caches, getattr(self, "_published", []))
        self._attached, self._published = [], []
        self.caches = []

    def update_mtp_block_num(self, num_gpu_blocks: int) -> None:
        """Re-create the caches for a new block count (after the engine profiled memory)."""
        self.clear_mtp_cache()
        self.initialize_kv_cache(num_gpu_blocks)

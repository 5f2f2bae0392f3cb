"""The options of ``fastdeploy-mtp serve`` (:class:`ServeOptions`) and their defaults,
light enough for the command line to import before anything heavy."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import SpeculativeConfig
from ...tenancy import AccessOptions


@dataclass
class ServeOptions(AccessOptions):
    """The ``serve`` command's options, with their defaults (the one place they are written:
    :mod:`fastdeploy_mtp.entrypoints.serve` defines the flags and takes its defaults from
    here, :func:`~.start_up.option_defaults`)."""

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
    #: ``--token-channel``: ``"shm"`` (any number of slots) or ``"sysv"`` (FastDeploy's message)
    token_channel: str = "shm"
    #: ``--kv-cache-memory``: KV bytes per rank (``None``: auto, see :mod:`fastdeploy_mtp.capacity`)
    kv_cache_memory: int | None = None
    #: ``--max-num-batched-tokens``: the token budget of one step (``None``: the default rule)
    max_num_batched_tokens: int | None = None
    #: ``--enable-prefix-caching`` / ``--no-enable-prefix-caching`` (``None``: on, except for a
    #: model with linear-attention layers, which prefix caching cannot serve)
    enable_prefix_caching: bool | None = None
    #: ``--log-level``: ``"debug"``, ``"info"``, ``"warning"`` or ``"error"`` (see
    #: :class:`~.start_up.Progress`; below debug, Paddle's, glog's and uvicorn's info is quiet)
    log_level: str = "info"

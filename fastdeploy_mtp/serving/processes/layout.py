"""The one place the engine, the cache manager and the workers derive the serving config
from, so that all processes agree on every shape and name."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, get_type_hints

from ...config import FDConfig, SpeculativeConfig
from .start_up import LOG_LEVELS

if TYPE_CHECKING:  # importing the models imports Paddle: children import it after their set-up
    from collections.abc import Sequence

    from ...ipc.kv_caches import CacheLike
    from ...models.cache_spec import CacheSpec
    from ...models.linear_state import StateSpec
    from ...models.model_config import ModelConfig as ArchConfig


def _int_list(text: str) -> list[int]:
    return [int(d) for d in text.split(",")] if text else []


def _bool(text: str) -> bool:
    """``True``/``False`` as :meth:`ServeLayout.to_args` writes them."""
    if text not in ("True", "False"):
        raise argparse.ArgumentTypeError(f"must be True or False, got {text!r}")
    return text == "True"


@dataclass
class ServeLayout:
    """What every process of one server must agree on. Each field is one worker argument of
    the same name (FastDeploy's worker names; :meth:`to_args`, :meth:`add_args`).

    Attributes:
        model: the model folder (``config.json``, safetensors weights).
        dtype: ``--dtype`` (``"auto"``: the folder's own, widened to float32 on the CPU).
        speculative_config: FastDeploy's ``speculative_config`` as JSON.
        max_num_seqs: batch slots ``N``.
        max_model_len: longest prompt + output of one request.
        engine_worker_queue_port: names the deployment: its runtime directory (where the
            engine's worker socket lives, :mod:`.runtime_dir`), the suffix of
            ``cache_ready_signal`` and the SysV message queue id of the token output.
        tensor_parallel_size: worker processes (one per rank).
        device_ids: per rank, the device id in the cache names (empty: ``0..tp-1``).
        cache_ready_timeout: seconds a worker waits for its caches.
        splitwise_role: ``"mixed"``, ``"prefill"`` or ``"decode"`` (FastDeploy's
            ``scheduler_config.splitwise_role``).
        token_channel: how rank 0 hands the step's tokens to the engine: ``"shm"`` (a
            shared-memory segment, any number of slots) or ``"sysv"`` (FastDeploy's SysV
            message, bounded by ``kernel.msgmax``);
            :mod:`fastdeploy_mtp.serving.token_channel.channel`.
        max_num_batched_tokens: the token budget of one step
            (``scheduler_config.max_num_batched_tokens``; 0: :func:`~..engine_args.build_config`'s
            default).
        total_block_num: KV blocks of each cache (``cache_config.total_block_num``; 0:
            :func:`~..engine_args.build_config`'s default for ``max_num_seqs`` full-length
            requests).
        enable_prefix_caching: ``cache_config.enable_prefix_caching``.
        log_level: ``serve --log-level``: what the children print (their info lines, and
            Paddle's own below ``debug``: :mod:`.start_up`).
    """

    model: str = field(metadata={"help": "model folder"})
    speculative_config: str = field(metadata={"help": "FastDeploy's speculative_config JSON"})
    max_num_seqs: int
    max_model_len: int
    engine_worker_queue_port: int
    tensor_parallel_size: int = 1
    device_ids: list[int] = field(
        default_factory=list, metadata={"help": "comma-separated, one per rank (default 0..tp-1)"}
    )
    cache_ready_timeout: float = 120.0
    splitwise_role: str = field(
        default="mixed", metadata={"choices": ("mixed", "prefill", "decode")}
    )
    dtype: str = field(
        default="auto", metadata={"choices": ("auto", "float32", "bfloat16", "float16")}
    )
    token_channel: str = field(default="shm", metadata={"choices": ("shm", "sysv")})
    max_num_batched_tokens: int = 0
    total_block_num: int = 0
    enable_prefix_caching: bool = False
    log_level: str = field(default="info", metadata={"choices": LOG_LEVELS})

    def __post_init__(self) -> None:
        tp = self.tensor_parallel_size
        self.device_ids = list(self.device_ids) or list(range(tp))
        if len(self.device_ids) != tp:
            raise ValueError(
                f"--device_ids names {len(self.device_ids)} devices; --tensor_parallel_size is {tp}"
            )

    @property
    def msg_queue_id(self) -> int:
        """SysV queue id of the workers' token output (FastDeploy's ``INFERENCE_MSG_QUEUE_ID``)."""
        return self.engine_worker_queue_port

    def arch(self) -> ArchConfig:
        """The model's architecture as every process loads it (its ``config.json`` and
        ``--dtype``), read without loading the weights."""
        from ...models import inspect_model_folder

        return inspect_model_folder(self.model, self.dtype)

    def fd_config(self, rank: int = 0, arch: ArchConfig | None = None) -> FDConfig:
        """The FDConfig of rank ``rank`` (the engine uses rank 0's): caches owned by the cache
        manager, every name and shape as the other processes derive them."""
        from ...engine_args import build_config

        spec = SpeculativeConfig.from_json(self.speculative_config)
        cfg = build_config(
            arch or self.arch(),
            spec,
            self.max_num_seqs,
            self.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens or None,
            total_block_num=self.total_block_num or None,
        )
        cfg.cache_config.enable_prefix_caching = self.enable_prefix_caching
        cfg.model_config.model = self.model
        cfg.cache_config.cache_manager = True
        cfg.cache_config.cache_ready_timeout = self.cache_ready_timeout
        cfg.scheduler_config.splitwise_role = self.splitwise_role
        pc = cfg.parallel_config
        pc.tensor_parallel_size = self.tensor_parallel_size
        pc.tensor_parallel_rank = rank
        pc.local_rank = rank
        pc.device_id = self.device_ids[rank]
        pc.engine_worker_queue_port = self.engine_worker_queue_port
        return cfg

    def cache_specs(self, arch: ArchConfig | None = None) -> list[CacheSpec]:
        """The KV caches of each rank (the same list for every rank): every target layer's and,
        with ``method == "mtp"``, every MTP layer's (``num_nextn_predict_layers``), key then value,
        ``[total_block_num, kv_heads / tp, block_size, head_dim]`` of the model's dtype."""
        from ...models.cache_spec import model_cache_specs

        arch = arch or self.arch()
        cfg = self.fd_config(0, arch)
        blocks = cfg.cache_config.total_block_num
        return model_cache_specs(
            arch, blocks, self.tensor_parallel_size, cfg.speculative_config.uses_mtp
        )

    def state_specs(self, arch: ArchConfig | None = None) -> list[StateSpec]:
        """The linear-attention states of each rank (none for a model without such layers;
        :func:`~fastdeploy_mtp.models.linear_state.state_specs`): per slot, not per block."""
        from ...models.linear_state import state_specs, verify_rows

        rows = verify_rows(SpeculativeConfig.from_json(self.speculative_config))
        return state_specs(arch or self.arch(), self.max_num_seqs, rows, self.tensor_parallel_size)

    def cache_names(self, specs: Sequence[CacheLike]) -> list[list[str]]:
        """Per rank, the IPC name of each cache of ``specs`` (FastDeploy's names for key and
        value caches, with this layout's device ids)."""
        from ...ipc.kv_caches import spec_cache_names

        return [
            spec_cache_names(specs, rank, device) for rank, device in enumerate(self.device_ids)
        ]

    def to_args(self) -> list[str]:
        """Command-line arguments (FastDeploy's worker names) that rebuild this layout."""
        args: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            args += [
                f"--{f.name}",
                ",".join(str(v) for v in value) if isinstance(value, list) else str(value),
            ]
        return args

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        """The arguments :meth:`to_args` writes, one per field, typed by its annotation."""
        hints = get_type_hints(cls)
        for f in fields(cls):
            kind = hints[f.name]
            options: dict[str, Any] = dict(f.metadata)
            options["type"] = _int_list if kind == list[int] else _bool if kind is bool else kind
            if f.default is not MISSING:
                options["default"] = f.default
            elif f.default_factory is not MISSING:
                options["default"] = f.default_factory()
            else:
                options["required"] = True
            parser.add_argument(f"--{f.name}", **options)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeLayout:
        """The layout :meth:`add_args`'s arguments describe (``ValueError`` if inconsistent)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

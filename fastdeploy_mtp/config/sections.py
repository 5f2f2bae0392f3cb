"""``FDConfig`` and the sections the package reads besides the speculative one
(``model_config``, ``scheduler_config``, ``cache_config``, ``parallel_config``), with
FastDeploy's attribute names, defaults, and checks that name the offending field."""

from __future__ import annotations

from dataclasses import dataclass, field

from .speculative import SpeculativeConfig, check_splitwise_method
from .validators import fraction_fields, one_of, positive_fields

#: ``scheduler_config.splitwise_role`` values.
SPLITWISE_ROLES = ("mixed", "prefill", "decode")


@dataclass
class ModelConfig:
    """``fd_config.model_config``.

    Attributes:
        model: path of the target checkpoint (informational).
        architectures: e.g. ``["TinyForCausalLM"]``; the proposer derives the MTP layer's
            architecture name by replacing ``"Moe"`` with ``"MTP"`` as FastDeploy does.
        max_model_len: ``L``, the longest sequence (prompt + generated) a slot holds.
        vocab_size / ori_vocab_size: padded and real vocabulary.
        hidden_size: ``H``.
        num_hidden_layers: target decoder layers.
        eos_token_id: ids that end a request.
    """

    model: str = ""
    architectures: list[str] = field(default_factory=lambda: ["TinyForCausalLM"])
    max_model_len: int = 2048
    vocab_size: int = 272
    ori_vocab_size: int = 256
    hidden_size: int = 128
    num_hidden_layers: int = 2
    eos_token_id: list[int] = field(default_factory=lambda: [256])

    def __post_init__(self) -> None:
        positive_fields(self, "max_model_len", "vocab_size", "ori_vocab_size", "hidden_size")
        if not self.eos_token_id:
            raise ValueError("ModelConfig.eos_token_id must name at least one id")


@dataclass
class SchedulerConfig:
    """``fd_config.scheduler_config``.

    Attributes:
        max_num_seqs: ``N``, batch slots.
        max_num_batched_tokens: token budget of one target forward (chunked prefill splits
            prompts to fit it).
        splitwise_role: ``"mixed"``, ``"prefill"`` or ``"decode"``.
        enable_overlap_schedule: FastDeploy's switch for sizing the proposer's substeps by an
            upper bound instead of a host read. Accepted for compatibility; this proposer always
            sizes them by host-known bounds (the target's token count, then the slots in use),
            so no round reads a length back.
    """

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    splitwise_role: str = "mixed"
    enable_overlap_schedule: bool = False

    def __post_init__(self) -> None:
        positive_fields(self, "max_num_seqs", "max_num_batched_tokens")
        one_of(self.splitwise_role, SPLITWISE_ROLES, "SchedulerConfig.splitwise_role")


@dataclass
class CacheConfig:
    """``fd_config.cache_config``.

    Attributes:
        block_size: tokens per KV block.
        total_block_num: KV blocks of the target (and of the MTP layer, which mirrors the
            target's block table).
        kv_cache_ratio: share of blocks for prompts in the v0 scheduler (the draft's free
            list is the rest, as FastDeploy lays it out).
        enc_dec_block_num: extra block-table columns per slot.
        num_cpu_blocks / kvcache_storage_backend: host swap blocks / an external KV store.
            As in FastDeploy, with either of them (or a splitwise role other than
            ``"mixed"``) a cache-manager process creates every KV cache, the MTP layer's
            included, and the worker attaches them by name.
        cache_manager: ``True``: a cache-manager process creates every KV cache (the
            target's and the MTP layer's) and publishes it by name; the target runner and the
            proposer attach them and never create any (``fastdeploy-mtp serve`` sets it).
            ``False``: this process creates its caches, whatever the rule below says (e.g. a
            single-process splitwise engine in tests). ``None`` (default): FastDeploy's rule.
        share_mtp_cache: when the proposer creates the MTP layer's caches itself, also
            publish them by name (``set_data_ipc``) for another process to attach. FastDeploy
            always publishes; the single-process engine has no such process (default off).
        cache_ready_timeout: seconds an attaching worker waits for ``cache_ready_signal``.
        enable_prefix_caching: share the KV blocks (every layer's, MTP included) of identical
            prompt prefixes between requests (:mod:`fastdeploy_mtp.runtime.block_pool`).
    """

    block_size: int = 16
    total_block_num: int = 256
    kv_cache_ratio: float = 0.75
    enc_dec_block_num: int = 2
    num_cpu_blocks: int = 0
    kvcache_storage_backend: str | None = None
    cache_manager: bool | None = None
    share_mtp_cache: bool = False
    cache_ready_timeout: float = 60.0
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        positive_fields(self, "block_size", "total_block_num")
        positive_fields(self, "enc_dec_block_num", allow_zero=True)
        fraction_fields(self, "kv_cache_ratio")


@dataclass
class ParallelConfig:
    """``fd_config.parallel_config``: tensor parallelism and the names of shared resources.

    Attributes:
        tensor_parallel_size / tensor_parallel_rank: TP layout; with a size above 1 each
            worker runs its shard of the model (``load_tiny(tensor_parallel_size=...)``) in
            the group of :func:`fastdeploy_mtp.distributed.init_tensor_parallel`, and rank
            0's sampled tokens are broadcast.
        local_rank / device_id: this worker's rank and device.
        engine_worker_queue_port: suffix of the IPC names (``cache_ready_signal.<port>``,
            ``key_caches_{layer}_rank{r}.device{d}``).
    """

    tensor_parallel_size: int = 1
    tensor_parallel_rank: int = 0
    local_rank: int = 0
    device_id: int = 0
    engine_worker_queue_port: int = 8002

    def __post_init__(self) -> None:
        positive_fields(self, "tensor_parallel_size")
        if not 0 <= self.tensor_parallel_rank < self.tensor_parallel_size:
            raise ValueError(
                f"ParallelConfig.tensor_parallel_rank must be in "
                f"[0, {self.tensor_parallel_size}), got {self.tensor_parallel_rank}"
            )


@dataclass
class FDConfig:
    """``fd_config``: the sections above under FastDeploy's names."""

    model_config: ModelConfig = field(default_factory=ModelConfig)
    speculative_config: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        check_splitwise_method(self.speculative_config.method, self.scheduler_config.splitwise_role)

    @property
    def max_blocks_per_seq(self) -> int:
        """``B``: block-table columns per slot, ``ceil(L / block_size) + enc_dec_block_num``."""
        bs = self.cache_config.block_size
        return -(-self.model_config.max_model_len // bs) + self.cache_config.enc_dec_block_num

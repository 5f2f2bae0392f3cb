"""Models: the dense target model, the MTP layers, the paged reference attention backend,
model-folder loading (llama, qwen2, qwen3, mimo and the shipped tiny checkpoint), checkpoint
loaders for real MTP layouts, and the shipped tiny checkpoint's helpers."""

from .attention import ReferenceAttentionBackend, causal_bias, dense_causal_attention
from .forward_meta import (
    UNUSED_BLOCK,
    AttentionPlan,
    ForwardMeta,
    make_forward_meta,
    validate_forward_meta,
)
from .hf_config import ARCHITECTURES, UnsupportedModelError, translate_config
from .loading import (
    FAMILIES,
    CheckpointError,
    FamilySpec,
    MissingTensorError,
    TensorShapeError,
    TensorSource,
    UnsupportedTensorError,
    config_for_family,
    load_mtp_weights,
    load_state_strict,
)
from .model_config import ModelConfig
from .model_folder import build_models, inspect_model_folder, load_model
from .mtp_layer import MTPLayer
from .parallel_layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_tensor_parallel,
    kv_cache_shape,
    shard_axes,
)
from .target import TinyTargetModel, mask_padded_vocab
from .tiny import (
    ASSETS_DIR,
    ByteTokenizer,
    contiguous_block_tables,
    greedy_generate,
    greedy_generate_batch,
    load_tiny,
    save_tiny,
    score_windows,
)

__all__ = [
    "ARCHITECTURES",
    "ASSETS_DIR",
    "AttentionPlan",
    "ByteTokenizer",
    "CheckpointError",
    "ColumnParallelLinear",
    "FAMILIES",
    "FamilySpec",
    "ForwardMeta",
    "MTPLayer",
    "MissingTensorError",
    "ModelConfig",
    "ParallelLMHead",
    "ReferenceAttentionBackend",
    "RowParallelLinear",
    "TensorShapeError",
    "TensorSource",
    "TinyTargetModel",
    "UNUSED_BLOCK",
    "UnsupportedModelError",
    "UnsupportedTensorError",
    "VocabParallelEmbedding",
    "causal_bias",
    "check_tensor_parallel",
    "config_for_family",
    "contiguous_block_tables",
    "dense_causal_attention",
    "greedy_generate",
    "greedy_generate_batch",
    "build_models",
    "inspect_model_folder",
    "kv_cache_shape",
    "load_model",
    "load_mtp_weights",
    "load_state_strict",
    "load_tiny",
    "make_forward_meta",
    "mask_padded_vocab",
    "save_tiny",
    "score_windows",
    "shard_axes",
    "translate_config",
    "validate_forward_meta",
]

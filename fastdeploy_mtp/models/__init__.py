"""Models: the dense target model, the MTP layers, the paged reference attention backend,
model-folder inspection and loading (llama, qwen2, qwen3, mimo and the shipped tiny
checkpoint), checkpoint loaders for real MTP layouts, and the shipped tiny checkpoint's
helpers.

The names below are imported from their modules on first use (PEP 562), so importing one
Paddle-free module of the package (``hf_config``, ``folder_inspection``, ``model_config``,
the family configs) does not import Paddle: the command line checks a model folder before
anything heavy loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as mypy sees them; at run time __getattr__ imports them
    from .attention import ReferenceAttentionBackend as ReferenceAttentionBackend
    from .checkpoint_families import (
        FAMILIES as FAMILIES,
        FamilySpec as FamilySpec,
        config_for_family as config_for_family,
    )
    from .dense_attention import (
        causal_bias as causal_bias,
        dense_causal_attention as dense_causal_attention,
    )
    from .folder_inspection import (
        ASSETS_DIR as ASSETS_DIR,
        inspect_model_folder as inspect_model_folder,
    )
    from .forward_meta import (
        UNUSED_BLOCK as UNUSED_BLOCK,
        AttentionPlan as AttentionPlan,
        ForwardMeta as ForwardMeta,
        validate_forward_meta as validate_forward_meta,
    )
    from .hf_config import (
        ARCHITECTURES as ARCHITECTURES,
        UnsupportedModelError as UnsupportedModelError,
        translate_config as translate_config,
    )
    from .host_forward_meta import make_forward_meta as make_forward_meta
    from .loading import (
        load_mtp_weights as load_mtp_weights,
        load_state_strict as load_state_strict,
    )
    from .model_config import (
        ModelConfig as ModelConfig,
    )
    from .model_folder import (
        build_models as build_models,
        load_model as load_model,
    )
    from .mtp_layer import (
        MTPLayer as MTPLayer,
    )
    from .parallel_layers import (
        ColumnParallelLinear as ColumnParallelLinear,
        ParallelLMHead as ParallelLMHead,
        RowParallelLinear as RowParallelLinear,
        VocabParallelEmbedding as VocabParallelEmbedding,
        check_tensor_parallel as check_tensor_parallel,
        kv_cache_shape as kv_cache_shape,
        shard_axes as shard_axes,
    )
    from .target import (
        TinyTargetModel as TinyTargetModel,
        mask_padded_vocab as mask_padded_vocab,
    )
    from .tensor_source import (
        CheckpointError as CheckpointError,
        MissingTensorError as MissingTensorError,
        TensorShapeError as TensorShapeError,
        TensorSource as TensorSource,
        UnsupportedTensorError as UnsupportedTensorError,
    )
    from .tiny import (
        ByteTokenizer as ByteTokenizer,
        contiguous_block_tables as contiguous_block_tables,
        greedy_generate as greedy_generate,
        greedy_generate_batch as greedy_generate_batch,
        load_tiny as load_tiny,
        save_tiny as save_tiny,
        score_windows as score_windows,
    )

#: Exported name -> the module of the package that defines it.
_EXPORTS = {
    "ReferenceAttentionBackend": "attention",
    "causal_bias": "dense_attention",
    "dense_causal_attention": "dense_attention",
    "UNUSED_BLOCK": "forward_meta",
    "AttentionPlan": "forward_meta",
    "ForwardMeta": "forward_meta",
    "make_forward_meta": "host_forward_meta",
    "validate_forward_meta": "forward_meta",
    "ARCHITECTURES": "hf_config",
    "UnsupportedModelError": "hf_config",
    "translate_config": "hf_config",
    "FAMILIES": "checkpoint_families",
    "FamilySpec": "checkpoint_families",
    "config_for_family": "checkpoint_families",
    "CheckpointError": "tensor_source",
    "MissingTensorError": "tensor_source",
    "TensorShapeError": "tensor_source",
    "TensorSource": "tensor_source",
    "UnsupportedTensorError": "tensor_source",
    "load_mtp_weights": "loading",
    "load_state_strict": "loading",
    "ModelConfig": "model_config",
    "inspect_model_folder": "folder_inspection",
    "build_models": "model_folder",
    "load_model": "model_folder",
    "MTPLayer": "mtp_layer",
    "ColumnParallelLinear": "parallel_layers",
    "ParallelLMHead": "parallel_layers",
    "RowParallelLinear": "parallel_layers",
    "VocabParallelEmbedding": "parallel_layers",
    "check_tensor_parallel": "parallel_layers",
    "kv_cache_shape": "parallel_layers",
    "shard_axes": "parallel_layers",
    "TinyTargetModel": "target",
    "mask_padded_vocab": "target",
    "ASSETS_DIR": "folder_inspection",
    "ByteTokenizer": "tiny",
    "contiguous_block_tables": "tiny",
    "greedy_generate": "tiny",
    "greedy_generate_batch": "tiny",
    "load_tiny": "tiny",
    "save_tiny": "tiny",
    "score_windows": "tiny",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """The exported ``name``, imported from its module the first time it is asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value

"""Models: the tiny target model, the MTP layer, the paged reference attention backend,
checkpoint loaders for real MTP layouts, and the shipped tiny checkpoint."""

from .attention import ReferenceAttentionBackend, causal_bias, dense_causal_attention
from .config import ModelConfig
from .forward_meta import UNUSED_BLOCK, AttentionPlan, ForwardMeta, make_forward_meta
from .mtp import MTPLayer
from .target import TinyTargetModel, mask_padded_vocab

__all__ = [
    "AttentionPlan", "ForwardMeta", "MTPLayer", "ModelConfig", "ReferenceAttentionBackend",
    "TinyTargetModel", "UNUSED_BLOCK", "causal_bias", "dense_causal_attention",
    "make_forward_meta", "mask_padded_vocab",
]

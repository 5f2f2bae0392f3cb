"""Every KV cache a deployment holds, derived from the model config.

A :class:`CacheSpec` is one cache tensor of one tensor-parallel rank: who owns it (the target
model or the MTP layers), which of the owner's layers, what it holds and its shape and dtype.
:func:`model_cache_specs` lists a deployment's caches in the order every process uses: target
layer 0 key, value, layer 1 key, value, ..., then MTP layer 0 key, value, MTP layer 1 ....
The cache manager creates exactly these tensors, the workers attach them, and a prefill
instance hands every one of them to a decode instance.

Consumers never assume "a key and a value per layer": they walk the list. A multi-head latent
attention model (``attention_type == "mla"``) has one ``"latent"`` cache per layer, of shape
``[num_blocks, 1, block_size, kv_lora_rank + qk_rope_head_dim]``, the same on every
tensor-parallel rank (the latent is not split by head).

:func:`describe` writes the JSON form (a list of small dicts) that travels in a
prefill/decode hand-over and in the layout checks; the splitwise layout reads it back
(``fastdeploy_mtp.splitwise.kv_layout.KVLayout.from_description``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .model_config import MODEL_DTYPES, ModelConfig

if TYPE_CHECKING:  # (they import Paddle: the splitwise layout imports this module without it)
    from .interfaces import AttentionBackend

#: Values of :attr:`CacheSpec.owner`, in list order.
CACHE_OWNERS = ("target", "mtp")
#: Values of :attr:`CacheSpec.kind`: paged attention's key and value caches, and a latent cache
#: (one per layer) for attention that caches a compressed state.
CACHE_KINDS = ("key", "value", "latent")
#: Bytes per element of each cache dtype.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class CacheSpec:
    """One cache tensor of one rank.

    Attributes:
        owner: ``"target"`` or ``"mtp"``.
        layer: the owner's layer index (MTP layers count from 0).
        kind: one of :data:`CACHE_KINDS`.
        shape: ``[num_blocks, kv_heads_per_rank, block_size, head_dim]`` for key/value caches,
            ``[num_blocks, 1, block_size, kv_lora_rank + qk_rope_head_dim]`` for latent ones;
            dimension 0 is always the block count.
        dtype: one of :data:`~.model_config.MODEL_DTYPES`.
    """

    owner: str
    layer: int
    kind: str
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if self.owner not in CACHE_OWNERS:
            raise ValueError(f"CacheSpec `owner` must be one of {CACHE_OWNERS}, got {self.owner!r}")
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise ValueError(f"CacheSpec `layer` must be an int >= 0, got {self.layer!r}")
        if self.kind not in CACHE_KINDS:
            raise ValueError(f"CacheSpec `kind` must be one of {CACHE_KINDS}, got {self.kind!r}")
        dims = (
            tuple(self.shape)
            if isinstance(self.shape, Sequence) and not isinstance(self.shape, str)
            else ()
        )
        if len(dims) < 2 or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims
        ):
            raise ValueError(
                f"CacheSpec `shape` must be 2 or more positive ints, got {self.shape!r}"
            )
        object.__setattr__(self, "shape", dims)
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(
                f"CacheSpec `dtype` must be one of {tuple(DTYPE_BYTES)}, got {self.dtype!r}"
            )

    @property
    def num_blocks(self) -> int:
        return self.shape[0]

    @property
    def block_shape(self) -> tuple[int, ...]:
        """``shape[1:]``: what one block holds."""
        return self.shape[1:]

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "layer": self.layer,
            "kind": self.kind,
            "shape": list(self.shape),
            "dtype": self.dtype,
        }


def model_cache_specs(
    config: ModelConfig, num_blocks: int, tensor_parallel_size: int = 1, with_mtp: bool = True
) -> list[CacheSpec]:
    """The caches of one rank of a deployment of ``config`` (a model's full, unsharded config).

    Args:
        config: the checkpoint's config; every cache has ``config.dtype``.
        num_blocks: blocks per cache (the target's block count; the MTP layers mirror its
            block table, so they have as many).
        tensor_parallel_size: ranks; each holds ``num_key_value_heads / tensor_parallel_size``
            heads.
        with_mtp: speculation with the MTP layers is on: ``config.num_nextn_predict_layers``
            MTP layers get caches (else none).

    Returns:
        ``2 * (num_hidden_layers + M)`` specs, target layers first, key before value; for
        MLA ``num_hidden_layers + M`` ``"latent"`` specs.

    Raises:
        ValueError: ``num_blocks <= 0`` or a config field ``tensor_parallel_size`` does not divide.
    """
    from .parallel_layers import kv_cache_shape

    shape = tuple(kv_cache_shape(config, num_blocks, tensor_parallel_size))
    if config.dtype not in MODEL_DTYPES:
        raise ValueError(f"`dtype` must be one of {MODEL_DTYPES}, got {config.dtype!r}")
    kinds: tuple[str, ...] = ("key", "value")
    if config.attention_type == "mla":
        shape, kinds = (
            (shape[0], 1, config.block_size, config.kv_lora_rank + config.qk_rope_head_dim),
            ("latent",),
        )
    specs = layer_specs("target", config.num_hidden_layers, kinds, shape, config.dtype)
    if with_mtp:
        specs += layer_specs("mtp", config.num_nextn_predict_layers, kinds, shape, config.dtype)
    return specs


def layer_specs(
    owner: str, num_layers: int, kinds: Sequence[str], shape: Sequence[int], dtype: str
) -> list[CacheSpec]:
    """The caches ``kinds`` (in order) of ``shape`` and ``dtype`` for each of ``owner``'s
    ``num_layers`` layers, layer after layer."""
    return [
        CacheSpec(owner, n, kind, tuple(shape), dtype) for n in range(num_layers) for kind in kinds
    ]


def backend_specs(
    owner: str, num_layers: int, backend: AttentionBackend, num_blocks: int, dtype: str
) -> list[CacheSpec]:
    """The caches ``backend`` keeps for ``owner``'s ``num_layers`` layers of ``num_blocks``
    blocks: its ``cache_kinds`` per layer, each of ``backend.get_kv_cache_shape(num_blocks)``."""
    return layer_specs(
        owner, num_layers, backend.cache_kinds, backend.get_kv_cache_shape(num_blocks), dtype
    )


def key_value_specs(
    owner: str, num_layers: int, shape: Sequence[int], dtype: str
) -> list[CacheSpec]:
    """A key and a value cache of ``shape`` and ``dtype`` for each of ``owner``'s
    ``num_layers`` layers: ``[layer 0 key, layer 0 value, layer 1 key, ...]``."""
    return layer_specs(owner, num_layers, ("key", "value"), shape, dtype)


def model_dtype(model: Any) -> str:
    """The cache dtype of a model object: its ``config.dtype``, float32 for a config without one."""
    return str(getattr(getattr(model, "config", None), "dtype", "float32"))


def owned_by(specs: Sequence[CacheSpec], owner: str) -> list[CacheSpec]:
    """The specs of ``owner`` (``"target"`` or ``"mtp"``), in list order."""
    return [s for s in specs if s.owner == owner]


def describe(specs: Sequence[CacheSpec]) -> list[dict[str, Any]]:
    """The JSON form of ``specs``: one ``{"owner", "layer", "kind", "shape", "dtype"}`` per
    cache."""
    return [s.to_dict() for s in specs]

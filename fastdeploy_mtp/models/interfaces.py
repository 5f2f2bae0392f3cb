"""What the proposer and the reference engine need from a model, as ``typing.Protocol``\\ s.

:class:`~fastdeploy_mtp.models.TinyTargetModel`, :class:`~fastdeploy_mtp.models.MTPLayer`
and :class:`~fastdeploy_mtp.models.ReferenceAttentionBackend` satisfy them (mypy checks it at
the bottom of this module); any other model with these members can be plugged into
:class:`~fastdeploy_mtp.proposer.MTPProposer`,
:class:`~fastdeploy_mtp.runtime.target_runner.TargetRunner` and
:class:`~fastdeploy_mtp.runtime.engine.Engine`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import paddle

from .forward_meta import ForwardMeta

if TYPE_CHECKING:
    from paddle._typing import DTypeLike


class AttentionBackend(Protocol):
    """Owner of the KV-cache layout: the engine and the proposer allocate (or attach) caches
    through it, so they never need to know the layout."""

    @property
    def cache_kinds(self) -> tuple[str, ...]:
        """What each layer's caches hold, in order: ``("key", "value")`` or ``("latent",)``."""
        ...

    def get_kv_cache_shape(self, max_num_blocks: int) -> list[int]:
        """Shape of each of one layer's caches holding ``max_num_blocks`` blocks."""
        ...

    def allocate_caches(
        self, num_layers: int, max_num_blocks: int, dtype: DTypeLike = "float32"
    ) -> list[paddle.Tensor]:
        """Zeroed caches for ``num_layers`` layers, ``cache_kinds`` per layer
        (``[k0, v0, k1, v1, ...]`` or ``[c0, c1, ...]``)."""
        ...


class HiddenSizeConfig(Protocol):
    """The part of a model config the engine reads."""

    @property
    def hidden_size(self) -> int: ...


class CachedModel(Protocol):
    """What the target and the MTP layer both offer the engine and the proposer."""

    @property
    def attn_backend(self) -> AttentionBackend:
        """The backend that lays out (and allocates) this model's caches."""
        ...

    @property
    def num_cache_layers(self) -> int:
        """Layers that own a key/value cache pair in ``forward_meta.caches`` (the proposer
        names and shares the MTP layer's)."""
        ...

    def compute_logits(
        self, hidden: paddle.Tensor, forward_meta: ForwardMeta | None = None
    ) -> paddle.Tensor:
        """``[n, H]`` hidden states as returned by the forward -> float32 ``[n, V]``
        (padded-vocabulary columns ``-inf``)."""
        ...


class TargetModel(CachedModel, Protocol):
    """The target (main) model the runner drives and the proposer's MTP layer sits beside."""

    @property
    def config(self) -> HiddenSizeConfig: ...

    def __call__(
        self, ids_remove_padding: paddle.Tensor | None, forward_meta: ForwardMeta
    ) -> paddle.Tensor:
        """Packed batch -> ``[T, H]`` hidden states (the ones the MTP layer consumes)."""
        ...


class MTPModel(CachedModel, Protocol):
    """The MTP layer the proposer runs ``num_model_steps`` times per round."""

    def __call__(
        self,
        ids_remove_padding: paddle.Tensor | None,
        previous_hidden_states: paddle.Tensor,
        forward_meta: ForwardMeta,
    ) -> paddle.Tensor:
        """Packed next tokens + the previous hidden state of each row -> ``[T, H]``."""
        ...

    def empty_input_forward(self, forward_meta: ForwardMeta | None = None) -> None:
        """Called instead of the forward on a rank with no tokens this substep."""
        ...


if TYPE_CHECKING:
    # Static check only: the shipped classes satisfy the protocols.
    from .attention import ReferenceAttentionBackend
    from .latent_attention import LatentAttentionBackend
    from .mtp_layer import MTPLayer
    from .target import TinyTargetModel

    def _conforms(
        target: TinyTargetModel,
        mtp: MTPLayer,
        backend: ReferenceAttentionBackend,
        latent: LatentAttentionBackend,
    ) -> None:
        _target: TargetModel = target
        _mtp: MTPModel = mtp
        _backend: AttentionBackend = backend
        _latent: AttentionBackend = latent

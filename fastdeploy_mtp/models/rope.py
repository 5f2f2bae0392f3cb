"""RoPE frequencies for every ``rope_scaling`` type the supported families use.

:func:`rope_frequencies` turns a :class:`ModelConfig` into the inverse frequencies
(``[head_dim / 2]`` float64) and the factor every ``cos``/``sin`` entry is multiplied by.
The formulas follow the published methods as HuggingFace transformers computes them:

- ``default``: ``theta ** (-2i / d)``.
- ``linear``: the default frequencies divided by ``factor`` (positions / factor).
- ``dynamic`` (NTK-aware): the base becomes ``theta * (factor * L / M - (factor - 1)) ** (d / (d -
2))``
  for a sequence of ``L > M = max_position_embeddings`` tokens. Our table is precomputed for
  ``M`` positions and a position past it is refused, so the longest sequence the table serves
  has ``L = M``, where the base is unchanged: ``dynamic`` rotates exactly like ``default``
  (which is also what transformers does for every sequence up to ``M`` tokens).
- ``yarn``: per-frequency blend of interpolated (``/ factor``) and original frequencies with a
  linear ramp between the correction dimensions of ``beta_fast`` and ``beta_slow`` (rounded
  outwards unless ``truncate`` is false), and ``attention_factor`` (given, or
  ``0.1 * ln(factor) + 1``, or the ratio of those with ``mscale`` / ``mscale_all_dim``)
  applied to cos and sin.
- ``llama3``: wavelengths above ``original_max_position_embeddings / low_freq_factor`` are
  divided by ``factor``, below ``... / high_freq_factor`` kept, and smoothly interpolated
  in between.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .model_config import ModelConfig


def _param(scaling: dict[str, Any], key: str, default: Any = None) -> Any:
    value = scaling.get(key, default)
    if value is None:
        raise ValueError(
            f"`rope_scaling.{key}` is required for rope_type {scaling.get('rope_type')!r}"
        )
    return value


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(
    rope: RopeSpec, base_inv: np.ndarray, scaling: dict[str, Any]
) -> tuple[np.ndarray, float]:
    dim = rope.head_dim
    original = float(scaling.get("original_max_position_embeddings") or rope.max_position)
    factor = scaling.get("factor") or rope.max_position / original
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attention = _yarn_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1
    theta = rope.theta

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # weight of the original (extrapolated) frequency
    inv = (base_inv / factor) * (1.0 - keep) + base_inv * keep
    return inv, float(attention)


def _llama3(base_inv: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    factor = float(_param(scaling, "factor"))
    low_ff = float(_param(scaling, "low_freq_factor"))
    high_ff = float(_param(scaling, "high_freq_factor"))
    old_len = float(_param(scaling, "original_max_position_embeddings"))
    wavelen = 2 * math.pi / base_inv
    scaled = np.where(wavelen > old_len / low_ff, base_inv / factor, base_inv)
    smooth = (old_len / wavelen - low_ff) / (high_ff - low_ff)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high_ff) & (wavelen <= old_len / low_ff)
    return np.where(medium, smoothed, scaled)


@dataclass(frozen=True)
class RopeSpec:
    """What the RoPE tables depend on: ``head_dim``, ``max_position`` (table rows, the
    config's ``max_position_embeddings``), ``theta`` and the normalised ``scaling`` dict."""

    head_dim: int
    max_position: int
    theta: float
    scaling: dict[str, Any] | None = None

    @classmethod
    def of(cls, config: ModelConfig) -> RopeSpec:
        return cls(
            config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
        )


def rope_frequencies(rope: RopeSpec) -> tuple[np.ndarray, float]:
    """``(inv_freq [head_dim / 2] float64, attention_factor)`` of ``rope``.

    Raises:
        ValueError: a parameter the ``rope_type`` needs is missing (named as
        ``rope_scaling.<key>``).
    """
    dim = rope.head_dim
    base_inv = 1.0 / (rope.theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    scaling = rope.scaling or {"rope_type": "default"}
    kind = scaling.get("rope_type", "default")
    if kind in ("default", "dynamic"):
        return base_inv, 1.0
    if kind == "linear":
        return base_inv / float(_param(scaling, "factor")), 1.0
    if kind == "yarn":
        return _yarn(rope, base_inv, scaling)
    if kind == "llama3":
        return _llama3(base_inv, scaling), 1.0
    raise ValueError(f"`rope_scaling.rope_type` {kind!r} is not supported")


def rope_tables(rope: RopeSpec) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)``, each ``[max_position, head_dim]`` float32, "rotate half" layout, the
    attention factor already applied."""
    inv_freq, attention = rope_frequencies(rope)
    freqs = np.arange(rope.max_position, dtype=np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return (np.cos(emb) * attention).astype(np.float32), (np.sin(emb) * attention).astype(
        np.float32
    )

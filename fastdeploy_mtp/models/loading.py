"""Load MTP-layer weights from real checkpoint layouts (safetensors).

One entry point, :func:`load_mtp_weights`, reading a checkpoint through its family's name
map (:mod:`.checkpoint_families`): where the MTP tensors live, which names are the fusion
norms and projection, how the decoder block is named, whether Linear weights are stored in
torch's ``[out, in]`` layout (transposed here into Paddle's ``[in, out]``), the concat order,
where the final norm is applied, whether RMSNorm weights are stored zero-centred, and which
checkpoint tensors duplicate the shared embedding / LM head.

Only dense decoder blocks (GQA attention with separate or fused q/k/v, SwiGLU MLP with
separate or fused gate/up) map onto :class:`~fastdeploy_mtp.models.layers.DecoderLayer`.
MoE experts, routers, MLA projections, q/k norms and anything else under the MTP prefix is
rejected with :class:`~.tensor_source.UnsupportedTensorError` naming the tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import paddle
import paddle.nn as nn

from .checkpoint_families import UNSUPPORTED_HINTS, FamilySpec, get_family
from .model_config import ModelConfig
from .tensor_source import (
    CheckpointSource,
    MissingTensorError,
    TensorShapeError,
    TensorSource,
    UnsupportedTensorError,
)
from .weight_refs import block_refs

if TYPE_CHECKING:
    from .mtp_layer import MTPLayer


def _detect_index(spec: FamilySpec, src: TensorSource, layer_index: int | None) -> int | None:
    if spec.index_regex is None:
        if layer_index is not None:
            raise ValueError(
                f"`layer_index` does not apply to family {spec.name!r} (its MTP prefix is fixed: "
                f"{spec.prefix!r})"
            )
        return None
    found = sorted(
        {int(m.group(1)) for k in src.keys() for m in [re.match(spec.index_regex, k)] if m}
    )
    if layer_index is not None:
        if layer_index not in found:
            raise MissingTensorError(
                f"checkpoint {src.description} has no tensor "
                f"{spec.prefix.format(index=layer_index) + spec.fusion['enorm']!r} (MTP layer "
                f"index {layer_index}); MTP layers found at {found}"
            )
        return layer_index
    if not found:
        raise MissingTensorError(
            f"checkpoint {src.description} has no MTP layer for family {spec.name!r}: no tensor "
            f"matches {spec.index_regex!r}"
        )
    if len(found) > 1:
        raise UnsupportedTensorError(
            f"checkpoint {src.description} has MTP layers at indices {found}; exactly one MTP "
            "layer is supported"
        )
    return found[0]


class _Plan:
    """Collects (checkpoint name -> transform -> our parameter) steps and the names used."""

    def __init__(self, src: TensorSource, params: dict[str, paddle.Tensor]):
        self.src = src
        self.params = params
        self.values: dict[str, np.ndarray] = {}
        self.origin: dict[str, str] = {}
        self.used: set = set()

    def read(self, ckpt: str, shape: list[int]) -> np.ndarray:
        arr = self.src.get(ckpt)
        self.used.add(ckpt)
        if list(arr.shape) != list(shape):
            raise TensorShapeError(
                f"checkpoint tensor {ckpt!r} has shape {list(arr.shape)}, expected {list(shape)}"
            )
        return np.asarray(arr, dtype=np.float32)

    def linear(self, ours: str, ckpt: str, torch_layout: bool) -> None:
        shape = list(self.params[ours].shape)  # Paddle [in, out]
        arr = self.read(ckpt, shape[::-1] if torch_layout else shape)
        self.values[ours] = arr.T if torch_layout else arr
        self.origin[ours] = ckpt

    def vector(self, ours: str, ckpt: str, offset: float = 0.0) -> None:
        self.values[ours] = self.read(ckpt, list(self.params[ours].shape)) + offset
        self.origin[ours] = ckpt

    def fused(self, ours: list[str], ckpt: str, torch_layout: bool) -> None:
        """One checkpoint Linear = our Linears concatenated along the output axis."""
        shapes = [list(self.params[o].shape) for o in ours]
        total = [shapes[0][0], sum(s[1] for s in shapes)]
        arr = self.read(ckpt, total[::-1] if torch_layout else total)
        if torch_layout:
            arr = arr.T
        cuts = np.cumsum([s[1] for s in shapes])[:-1]
        for o, part in zip(ours, np.split(arr, cuts, axis=1)):
            self.values[o] = part
            self.origin[o] = ckpt


def load_mtp_weights(
    model: MTPLayer,
    source: TensorSource | CheckpointSource,
    family: str,
    *,
    layer_index: int | None = None,
    load_shared: bool = False,
) -> dict[str, str]:
    """Load a family's MTP layer from a checkpoint into ``model`` (an :class:`MTPLayer`).

    Args:
        model: the MTP layer; its config must have the family's ``mtp_concat_order`` and
            ``mtp_final_norm`` (build it with :func:`config_for_family`) and its shapes must
            match the checkpoint.
        source: ``.safetensors`` file, directory of shards, or dict of numpy arrays.
        family: a key of :data:`FAMILIES`.
        layer_index: checkpoint layer index of the MTP layer for DeepSeek-style families
            (``model.layers.{N}``, N = the main model's ``num_hidden_layers``); detected
            when omitted. It is remapped to our single local layer.
        load_shared: also load the embedding and LM head (shared with the target) from the
            first of the family's candidate names that exists; by default they are left to
            the target model's loader, as engines load them once.

    Returns:
        our parameter name -> checkpoint tensor name, for every tensor loaded.

    Raises:
        MissingTensorError, TensorShapeError, UnsupportedTensorError: naming the tensor.
        ValueError: unknown family or a config that does not match the family layout.
    """
    spec = get_family(family)
    _check_layer_fits(model, spec)
    src = source if isinstance(source, TensorSource) else TensorSource(source)
    index = _detect_index(spec, src, layer_index)

    def fmt(name: str) -> str:
        return name.format(index=index) if index is not None else name

    params = dict(model.named_parameters())
    plan = _Plan(src, params)
    _plan_layer(plan, spec, fmt(spec.prefix), model.config)
    _reject_leftovers(plan, spec, fmt)
    missing_params = sorted(set(params) - set(plan.values))
    if missing_params:
        raise MissingTensorError(f"no checkpoint tensor mapped to MTP parameters {missing_params}")

    for ours, value in plan.values.items():
        params[ours].set_value(value.astype(np.float32))
    loaded = dict(plan.origin)
    if load_shared:
        loaded.update(_load_shared(plan, spec, fmt, model.target))
    return loaded


def _check_layer_fits(model: MTPLayer, spec: FamilySpec) -> None:
    """Raises ``ValueError`` for a tensor-parallel shard or a config not in the family layout."""
    if getattr(model, "tensor_parallel_size", 1) > 1:
        raise ValueError(
            "load_mtp_weights loads an unsharded MTP layer; `model` is a tensor-parallel shard "
            f"(tensor_parallel_size={model.tensor_parallel_size})"
        )
    for field, want in (
        ("mtp_concat_order", spec.concat_order),
        ("mtp_final_norm", spec.final_norm),
    ):
        if getattr(model.config, field) != want:
            raise ValueError(
                f"family {spec.name!r} needs config.{field} == {want!r}, model has "
                f"{getattr(model.config, field)!r} (use config_for_family)"
            )


def _plan_layer(plan: _Plan, spec: FamilySpec, prefix: str, config: ModelConfig) -> None:
    """Adds every MTP-layer parameter to ``plan``: the fusion tensors, then the decoder block
    (:func:`~fastdeploy_mtp.models.weight_refs.block_refs` names; q/k/v and gate/up read from
    their fused checkpoint tensors where the family has them)."""
    block = prefix + spec.block
    tl = spec.torch_layout

    def absolute(rel: str) -> str:
        return rel[1:] if rel.startswith("/") else prefix + rel

    for norm in ("enorm", "hnorm", "norm"):
        plan.vector(f"{norm}.weight", absolute(spec.fusion[norm]), spec.norm_offset)
    plan.linear("eh_proj.weight", absolute(spec.fusion["eh_proj"]), tl)
    fused = {
        block + "self_attn.qkv_proj.weight": ("q_proj", "k_proj", "v_proj"),
        block + "mlp.up_gate_proj.weight": (
            "gate_proj",
            "up_proj",
        ),  # ERNIE: silu half (gate) first
    }
    fused = {name: parts for name, parts in fused.items() if name in plan.src}
    fused_parts = {p for parts in fused.values() for p in parts}
    for ckpt, parts in fused.items():
        owner = "mtp_block.self_attn." if "self_attn" in ckpt else "mtp_block.mlp."
        plan.fused([f"{owner}{p}.weight" for p in parts], ckpt, tl)
    for ref in block_refs(config, "mtp", "mtp_block.", block, tl):
        kind, leaf = ref.ours.split(".")[-2:]
        if leaf == "weight" and kind in fused_parts:
            continue
        if len(ref.shape) == 2:
            plan.linear(ref.ours, ref.ckpt, tl)
        else:
            plan.vector(ref.ours, ref.ckpt, spec.norm_offset if kind.endswith("layernorm") else 0.0)


def _reject_leftovers(plan: _Plan, spec: FamilySpec, fmt: Callable[[str], str]) -> None:
    """Raises :class:`UnsupportedTensorError` for the first tensor under the family's owned
    prefixes that ``plan`` did not read (duplicates of the shared embedding / head inside
    the MTP prefix are expected and pass)."""
    shared_names = [fmt(n) for n in spec.embed + spec.head]
    leftovers = [
        k
        for k in plan.src.keys()
        if any(k.startswith(fmt(p)) for p in spec.owned_prefixes)
        and k not in plan.used
        and k not in shared_names
    ]
    if leftovers:
        name = leftovers[0]
        hint = next(
            (h for key, h in UNSUPPORTED_HINTS if key in name),
            "this tensor has no counterpart in the dense MTP layer",
        )
        raise UnsupportedTensorError(
            f"checkpoint tensor {name!r} is not supported: {hint} ({len(leftovers)} unsupported "
            "tensor(s) in total)"
        )


def _load_shared(
    plan: _Plan, spec: FamilySpec, fmt: Callable[[str], str], target: Any
) -> dict[str, str]:
    """Loads the target's embedding and LM head from the first of the family's candidate
    names present; returns our name -> checkpoint name for both."""
    emb_name = _first_present(plan.src, [fmt(n) for n in spec.embed], "embedding")
    target.embed_tokens.weight.set_value(
        plan.read(emb_name, list(target.embed_tokens.weight.shape))
    )
    head_name = _first_present(plan.src, [fmt(n) for n in spec.head], "LM head")
    head_shape = list(target.lm_head.weight.shape)  # [H, V]
    tl = spec.torch_layout
    head = plan.read(head_name, head_shape[::-1] if tl else head_shape)
    target.lm_head.weight.set_value(head.T if tl else head)
    return {"<target>.embed_tokens.weight": emb_name, "<target>.lm_head.weight": head_name}


def _first_present(src: TensorSource, names: Iterable[str], what: str) -> str:
    names = list(names)
    for n in names:
        if n in src:
            return n
    raise MissingTensorError(
        f"checkpoint {src.description} has no shared {what}: looked for {names}"
    )


# ----------------------------------------------------------------------------- native format


def load_state_strict(
    layer: nn.Layer,
    source: TensorSource | CheckpointSource,
    prefix: str = "",
    tensor_parallel_size: int = 1,
    tensor_parallel_rank: int = 0,
) -> None:
    """Load every parameter of ``layer`` from ``source`` under ``prefix + name`` (our own
    naming, Paddle layout), checking names and shapes.

    The checkpoint holds full tensors. With ``tensor_parallel_size > 1`` each parameter that
    ``layer`` declares sharded (:func:`~fastdeploy_mtp.models.parallel_layers.shard_axes`) is
    cut into ``tensor_parallel_size`` equal pieces along its axis and piece
    ``tensor_parallel_rank`` is loaded; the others are loaded whole.
    """
    from .parallel_layers import shard_axes

    src = source if isinstance(source, TensorSource) else TensorSource(source)
    params = dict(layer.named_parameters())
    axes = shard_axes(layer) if tensor_parallel_size > 1 else {}
    for name, param in params.items():
        ckpt = prefix + name
        full_shape = list(param.shape)
        axis = axes.get(name)
        if axis is not None:
            full_shape[axis] *= tensor_parallel_size
        if ckpt not in src:
            raise MissingTensorError(
                f"checkpoint {src.description} has no tensor {ckpt!r} (expected shape {full_shape})"
            )
        arr = src.get(ckpt)
        if list(arr.shape) != full_shape:
            raise TensorShapeError(
                f"checkpoint tensor {ckpt!r} has shape {list(arr.shape)}, expected {full_shape}"
            )
        if axis is not None:
            arr = np.split(arr, tensor_parallel_size, axis=axis)[tensor_parallel_rank]
        param.set_value(np.ascontiguousarray(arr, dtype=np.float32))


def state_to_numpy(layer: nn.Layer, prefix: str = "") -> dict[str, np.ndarray]:
    """``{prefix + name: float32 array}`` for every parameter of ``layer``."""
    return {
        prefix + n: np.ascontiguousarray(p.numpy().astype(np.float32))
        for n, p in layer.named_parameters()
    }

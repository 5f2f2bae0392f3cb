"""transformers' own modules of a model folder, as the draft-fidelity reference runs them
(torch, float32, eager attention, eval): the target (``*ForCausalLM``, MiMo as Qwen2) and
its MTP layers (transformers' ``MtpModel``, through ``from_pretrained`` wherever transformers
renames the family's released names, filled by name for MiMo and dense ERNIE-4.5).

torch and transformers are imported on first use: they are test dependencies
(``pip install ".[test]"``), not serving ones.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

#: Families whose MTP layers transformers' ``MtpModel.from_pretrained`` loads from the released
#: names (with the tiny folder's layer index pointed at, see :func:`load_mtp`).
_DEEPSEEK_LAYOUT = ("llama", "qwen2", "qwen3", "deepseek_v3", "glm4_moe")
#: MiMo's own MTP names -> transformers' ``MtpLayer`` names (transformers has no renaming for them).
_MIMO_NAMES = {"token_layernorm": "enorm", "hidden_layernorm": "hnorm", "input_proj": "eh_proj"}


class ReferenceUnavailable(RuntimeError):
    """torch/transformers are missing, or the folder is of a family the reference cannot run;
    the message says which."""


def import_transformers() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ReferenceUnavailable(
            f"the transformers reference needs torch and transformers ({exc.name} is missing): "
            'pip install ".[test]" in a clone of the repository'
        ) from None
    return torch, transformers


def quiet(transformers: Any) -> None:
    transformers.logging.set_verbosity_error()
    with contextlib.suppress(Exception):
        transformers.utils.logging.disable_progress_bar()


def load_target(path: str, raw: dict[str, Any], family: str, torch: Any, transformers: Any) -> Any:
    kwargs: dict[str, Any] = dict(dtype=torch.float32, attn_implementation="eager")
    arch = raw["architectures"][0]
    if family == "mimo":  # a Qwen2 model with MiMo's MTP names
        fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures")}
        kwargs["config"] = transformers.Qwen2Config(**fields)
        arch = "Qwen2ForCausalLM"
    cls = getattr(transformers, arch, None)
    if cls is None:
        raise ReferenceUnavailable(f"transformers {transformers.__version__} has no class {arch}")
    return cls.from_pretrained(path, **kwargs).eval()


def set_mtp_keys(target: Any, num_mtp_layers: int, hidden_states_first: bool = False) -> None:
    """Give ``target``'s config the keys transformers' ``MtpModel`` reads: the number of MTP
    layers, each of full attention, and (``hidden_states_first``) MiMo's concat order."""
    cfg = target.config
    cfg.num_mtp_layers = num_mtp_layers
    cfg.mtp_layer_types = ["full_attention"] * num_mtp_layers
    if hidden_states_first:
        cfg.mtp_hidden_states_first = True


def new_mtp_model(target: Any, num_mtp_layers: int, hidden_states_first: bool = False) -> Any:
    """A fresh transformers ``MtpModel`` of ``num_mtp_layers`` layers over ``target``
    (:func:`set_mtp_keys`), with eager attention; its weights as ``MtpModel`` made them."""
    from transformers.modeling_layers import MtpModel

    set_mtp_keys(target, num_mtp_layers, hidden_states_first)
    mtp = MtpModel(target, num_mtp_layers)
    mtp.config._attn_implementation = "eager"
    return mtp


def load_mtp(path: str, family: str, target: Any, n_mtp: int) -> Any:
    """transformers' ``MtpModel`` over ``target`` with the folder's MTP weights: through
    ``MtpModel.from_pretrained`` (transformers' own renames of the released names) wherever
    transformers maps the family's names, by name for MiMo and dense ERNIE-4.5 (transformers
    has no renames for them)."""
    from transformers.modeling_layers import MtpModel

    if family in ("mimo", "ernie4_5"):
        mtp = new_mtp_model(target, n_mtp, hidden_states_first=family == "mimo")
        _load_by_names(path, mtp, _mimo_name if family == "mimo" else _ernie_name)
    elif family in _DEEPSEEK_LAYOUT or family == "ernie4_5_moe":
        set_mtp_keys(target, n_mtp)
        if family in _DEEPSEEK_LAYOUT:
            # transformers ignores the MTP layers of the released index (61 for DeepSeek-V3,
            # 92 for GLM-4.5); a folder of another depth holds them at num_hidden_layers + k
            n = int(target.config.num_hidden_layers)
            target._keys_to_ignore_on_load_unexpected = [
                rf"model\.layers\.{n + k}\." for k in range(n_mtp)
            ]
        mtp = MtpModel.from_pretrained(target)
    else:
        raise ReferenceUnavailable(f"the transformers reference does not run {family} MTP layers")
    mtp = mtp.float().eval()
    mtp.config._attn_implementation = "eager"
    return mtp


def _mimo_name(k: str, rest: str) -> str:
    """The MiMo checkpoint name of ``MtpModel`` parameter ``layers.{k}.{rest}``."""
    head, _, tail = rest.partition(".")
    if rest.startswith("mtp_block."):
        ckpt = rest[len("mtp_block.") :]
    elif head == "post_norm":
        ckpt = f"final_layernorm.{tail}"
    else:
        ckpt = f"{next(o for o, t in _MIMO_NAMES.items() if t == head)}.{tail}"
    return f"model.mtp_layers.{k}.{ckpt}"


def _ernie_name(k: str, rest: str) -> str:
    """The ERNIE-4.5 ("-PT") checkpoint name of ``MtpModel`` parameter ``layers.{k}.{rest}``;
    the final norm is the target's ``model.norm``."""
    head, _, tail = rest.partition(".")
    if head == "mtp_block":
        return f"model.mtp_block.{k}.{tail}"
    if head == "post_norm":
        return f"model.norm.{tail}"
    own = {"enorm": "mtp_emb_norm", "hnorm": "mtp_hidden_norm", "eh_proj": "mtp_linear_proj"}[head]
    return f"model.{own}.{k}.{tail}"


def _load_by_names(path: str, mtp: Any, name_of: Any) -> None:
    """Fill ``mtp``'s layers from the folder's safetensors, ``name_of(k, rest)`` naming the
    checkpoint tensor of parameter ``layers.{k}.{rest}``."""
    from safetensors.torch import load_file

    wanted: dict[str, str] = {}
    for name, _ in mtp.named_parameters():
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        if m is not None:
            wanted[name_of(m.group(1), m.group(2))] = name
    state: dict[str, Any] = {}
    for file in sorted(os.listdir(path)):
        if file.endswith(".safetensors"):
            for name, tensor in load_file(os.path.join(path, file)).items():
                if name in wanted:
                    state[wanted[name]] = tensor.float()
    missing = sorted(set(wanted.values()) - set(state))
    if missing:
        raise ReferenceUnavailable(f"{path}: MTP tensors missing: {missing[:3]}")
    mtp.load_state_dict(state, strict=False)

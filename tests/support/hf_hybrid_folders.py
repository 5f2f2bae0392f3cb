"""Tiny random Qwen3-Next (``Qwen3NextForCausalLM``) and Qwen3.5 text (``Qwen3_5ForCausalLM``)
folders built with transformers' own classes, and the MTP reference composed from
transformers' modules (transformers loads these models but ignores ``mtp.*``).

A folder holds what a released checkpoint holds: ``config.json`` (Qwen3-Next:
``num_nextn_predict_layers``; Qwen3.5: ``mtp_num_hidden_layers``), the target saved by
``save_pretrained`` (experts written per expert), ``generation_config.json``, and the MTP
tensors under ``mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm, layers.{k}.*}``.

:class:`MtpReference` is the MTP layer as vLLM runs it: ``fc(cat[pre_fc_norm_embedding(emb),
pre_fc_norm_hidden(h)])`` with ``h`` the target's hidden state after its final norm, then
transformers' own full-attention decoder layer (``Qwen3NextDecoderLayer`` /
``Qwen3_5DecoderLayer``), then ``norm``; the target's embedding and LM head.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.hf_folders import _quiet, split_experts
from tests.support.hf_writing import fill_tensors, save_into_single_file

FAMILIES = ("qwen3_next", "qwen3_5")


def _config(family: str, layers: int, mtp_layers: int):
    import transformers

    _quiet()
    common = dict(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
        linear_conv_kernel_dim=4, max_position_embeddings=256, rms_norm_eps=1e-6,
        eos_token_id=2, tie_word_embeddings=False,
        layer_types=["linear_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
    )  # fmt: skip
    if family == "qwen3_next":
        cfg = transformers.Qwen3NextConfig(
            **common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, decoder_sparse_step=1, norm_topk_prob=True,
        )  # fmt: skip
    else:
        cfg = transformers.Qwen3_5TextConfig(**common)
    cfg._attn_implementation = "eager"
    return cfg


class _MtpModules:
    """The released MTP modules (torch): ``fc``, the three norms and ``layers``."""

    def __init__(self, family: str, cfg, count: int):
        import torch.nn as nn

        if family == "qwen3_next":
            from transformers.models.qwen3_next import modeling_qwen3_next as m

            norm, layer = m.Qwen3NextRMSNorm, m.Qwen3NextDecoderLayer
        else:
            from transformers.models.qwen3_5 import modeling_qwen3_5 as m

            norm, layer = m.Qwen3_5RMSNorm, m.Qwen3_5DecoderLayer
        full = copy.deepcopy(cfg)
        full.layer_types = ["full_attention"] * max(count, cfg.num_hidden_layers)
        h = cfg.hidden_size
        self.module = nn.ModuleDict(
            dict(
                fc=nn.Linear(2 * h, h, bias=False),
                pre_fc_norm_embedding=norm(h, eps=cfg.rms_norm_eps),
                pre_fc_norm_hidden=norm(h, eps=cfg.rms_norm_eps),
                norm=norm(h, eps=cfg.rms_norm_eps),
                layers=nn.ModuleList([layer(full, k) for k in range(count)]),
            )
        ).eval()


def make_hybrid_folder(
    out_dir: str | Path, family: str = "qwen3_next", *, layers: int = 4, mtp_layers: int = 1,
    seed: int = 0,
) -> Path:  # fmt: skip
    """Write a tiny random folder of ``family`` (``"qwen3_next"``: 4 experts top-2 with a
    gated shared expert on every layer; ``"qwen3_5"``: dense), hidden 64, ``layers`` layers
    alternating linear and full attention, 2 key and 4 value heads of 16 / 24 in the linear
    layers, 4 query / 2 key-value heads of 32 with partial rotary 0.25, every tensor set from
    ``seed``; returns the folder."""
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = _config(family, layers, mtp_layers)
    torch.manual_seed(seed)
    cls = (
        transformers.Qwen3NextForCausalLM
        if family == "qwen3_next"
        else transformers.Qwen3_5ForCausalLM
    )
    target = cls(cfg).eval()
    rng = np.random.default_rng([seed, 45])
    fill_tensors(target.named_parameters(), rng)
    target.save_pretrained(str(out), safe_serialization=True)
    if mtp_layers:
        mtp = _MtpModules(family, cfg, mtp_layers).module
        fill_tensors(mtp.named_parameters(), rng)
        tensors: dict[str, Any] = {}
        for name, t in mtp.named_parameters():
            tensors.update(split_experts("mtp." + name, t.detach()))
        save_into_single_file(out, {k: v.contiguous() for k, v in tensors.items()})
    path = out / "config.json"
    config = json.loads(path.read_text())
    key = "num_nextn_predict_layers" if family == "qwen3_next" else "mtp_num_hidden_layers"
    config[key] = mtp_layers
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [2]}) + "\n")
    return out


class HybridReference:
    """transformers' target of a folder and the MTP reference (module doc), float32 CPU."""

    def __init__(self, folder: str | Path):
        import torch
        import transformers
        from safetensors.torch import load_file

        config = json.loads((Path(folder) / "config.json").read_text())
        family = "qwen3_next" if config["model_type"] == "qwen3_next" else "qwen3_5"
        cls = (
            transformers.Qwen3NextForCausalLM
            if family == "qwen3_next"
            else transformers.Qwen3_5ForCausalLM
        )
        _quiet()
        self.target = cls.from_pretrained(str(folder), dtype=torch.float32).eval()
        self.target.config._attn_implementation = "eager"
        count = config.get("num_nextn_predict_layers", config.get("mtp_num_hidden_layers", 0))
        self.mtp = _MtpModules(family, self.target.config, count).module
        saved = load_file(str(Path(folder) / "model.safetensors"))
        own = {k[len("mtp.") :]: v for k, v in saved.items() if k.startswith("mtp.")}
        self.mtp.load_state_dict(_fuse_experts(own, self.mtp.state_dict()), strict=True)

    def logits_and_hidden(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Target logits ``[S, V]`` and the last hidden state after the final norm ``[S, H]``."""
        import torch

        with torch.no_grad():
            out = self.target(input_ids=torch.tensor([ids]), output_hidden_states=True)
        return out.logits[0].float().numpy(), out.hidden_states[-1][0].float().numpy()

    def mtp_logits(self, next_ids: list[int], hidden: np.ndarray, layer: int = 0) -> np.ndarray:
        """MTP layer ``layer``'s logits ``[S, V]``: row ``p`` fed ``next_ids[p]`` and
        ``hidden[p]`` at position ``p`` (causal over the rows)."""
        import torch

        s = len(next_ids)
        with torch.no_grad():
            emb = self.target.model.embed_tokens(torch.tensor([next_ids]))
            h = torch.from_numpy(np.asarray(hidden, np.float32))[None]
            x = self.mtp["fc"](
                torch.cat(
                    [self.mtp["pre_fc_norm_embedding"](emb), self.mtp["pre_fc_norm_hidden"](h)], -1
                )
            )
            positions = torch.arange(s)[None]
            rope = self.target.model.rotary_emb(x, positions)
            mask = torch.full((s, s), float("-inf")).triu(1)[None, None]
            x = self.mtp["layers"][layer](
                x, position_embeddings=rope, attention_mask=mask, position_ids=positions
            )
            return self.target.lm_head(self.mtp["norm"](x))[0].float().numpy()


def _fuse_experts(own: dict[str, Any], like: dict[str, Any]) -> dict[str, Any]:
    """Per-expert MTP tensors fused back into the module's ``experts.gate_up_proj`` /
    ``experts.down_proj`` where it has them."""
    import torch

    out = {k: v for k, v in own.items() if ".experts." not in k}
    for name in like:
        if name.endswith("experts.gate_up_proj"):
            base, e = name[: -len("gate_up_proj")], like[name].shape[0]
            out[name] = torch.stack(
                [
                    torch.cat(
                        [own[f"{base}{i}.gate_proj.weight"], own[f"{base}{i}.up_proj.weight"]]
                    )
                    for i in range(e)
                ]
            )
        elif name.endswith("experts.down_proj"):
            base, e = name[: -len("down_proj")], like[name].shape[0]
            out[name] = torch.stack([own[f"{base}{i}.down_proj.weight"] for i in range(e)])
    return out

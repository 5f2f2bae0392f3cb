"""Model shapes for scripts/train_tiny.py: ``--arch tiny`` (the shipped dense byte model:
GQA attention, SwiGLU MLP) or ``--arch deepseek_v3`` (multi-head latent attention and a
mixture-of-experts MLP, exported as a released ``DeepseekV3ForCausalLM`` folder).

The DeepSeek-V3 router is the sigmoid ``noaux_tc`` one with its correction bias frozen at 0:
the bias is DeepSeek's auxiliary-loss-free balancing term, updated outside the gradient by a
load-tracking rule; with it frozen the router is a plain sigmoid top-k gate that learns
through the combine weights (the selected experts' scores scale their outputs), and serving
routes exactly as training did (the exported bias is 0).
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import paddle

from fastdeploy_mtp.models import ModelConfig, causal_bias, tiny as tiny_lib

ARCHS = ("tiny", "deepseek_v3")


def add_arch_args(p: argparse.ArgumentParser) -> None:
    """The ``--arch`` flag and the MLA / MoE shape flags (used with ``--arch deepseek_v3``)."""
    p.add_argument(
        "--arch", default="tiny", choices=ARCHS, help="dense tiny model or DeepSeek-V3 (MLA + MoE)"
    )
    g = p.add_argument_group("deepseek_v3 shape (MLA attention, MoE MLP)")
    g.add_argument("--q-lora-rank", type=int, default=0, help="0 = a plain q_proj")
    g.add_argument("--kv-lora-rank", type=int, default=64)
    g.add_argument("--qk-nope-head-dim", type=int, default=32)
    g.add_argument("--qk-rope-head-dim", type=int, default=16)
    g.add_argument("--v-head-dim", type=int, default=32)
    g.add_argument("--experts", type=int, default=4, help="routed experts (n_routed_experts)")
    g.add_argument("--experts-per-tok", type=int, default=2)
    g.add_argument("--moe-intermediate-size", type=int, default=128)
    g.add_argument("--shared-experts", type=int, default=1)
    g.add_argument("--first-k-dense-replace", type=int, default=1, help="leading dense layers")
    g.add_argument("--n-group", type=int, default=1)
    g.add_argument("--topk-group", type=int, default=1)
    g.add_argument("--routed-scaling-factor", type=float, default=1.0)


#: Flags that fix the model's shape: a checkpoint resumes only under the same values.
ARCH_SHAPE_KEYS = (
    "arch",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "experts",
    "experts_per_tok",
    "moe_intermediate_size",
    "shared_experts",
    "first_k_dense_replace",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
)

#: DeepSeek-V3 config fields set from the flag of the same name.
SAME_NAME_FIELDS = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "moe_intermediate_size",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "first_k_dense_replace",
)


def with_eot(config: ModelConfig, args: argparse.Namespace) -> ModelConfig:
    """``config`` with ``--eot-id`` as its EOS id and inside its real vocabulary
    (``ori_vocab_size`` grown past it), or unchanged with ``--eot-id -1``."""
    if args.eot_id < 0:
        return config
    if args.eot_id >= config.vocab_size:
        raise SystemExit(f"--eot-id {args.eot_id} is outside the vocabulary ({config.vocab_size})")
    return dataclasses.replace(
        config,
        ori_vocab_size=max(config.ori_vocab_size, args.eot_id + 1),
        eos_token_ids=[args.eot_id],
    )


def build_config(args: argparse.Namespace) -> ModelConfig:
    """The :class:`ModelConfig` of a fresh model from the parsed flags (byte vocabulary:
    256 ids, then ``--eot-id`` unless it is -1, padded to ``--vocab-size``)."""
    return with_eot(_shape_config(args), args)


def _shape_config(args: argparse.Namespace) -> ModelConfig:
    common = dict(
        vocab_size=args.vocab_size,
        ori_vocab_size=256,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.intermediate_size,
        mtp_hidden_state=args.mtp_hidden_state,
        max_position_embeddings=4096,
        num_nextn_predict_layers=args.mtp_layers,
    )
    if args.arch == "tiny":
        return ModelConfig(num_key_value_heads=args.kv_heads, **common)
    return ModelConfig(
        model_type="deepseek_v3",
        num_key_value_heads=args.heads,
        head_dim=args.qk_rope_head_dim,
        attention_type="mla",
        rope_interleave=True,
        n_routed_experts=args.experts,
        num_experts_per_tok=args.experts_per_tok,
        n_shared_experts=args.shared_experts,
        norm_topk_prob=True,
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        mtp_mask_first_position=True,
        **{field: getattr(args, field) for field in SAME_NAME_FIELDS},
        **common,
    )


def freeze_router_bias(*models: paddle.nn.Layer) -> None:
    """Keep every MoE router's ``e_score_correction_bias`` out of training (see the module doc)."""
    for model in models:
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.stop_gradient = True


@paddle.no_grad()
def expert_load(
    target: paddle.nn.Layer, mtp: paddle.nn.Layer, ids: np.ndarray
) -> dict[str, list[float]]:
    """Share of routed slots each expert gets, per MoE layer, on ``ids [B, S]``: the target's
    MoE layers on the dense path (``target.layers.{i}``) and the MTP layers' blocks fed the
    target's hidden states (``mtp...``). Empty for a dense model."""
    out: dict[str, list[float]] = {}
    seen: list[tuple[str, paddle.nn.Layer]] = []
    for prefix, model in (("target.", target), ("mtp.", mtp)):
        for name, layer in model.named_sublayers():
            if type(layer).__name__ == "MoEGate" and not name.startswith("_target"):
                seen.append((prefix + name, layer))
    if not seen:
        return out
    hooks = []
    for name, gate in seen:

        def record(layer, inputs, outputs, name=name):
            counts = np.bincount(outputs[1].numpy().reshape([-1]), minlength=layer.weight.shape[1])
            out[name] = [round(float(c), 4) for c in counts / max(1, counts.sum())]

        hooks.append(gate.register_forward_post_hook(record))
    try:
        tensor = paddle.to_tensor(ids.astype(np.int64))
        pre, post = target.forward_dense(tensor, causal_bias(int(ids.shape[1])))
        for layer in getattr(mtp, "layers", [mtp]):
            layer.forward_dense(
                tensor[:, 1:], target.mtp_hidden(pre, post)[:, :-1], causal_bias(ids.shape[1] - 1)
            )
    finally:
        for h in hooks:
            h.remove()
    return out


def save_folder(out_dir: str, target, mtp, config: ModelConfig, metrics: dict | None) -> None:
    """Write the model folder: the tiny layout for the dense model, the released DeepSeek-V3
    layout (:func:`~fastdeploy_mtp.models.folder_writer.save_model_folder`) otherwise; both
    with the byte tokenizer and ``metrics.json``."""
    if config.model_type == "deepseek_v3":
        from fastdeploy_mtp.models.folder_writer import save_model_folder

        save_model_folder(out_dir, target, mtp, config, metrics=metrics)
    else:
        tiny_lib.save_tiny(out_dir, target, mtp, config, metrics)


def stage1_loss_text(ta: dict) -> str:
    """The card's sentence on the first stage's loss, from its training arguments ``ta``."""
    depth, w = ta.get("mtp_depth", 1), ta["mtp_weight"]
    if depth == 1 and not ta.get("distill"):
        return f"Loss = CE(next byte) + {w} x CE(MTP layer's byte after next), teacher forced."
    against = (
        "soft cross-entropy against the target's own (detached) next-token distribution at that "
        "position"
        if ta.get("distill")
        else "cross-entropy against the text"
    )
    return (
        f"Loss = CE(next byte) + {w} x the sum over depths 1..{depth} of the MTP loss: the MTP "
        f"layer is unrolled for {depth} substeps on its own hidden states, as the proposer runs "
        f"it, and depth k (scoring the token k + 1 ahead) uses {against}; target and MTP layer "
        "train together."
    )


def stage1_command_keys(ta: dict) -> tuple[str, ...]:
    """The flags the card's first-stage command line shows."""
    keys: tuple[str, ...] = ("seed", "batch_size", "seq_len", "max_steps", "wall_budget_min")
    if ta.get("arch", "tiny") != "tiny":
        keys += ("lr", "warmup_steps", "mtp_depth", "distill", "mtp_weight") + ARCH_SHAPE_KEYS
    return keys


def deepseek_model_lines(
    config: ModelConfig, m: dict, weights_bytes: int, cfg_rows: str
) -> list[str]:
    """The card's title, files and model sections for a DeepSeek-V3-architecture folder."""
    dense = config.first_k_dense_replace
    moe = config.num_hidden_layers - dense
    load = m.get("expert_load", {})
    load_rows = [
        f"| `{name}` | {' / '.join(f'{x:.2f}' for x in shares)} |"
        for name, shares in sorted(load.items())
    ]
    return [
        "# Tiny byte-level DeepSeek-V3-architecture model (MLA + MoE) + MTP layer",
        "",
        "A released-layout `DeepseekV3ForCausalLM` folder trained on the byte corpus below, so "
        "that multi-head latent attention, the latent paged cache, the mixture-of-experts MLP and "
        "DeepSeek's MTP layer can be served and measured end to end on a CPU. Load it with "
        "`fastdeploy_mtp.models.load_model(DIR)` (or transformers' `DeepseekV3ForCausalLM`, which "
        "ignores the MTP layer's tensors); tokens are bytes, ids 0..255"
        + (
            f", and id {config.eos_token_ids[0]} is `<|endoftext|>`, which ends an answer (the EOS "
            "id)"
            if config.eos_token_ids
            else ""
        )
        + " (`tokenizer.json`).",
        "",
        f"Files: `model.safetensors` (float32, {weights_bytes / 1e6:.2f} MB, HF names and torch "
        "`[out, in]` layout: `model.embed_tokens`, `model.layers.{i}.*` with per-expert "
        "`mlp.experts.{e}.{gate,up,down}_proj` and the router `mlp.gate.weight` / "
        "`e_score_correction_bias`, `model.norm`, `lm_head`, and the MTP layer at "
        f"`model.layers.{config.num_hidden_layers}.{{enorm, hnorm, eh_proj, shared_head.norm, "
        "embed_tokens, shared_head.head, <block>}`), `config.json` (DeepSeek-V3 keys), "
        "`tokenizer.json` + `tokenizer_config.json` (the byte tokenizer), `metrics.json` (every "
        "number below). Written by `fastdeploy_mtp.models.folder_writer.save_model_folder`.",
        "",
        "## Model",
        "",
        f"Target: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads of multi-head latent attention ("
        + (f"q LoRA rank {config.q_lora_rank}" if config.q_lora_rank else "plain `q_proj`")
        + f", kv LoRA rank {config.kv_lora_rank}, nope/rope/v head dims {config.qk_nope_head_dim}/"
        f"{config.qk_rope_head_dim}/{config.v_head_dim}, interleaved RoPE theta "
        f"{config.rope_theta:g}); {dense} dense SwiGLU layer(s) ({config.intermediate_size}) then "
        f"{moe} MoE layer(s): {config.n_routed_experts} routed experts "
        f"({config.moe_intermediate_size} each), top {config.num_experts_per_tok} by a sigmoid "
        "router (`noaux_tc`, correction bias frozen at 0 in training, so exported as 0), weights "
        f"renormalised and scaled by {config.routed_scaling_factor:g}, plus "
        f"{config.n_shared_experts} shared expert(s). RMSNorm, untied LM head. Trained with the "
        f"vocabulary padded to {config.vocab_size} (padded columns -inf); the folder holds the "
        f"{config.ori_vocab_size} real rows. MTP layer: DeepSeek's `enorm`/`hnorm`/`eh_proj` "
        "fusion (token embedding zeroed at position 0), one decoder block of the MoE shape, "
        f"`shared_head.norm`; embedding and head shared with the target. Parameters: {m['params']} "
        "(target + MTP, shared ones once, padded vocabulary).",
        "",
        "| field | value |",
        "|---|---|",
        cfg_rows,
        "",
        *(
            [
                "Expert load (share of routed slots per expert, 64 held-out windows; the MTP "
                "block fed the target's hidden states):",
                "",
                "| router | shares |",
                "|---|---|",
                *load_rows,
                "",
            ]
            if load_rows
            else []
        ),
    ]


def extra_limitations(m: dict) -> list[str]:
    """Card bullets that qualify a DeepSeek-V3 run's serving acceptance: greedy decoding of a
    model this small soon repeats one byte, which any drafter predicts, so the engine's figure
    is set beside the teacher-forced chained agreement (``1 + sum of accept``) on the target's
    own continuations and on held-out corpus text."""
    dt = m.get("depth_teacher_forced")
    if not dt:
        return []
    own, corpus = (1 + sum(dt[k]["accept"]) for k in ("generated", "corpus"))
    return [
        "- The serving acceptance is flattered by degenerate greedy output: the greedy "
        "continuations above collapse into one repeated byte within a few tokens, and a repeated "
        "byte is easy to draft. The teacher-forced chained agreement gives the drafter's quality "
        f"on text that does not repeat: 1 + the sum of `accept` over the three depths is {own:.2f} "
        f"on the target's own continuations and {corpus:.2f} on held-out corpus windows (what the "
        "mean accepted length at K = 3 would be if the target's argmax were that text).",
    ]

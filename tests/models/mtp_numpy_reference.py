"""Direct numpy (float64) computation of the target model and MTP layer math, written
independently of the Paddle modules, for the tests in this directory.

Weights are dicts of numpy arrays in Paddle ``[in, out]`` layout using our parameter names.
"""

import numpy as np


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, theta):
    """x [S, heads, hd] rotated at ``positions`` [S] (rotate-half layout)."""
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2) / hd)
    ang = positions[:, None] * inv[None, :]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    half = hd // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def attention(x, w, prefix, cfg, positions):
    """Causal GQA self-attention over one full sequence ``x [S, H]``."""
    s = x.shape[0]
    nh, kvh, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = x @ w[prefix + "q_proj.weight"]
    k = x @ w[prefix + "k_proj.weight"]
    v = x @ w[prefix + "v_proj.weight"]
    if cfg.attention_bias:
        q = q + w[prefix + "q_proj.bias"]
        k = k + w[prefix + "k_proj.bias"]
        v = v + w[prefix + "v_proj.bias"]
    q = rope(q.reshape(s, nh, hd), positions, cfg.rope_theta)
    k = rope(k.reshape(s, kvh, hd), positions, cfg.rope_theta)
    v = v.reshape(s, kvh, hd)
    g = nh // kvh
    out = np.zeros((s, nh, hd))
    mask = np.triu(np.ones((s, s), bool), 1)
    for h in range(nh):
        scores = q[:, h] @ k[:, h // g].T / np.sqrt(hd)
        scores[mask] = -np.inf
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[:, h] = p @ v[:, h // g]
    return out.reshape(s, nh * hd) @ w[prefix + "o_proj.weight"]


def swiglu(x, w, prefix):
    gate = x @ w[prefix + "gate_proj.weight"]
    up = x @ w[prefix + "up_proj.weight"]
    return (gate / (1 + np.exp(-gate)) * up) @ w[prefix + "down_proj.weight"]


def decoder_layer(x, w, prefix, cfg, positions):
    h = x + attention(
        rmsnorm(x, w[prefix + "input_layernorm.weight"], cfg.rms_norm_eps),
        w,
        prefix + "self_attn.",
        cfg,
        positions,
    )
    return h + swiglu(
        rmsnorm(h, w[prefix + "post_attention_layernorm.weight"], cfg.rms_norm_eps),
        w,
        prefix + "mlp.",
    )


def target_hidden(ids, w, cfg):
    """Hidden states [S, H] the target's forward returns for one full sequence."""
    x = w["embed_tokens.weight"][ids]
    pos = np.arange(len(ids), dtype=np.float64)
    for i in range(cfg.num_hidden_layers):
        x = decoder_layer(x, w, f"layers.{i}.", cfg, pos)
    if cfg.mtp_hidden_state == "post_norm":
        x = rmsnorm(x, w["norm.weight"], cfg.rms_norm_eps)
    return x


def mtp_hidden(next_ids, prev_hidden, w, emb, cfg, positions=None):
    """MTP layer output [S, H] for tokens ``next_ids`` [S] and target hidden [S, H]."""
    e = rmsnorm(emb[next_ids], w["enorm.weight"], cfg.rms_norm_eps)
    h = rmsnorm(prev_hidden, w["hnorm.weight"], cfg.rms_norm_eps)
    cat = np.concatenate([e, h] if cfg.mtp_concat_order == "emb_first" else [h, e], -1)
    x = cat @ w["eh_proj.weight"]
    pos = np.arange(len(next_ids), dtype=np.float64) if positions is None else positions
    x = decoder_layer(x, w, "mtp_block.", cfg, pos)
    if cfg.mtp_final_norm == "in_forward":
        x = rmsnorm(x, w["norm.weight"], cfg.rms_norm_eps)
    return x


def mtp_logits(hidden, w, head, cfg):
    if cfg.mtp_final_norm == "in_logits":
        hidden = rmsnorm(hidden, w["norm.weight"], cfg.rms_norm_eps)
    logits = hidden @ head
    logits[:, cfg.ori_vocab_size :] = -np.inf
    return logits

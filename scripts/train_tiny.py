#!/usr/bin/env python
"""Train the tiny byte-level target model and its MTP layer on the Python stdlib sources.

Seeded and resumable: every ``--ckpt-every-sec`` seconds the model, optimizer, step, data
RNG state and elapsed training wall time are written to ``--run-dir/ckpt.pdckpt``; rerunning
the same command resumes from there. Training stops at ``--max-steps`` or after
``--wall-budget-min`` minutes of training wall time (summed across resumes), whichever is
first. ``--export DIR`` then writes ``model.safetensors``, ``config.json`` and ``metrics.json``
(held-out evaluation) into DIR.

Loss = CE(next token) + ``--mtp-weight`` * CE(MTP layer's token-after-next), where the MTP
layer at position p gets (embedding of t_{p+1}, target hidden h_p) and predicts t_{p+2}.

Example::

    OMP_NUM_THREADS=1 python scripts/train_tiny.py --run-dir /work/train_run \
        --wall-budget-min 55 --max-steps 5000 --export fastdeploy_mtp/assets
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastdeploy_mtp.models import (  # noqa: E402
    ModelConfig,
    MTPLayer,
    TinyTargetModel,
    causal_bias,
    corpus as corpus_lib,  # noqa: E402
    tiny as tiny_lib,  # noqa: E402
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True, help="checkpoints and log go here")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--max-steps", type=int, default=5000)
    p.add_argument(
        "--wall-budget-min",
        type=float,
        default=55.0,
        help="stop after this many minutes of training wall time (all resumes)",
    )
    p.add_argument("--ckpt-every-sec", type=float, default=180.0)
    p.add_argument("--eval-every", type=int, default=500, help="steps between quick evals")
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=352)
    p.add_argument("--vocab-size", type=int, default=272, help="padded vocab (>= 256)")
    p.add_argument("--mtp-hidden-state", default="post_norm", choices=["post_norm", "pre_norm"])
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=200)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--mtp-weight", type=float, default=1.0)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--export", default=None, help="write the trained checkpoint here at the end")
    p.add_argument("--eval-only", action="store_true", help="skip training (resume + export)")
    p.add_argument("--card-note", default="", help="free-text note about the run (restarts, load) added to the card")
    p.add_argument(
        "--export-eval-windows",
        type=int,
        default=None,
        help="evaluate the export on this many held-out windows (smoke tests); default: all of them",
    )
    return p.parse_args(argv)


def _structure(opt_state, named):
    """Key optimizer state by structural parameter names instead of Paddle's process-global
    unique names (``linear_3.w_0``), which differ when models are built more than once in a
    process."""
    out = {}
    for key, value in opt_state.items():
        for structural, unique in named:
            if key.startswith(unique + "_"):
                key = structural + "::" + key[len(unique) + 1 :]
                break
        out[key] = value
    return out


def _unstructure(opt_state, named):
    lookup = dict(named)
    out = {}
    for key, value in opt_state.items():
        if "::" in key:
            structural, rest = key.split("::", 1)
            key = lookup[structural] + "_" + rest
        out[key] = value
    return out


def lr_at(step: int, args) -> float:
    """Linear warmup, then cosine from ``lr`` to ``lr * min_lr_ratio`` at ``max_steps``."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    frac = min(1.0, (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps))
    ratio = args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + np.cos(np.pi * frac))
    return float(args.lr * ratio)


def losses(target, mtp, ids, bias, mtp_weight):
    """``ids [B, S]`` int64 -> ``(total loss, main CE [B, S-1, 1], MTP CE [B, S-2, 1],
    main logits [B, S-1, V], MTP logits [B, S-2, V])``. MTP row p pairs token p+1 with the
    target hidden state at p and is scored on token p+2."""
    pre, post = target.forward_dense(ids, bias)
    hidden = target.mtp_hidden(pre, post)
    logits = target.compute_logits(hidden)  # [B, S, V]
    main_ce = F.cross_entropy(logits[:, :-1], ids[:, 1:].unsqueeze(-1))
    mtp_h = mtp.forward_dense(ids[:, 1:-1], hidden[:, :-2], bias)  # predicts ids[:, 2:]
    mtp_logits = mtp.compute_logits(mtp_h)
    mtp_ce = F.cross_entropy(mtp_logits, ids[:, 2:].unsqueeze(-1))
    total = main_ce.mean() + mtp_weight * mtp_ce.mean()
    return total, main_ce, mtp_ce, logits[:, :-1], mtp_logits


def log(run_dir, msg):
    line = time.strftime("%H:%M:%S ") + msg
    print(line, flush=True)
    with open(os.path.join(run_dir, "train.log"), "a", encoding="utf-8") as f:
        f.write(line + "\n")


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.run_dir, exist_ok=True)
    if hasattr(paddle, "set_num_threads"):
        paddle.set_num_threads(args.threads)
    paddle.set_device("cpu")
    paddle.seed(args.seed)
    np.random.seed(args.seed)

    config = ModelConfig(
        vocab_size=args.vocab_size,
        ori_vocab_size=256,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        intermediate_size=args.intermediate_size,
        mtp_hidden_state=args.mtp_hidden_state,
        max_position_embeddings=4096,
    )
    target = TinyTargetModel(config)
    mtp = MTPLayer(config, target)
    params = list(target.parameters()) + list(mtp.parameters())
    named = [("target." + n, p.name) for n, p in target.named_parameters()] + [
        ("mtp." + n, p.name) for n, p in mtp.named_parameters()
    ]
    n_params = sum(int(np.prod(p.shape)) for p in params)
    no_decay = {p.name for p in params if len(p.shape) == 1}
    opt = paddle.optimizer.AdamW(
        learning_rate=args.lr,
        parameters=params,
        weight_decay=args.weight_decay,
        beta1=0.9,
        beta2=0.95,
        apply_decay_param_fun=lambda name: name not in no_decay,
        grad_clip=paddle.nn.ClipGradByGlobalNorm(args.grad_clip),
    )

    split = corpus_lib.load_split()
    train = split.train_array()
    rng = np.random.default_rng(args.seed)
    step, elapsed = 0, 0.0
    ckpt_path = os.path.join(args.run_dir, "ckpt.pdckpt")
    if os.path.exists(ckpt_path):
        state = paddle.load(ckpt_path)
        saved = state.get("args", {})
        shape_keys = (
            "hidden_size",
            "layers",
            "heads",
            "kv_heads",
            "intermediate_size",
            "vocab_size",
            "mtp_hidden_state",
            "seq_len",
            "seed",
        )
        changed = [k for k in shape_keys if k in saved and saved[k] != getattr(args, k)]
        if changed:
            raise SystemExit(f"{ckpt_path} was trained with different {changed}: { {k: saved[k] for k in changed} }")
        target.set_state_dict(state["target"])
        mtp.set_state_dict(state["mtp"])
        if "opt_structured" in state:
            opt.set_state_dict(_unstructure(state["opt_structured"], named))
        else:  # written by an older version of this script
            opt.set_state_dict(state["opt"])
        rng.bit_generator.state = state["rng"]
        step, elapsed = int(state["step"]), float(state["elapsed"])
        log(args.run_dir, f"resumed at step {step}, {elapsed:.0f}s of training so far")
    else:
        log(args.run_dir, f"fresh run: {n_params} params, corpus {split.describe()}, args {vars(args)}")

    def save_ckpt():
        state = {
            "target": target.state_dict(),
            "mtp": mtp.state_dict(),
            "opt_structured": _structure(opt.state_dict(), named),
            "rng": rng.bit_generator.state,
            "step": step,
            "elapsed": elapsed,
            "args": vars(args),
        }
        tmp = ckpt_path + ".tmp"
        paddle.save(state, tmp)
        os.replace(tmp, ckpt_path)

    bias = causal_bias(args.seq_len)
    budget = args.wall_budget_min * 60.0
    last_ckpt = time.time()
    seg_start, seg_elapsed0 = time.time(), elapsed
    recent = []
    while not args.eval_only and step < args.max_steps and elapsed < budget:
        t0 = time.time()
        starts = rng.integers(0, len(train) - args.seq_len, size=args.batch_size)
        batch = np.stack([train[s : s + args.seq_len] for s in starts]).astype(np.int64)
        opt.set_lr(lr_at(step, args))
        total, main_ce, mtp_ce, _, _ = losses(target, mtp, paddle.to_tensor(batch), bias, args.mtp_weight)
        total.backward()
        opt.step()
        opt.clear_grad()
        step += 1
        elapsed = seg_elapsed0 + (time.time() - seg_start)
        recent.append((float(main_ce.mean()), float(mtp_ce.mean()), time.time() - t0))
        if step % 50 == 0:
            m = np.mean(recent, axis=0)
            log(
                args.run_dir,
                f"step {step} lr {lr_at(step - 1, args):.2e} main {m[0]:.4f} "
                f"mtp {m[1]:.4f} {1.0 / m[2]:.2f} steps/s elapsed {elapsed:.0f}s",
            )
            recent = []
        if step % args.eval_every == 0:
            quick = tiny_lib.evaluate_dense(target, mtp, split.heldout_array(), args.seq_len, max_windows=256)
            log(args.run_dir, f"eval step {step}: {json.dumps(quick)}")
        if time.time() - last_ckpt > args.ckpt_every_sec:
            save_ckpt()
            last_ckpt = time.time()
    if not args.eval_only:
        save_ckpt()
        log(args.run_dir, f"training stopped at step {step}, {elapsed:.0f}s training wall time")

    if args.export:
        export(args, target, mtp, config, split, step, elapsed, n_params)


#: Held-out file and prefix that the shipped-checkpoint test re-scores.
SCORE_FILE, SCORE_WINDOWS = "contextlib.py", 8
#: Held-out files whose greedy continuations go into the card, and the text each prompt ends
#: with (the first occurrence after byte 4000).
CONTINUATIONS = (("dataclasses.py", b"\n    def "), ("subprocess.py", b"\n        if "))
CONTINUATION_FILES = tuple(name for name, _ in CONTINUATIONS)
PROMPT_BYTES, CONTINUATION_BYTES = 128, 128


def export(args, target, mtp, config, split, step, elapsed, n_params):
    """Evaluate on the held-out split and write the checkpoint, metrics and card."""
    target.eval()
    mtp.eval()
    metrics = {
        "heldout_teacher_forced": tiny_lib.evaluate_dense(
            target, mtp, split.heldout_array(), args.seq_len, max_windows=args.export_eval_windows
        )
    }
    for name in (SCORE_FILE,) + CONTINUATION_FILES:
        if name not in split.heldout_files:
            raise SystemExit(f"{name} is not in the held-out split; pick another file")
    data = np.fromfile(os.path.join(split.root, SCORE_FILE), dtype=np.uint8)
    prefix = data[: args.seq_len * SCORE_WINDOWS].tobytes()
    metrics["fixed_prefix_score"] = {
        "file": SCORE_FILE,
        "window": args.seq_len,
        "windows": SCORE_WINDOWS,
        "bytes": args.seq_len * SCORE_WINDOWS,
        "sha256": hashlib.sha256(prefix).hexdigest(),
        "main_loss": round(tiny_lib.score_windows(target, data, args.seq_len, SCORE_WINDOWS), 6),
        "path": "serving path: one packed prefill batch, paged KV cache",
    }
    conts = []
    for name, ending in CONTINUATIONS:
        with open(os.path.join(split.root, name), "rb") as f:
            text = f.read()
        anchor = text.index(ending, 4000) + len(ending)
        prompt = list(text[anchor - PROMPT_BYTES : anchor])
        new = tiny_lib.greedy_generate(target, prompt, CONTINUATION_BYTES)
        conts.append(
            {
                "file": name,
                "prompt_offset": anchor - PROMPT_BYTES,
                "prompt": bytes(prompt).decode("utf-8", "replace"),
                "continuation": bytes(new).decode("utf-8", "replace"),
                "actual": text[anchor : anchor + CONTINUATION_BYTES].decode("utf-8", "replace"),
            }
        )
    metrics["greedy_continuations"] = conts
    metrics.update(
        {
            "card_note": args.card_note,
            "steps": step,
            "train_wall_time_s": round(elapsed, 1),
            "params": n_params,
            "seed": args.seed,
            "corpus": split.describe(),
            "train_args": {
                k: v
                for k, v in vars(args).items()
                if k not in ("run_dir", "export", "eval_only", "card_note", "export_eval_windows")
            },
        }
    )
    tiny_lib.save_tiny(args.export, target, mtp, config, metrics)
    size = os.path.getsize(os.path.join(args.export, tiny_lib.WEIGHTS_FILE))
    write_card(args.export, config, metrics, size)
    log(
        args.run_dir,
        f"exported to {args.export}: "
        f"{json.dumps(metrics['heldout_teacher_forced'])} "
        f"prefix score {metrics['fixed_prefix_score']['main_loss']}",
    )


def write_card(out_dir, config, m, weights_bytes):
    """Render CARD.md from the config and the metrics."""
    tf, fp, c, ta = m["heldout_teacher_forced"], m["fixed_prefix_score"], m["corpus"], m["train_args"]
    cfg_rows = "\n".join(f"| `{k}` | {v} |" for k, v in config.to_dict().items())
    lines = [
        "# Tiny byte-level target model + MTP layer",
        "",
        "Shipped with `fastdeploy_mtp` so the proposer and the reference engine can be tested "
        "end to end on a CPU. Load it with `fastdeploy_mtp.models.load_tiny()`, which returns "
        "`(target, mtp, config)`; tokens are bytes (`fastdeploy_mtp.models.ByteTokenizer`).",
        "",
        "Files: `model.safetensors` (float32, Paddle `[in, out]` Linear layout, "
        f"{weights_bytes / 1e6:.2f} MB; target tensors under their own names, MTP layer under "
        "`mtp.`), `config.json` (`ModelConfig`), `metrics.json` (every number below).",
        "",
        "## Model",
        "",
        f"Decoder-only target: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} query heads / {config.num_key_value_heads} KV heads "
        f"(GQA, head_dim {config.head_dim}), RoPE (theta {config.rope_theta:g}, rotate-half), "
        f"SwiGLU MLP ({config.intermediate_size}), RMSNorm, untied LM head, no biases. "
        f"Vocabulary: {config.ori_vocab_size} bytes padded to {config.vocab_size} (the "
        "padded columns are -inf in `compute_logits`). MTP layer: `enorm`, `hnorm`, "
        "`eh_proj` over `cat[enorm(emb(t_{p+1})), hnorm(h_p)]`, one decoder layer of the same "
        "shape, final `norm`; embedding and LM head shared with the target. The MTP layer "
        f"consumes the target's **{config.mtp_hidden_state}** hidden state (what the target's "
        f"`forward` returns). Parameters: {m['params']} (target + MTP, shared ones once).",
        "",
        "| field | value |",
        "|---|---|",
        cfg_rows,
        "",
        "## Corpus and split",
        "",
        f"{c['source']} of Python {c['python_version']} (`{c['stdlib_dir']}`), read as raw "
        "bytes and concatenated in file-name order. The corpus therefore depends on the "
        "Python version. Split by file: "
        f"{c['split_rule']}. Train: {c['train_files']} files, {c['train_bytes']} bytes. "
        f"Held out: {c['heldout_files']} files, {c['heldout_bytes']} bytes.",
        "",
        "## Training",
        "",
        f"`scripts/train_tiny.py`, seed {m['seed']}: AdamW (betas 0.9/0.95, weight decay "
        f"{ta['weight_decay']} on matrices), peak lr {ta['lr']} with {ta['warmup_steps']} "
        f"warmup steps and cosine decay to {ta['min_lr_ratio']}x at step {ta['max_steps']}, "
        f"grad-norm clip {ta['grad_clip']}, batch {ta['batch_size']} x {ta['seq_len']} bytes "
        "sampled uniformly at random offsets of the train concatenation. Loss = CE(next byte) "
        f"+ {ta['mtp_weight']} x CE(MTP layer's byte after next), teacher forced. One CPU "
        f"thread. **{m['steps']} steps** ({m['steps'] * ta['batch_size'] * ta['seq_len'] / 1e6:.1f}M "
        f"tokens), **{m['train_wall_time_s'] / 60:.1f} minutes** of training wall time "
        f"(wall budget flag {ta['wall_budget_min']} min).",
        "",
        *([f"Run notes: {m['card_note']}", ""] if m.get("card_note") else []),
        "Command: `OMP_NUM_THREADS=1 python scripts/train_tiny.py --run-dir RUN "
        + " ".join(
            f"--{k.replace('_', '-')} {ta[k]}"
            for k in ("seed", "batch_size", "seq_len", "max_steps", "wall_budget_min")
        )
        + "` then the same with `--eval-only --export fastdeploy_mtp/assets`.",
        "",
        "## Held-out results (teacher forcing)",
        "",
        ("All " if tf["windows"] == c["heldout_bytes"] // ta["seq_len"] else "An evenly spaced subset of ")
        + f"{tf['windows']} non-overlapping {ta['seq_len']}-byte windows of the held-out "
        "concatenation, dense (training) path:",
        "",
        "| metric | value |",
        "|---|---|",
        f"| target next-byte loss (nats/byte) | {tf['main_loss']:.4f} |",
        f"| target next-byte top-1 accuracy | {tf['main_top1']:.4f} |",
        f"| MTP loss for the byte after next (nats/byte) | {tf['mtp_loss']:.4f} |",
        f"| **MTP top-1 accuracy for the byte after next** | **{tf['mtp_top1']:.4f}** |",
        "",
        f"Fixed-prefix score (re-checked by `tests/models/test_shipped_checkpoint.py`): the first "
        f"{fp['bytes']} bytes of held-out `{fp['file']}` as {fp['windows']} windows of "
        f"{fp['window']} bytes, {fp['path']}: next-byte loss **{fp['main_loss']:.4f}** "
        "nats/byte.",
        "",
        "## Greedy continuations of held-out code",
        "",
        f"Prompt: {PROMPT_BYTES} bytes of a held-out file ending at a `def ` or an `if `; "
        f"{CONTINUATION_BYTES} greedy bytes from the target through the paged KV cache. "
        "The continuations start as plausible Python (indentation, `self.` attributes, "
        "method signatures) and then fall into repetition, as greedy decoding of a model "
        "this small does.",
    ]
    for cont in m["greedy_continuations"]:
        lines += [
            "",
            f"`{cont['file']}` at byte {cont['prompt_offset']}, prompt:",
            "",
            "```python",
            cont["prompt"],
            "```",
            "",
            "model continuation:",
            "",
            "```python",
            cont["continuation"],
            "```",
            "",
            "actual file:",
            "",
            "```python",
            cont["actual"],
            "```",
        ]
    lines += [
        "",
        "## Limitations",
        "",
        f"- Trained on {ta['seq_len']}-byte windows only: positions beyond that are "
        "extrapolated RoPE and quality drops there.",
        "- A byte-level model of this size mostly learns local syntax, identifiers from the "
        "context and common stdlib idioms; it is a test fixture, not a code model.",
        "",
    ]
    with open(os.path.join(out_dir, "CARD.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()

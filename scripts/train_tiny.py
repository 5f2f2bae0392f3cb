#!/usr/bin/env python
"""Train the tiny byte-level target model and its MTP layer on the Python stdlib sources.

Seeded and resumable: every ``--ckpt-every-sec`` seconds the model, optimizer, step, data
RNG state and elapsed training wall time are written to ``--run-dir/ckpt.pdckpt``; rerunning
the same command resumes from there. Training stops at ``--max-steps`` or after
``--wall-budget-min`` minutes of training wall time (summed across resumes), whichever is
first. ``--export DIR`` then writes ``model.safetensors``, ``config.json`` and ``metrics.json``
(held-out evaluation) into DIR.

Loss = CE(next token) + ``--mtp-weight`` * sum over depths of the MTP loss at that depth.
The MTP layer at position p gets (embedding of t_{p+1}, target hidden h_p) and predicts
t_{p+2}; with ``--mtp-depth S`` it is unrolled for S substeps on its own output hidden
states, attending as the proposer's substeps do at serving time
(:func:`fastdeploy_mtp.models.mtp_unrolled.unrolled_mtp_forward`), and depth k is scored on
the token k + 1 positions ahead. ``--mtp-layers L`` trains L distinct MTP layers (depth k
runs layer (k - 1) % L).

Second stage (how the shipped MTP layer is trained): ``--init-from DIR --freeze-target``
starts from a checkpoint, keeps the target's weights exactly (so its quality is unchanged)
and trains only the MTP layers. ``--distill`` scores each depth against the target's own
next-token distribution instead of the corpus byte (speculation is accepted when the draft
matches the target, not the text), and ``--gen-fraction F`` makes that share of each batch
greedy continuations of corpus prompts by the target itself (generated once into
``--run-dir`` and reused on resume), the text the target produces when it serves.

Examples::

    # target + depth-1 MTP layer from scratch
    OMP_NUM_THREADS=1 python scripts/train_tiny.py --run-dir /work/train_run \
        --wall-budget-min 55 --max-steps 5000 --export fastdeploy_mtp/assets
    # depth-3 MTP layer on the frozen shipped target
    OMP_NUM_THREADS=1 python scripts/train_tiny.py --run-dir /work/depth_run \
        --init-from fastdeploy_mtp/assets --freeze-target --distill --mtp-depth 3 \
        --gen-fraction 0.5 --max-steps 1500 --export /work/depth_ckpt
    # a DeepSeek-V3-architecture target (MLA + MoE) and its MTP layer, trained together with
    # a depth-3 distilled MTP loss; exported as a released DeepseekV3ForCausalLM folder
    OMP_NUM_THREADS=1 python scripts/train_tiny.py --arch deepseek_v3 --run-dir /work/ds_run \
        --batch-size 16 --seq-len 256 --max-steps 600 --warmup-steps 100 --mtp-depth 3 \
        --distill --mtp-weight 0.5 --wall-budget-min 45 --export /work/ds_ckpt

``--arch deepseek_v3`` (see ``train_arch.py``) takes the MLA shape (``--q-lora-rank``,
``--kv-lora-rank``, ``--qk-nope-head-dim``, ``--qk-rope-head-dim``, ``--v-head-dim``) and the MoE
shape (``--experts``, ``--experts-per-tok``, ``--moe-intermediate-size``, ``--shared-experts``,
``--first-k-dense-replace``, ``--n-group``, ``--topk-group``, ``--routed-scaling-factor``); its
``--export`` writes the released layout with
:func:`fastdeploy_mtp.models.folder_writer.save_model_folder`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_arch  # noqa: E402

from fastdeploy_mtp.models import (  # noqa: E402
    TinyTargetModel,
    causal_bias,
    corpus as corpus_lib,  # noqa: E402
    tiny as tiny_lib,  # noqa: E402
)
from fastdeploy_mtp.models.model_config import TINY_MODEL_TYPE  # noqa: E402
from fastdeploy_mtp.models.mtp_layer import build_mtp, mtp_layers_of  # noqa: E402
from fastdeploy_mtp.models.mtp_unrolled import unrolled_mtp_forward  # noqa: E402

#: (flag, default, help) of the numeric options, in --help order; each parses as its default's
#: type. MODEL_OPTIONS come before the architecture options (train_arch), TRAINING_OPTIONS after.
MODEL_OPTIONS = (
    ("--seed", 1234, None),
    ("--max-steps", 5000, None),
    ("--wall-budget-min", 55.0, "stop after this many minutes of training wall time (all resumes)"),
    ("--ckpt-every-sec", 180.0, None),
    ("--eval-every", 500, "steps between quick evals"),
    ("--hidden-size", 128, None),
    ("--layers", 2, None),
    ("--heads", 4, None),
    ("--kv-heads", 2, None),
    ("--intermediate-size", 352, None),
    ("--vocab-size", 272, "padded vocab (>= 256)"),
)
TRAINING_OPTIONS = (
    ("--seq-len", 128, None),
    ("--batch-size", 64, None),
    ("--lr", 3e-3, None),
    ("--min-lr-ratio", 0.1, None),
    ("--warmup-steps", 200, None),
    ("--weight-decay", 0.01, None),
    ("--mtp-weight", 1.0, None),
    ("--mtp-depth", 1, "MTP substeps to unroll in training (S)"),
    ("--mtp-layers", 1, "distinct MTP layers (num_nextn_predict_layers)"),
    ("--gen-fraction", 0.0, "share of each batch that is target-generated"),
    ("--gen-pool", 1024, "target-generated sequences to draw from"),
    ("--grad-clip", 1.0, None),
    ("--threads", 1, None),
)
#: (flag, help) of the on/off options.
SWITCHES = (
    ("--freeze-target", "train only the MTP layers"),
    ("--distill", "score the MTP layers against the target's distribution"),
    ("--eval-only", "skip training (resume + export)"),
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True, help="checkpoints and log go here")
    for flag, default, help_ in MODEL_OPTIONS:
        p.add_argument(flag, type=type(default), default=default, help=help_)
    train_arch.add_arch_args(p)
    p.add_argument("--mtp-hidden-state", default="post_norm", choices=["post_norm", "pre_norm"])
    for flag, default, help_ in TRAINING_OPTIONS:
        p.add_argument(flag, type=type(default), default=default, help=help_)
    for flag, help_ in SWITCHES:
        p.add_argument(flag, action="store_true", help=help_)
    p.add_argument(
        "--init-from", default=None, help="start from this checkpoint directory (target + MTP)"
    )
    p.add_argument("--export", default=None, help="write the trained checkpoint here at the end")
    p.add_argument(
        "--card-note",
        default="",
        help="free-text note about the run (restarts, load) added to the card",
    )
    p.add_argument(
        "--export-eval-windows",
        type=int,
        default=None,
        help="evaluate the export on this many held-out windows (smoke tests); "
        "default: all of them",
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


def target_forward(target, ids, bias, frozen):
    """``ids [B, S]`` -> (target hidden ``[B, S, H]`` the MTP layer consumes, logits ``[B, S, V]``);
    without a graph when the target is ``frozen``."""
    with paddle.no_grad() if frozen else contextlib.nullcontext():
        pre, post = target.forward_dense(ids, bias)
        hidden = target.mtp_hidden(pre, post)
        return hidden, target.compute_logits(hidden)


def soft_ce(student_logits, teacher_logits, vocab):
    """Cross-entropy of ``student`` against ``softmax(teacher)`` over the first ``vocab``
    columns (the padded ones are ``-inf``), per row: ``[..., 1]``."""
    teacher = F.softmax(teacher_logits[..., :vocab].detach(), axis=-1)
    return -(teacher * F.log_softmax(student_logits[..., :vocab], axis=-1)).sum(-1, keepdim=True)


def losses(target, mtp, ids, bias, args):
    """``ids [B, S]`` int64 -> ``(total loss, main CE [B, S-1, 1] or None, [per-depth MTP loss
    [B, S-1-k, 1] for k = 1..depth], main logits [B, S-1, V], [per-depth MTP logits])``.

    MTP row p pairs token p+1 with the target hidden state at p; depth k at row p predicts
    token p+2 (the chain started k - 1 rows earlier) and is valid for p >= k - 1."""
    vocab = target.config.ori_vocab_size
    hidden, logits = target_forward(target, ids, bias, args.freeze_target)
    main_ce = (
        None if args.freeze_target else F.cross_entropy(logits[:, :-1], ids[:, 1:].unsqueeze(-1))
    )
    outs = unrolled_mtp_forward(mtp_layers_of(mtp), ids[:, 1:-1], hidden[:, :-2], args.mtp_depth)
    per_depth, mtp_logits = [], []
    layers = mtp_layers_of(mtp)
    for k, out in enumerate(outs, start=1):
        lg = layers[(k - 1) % len(layers)].compute_logits(out[:, k - 1 :])
        if args.distill:
            ce = soft_ce(lg, logits[:, k:-1], vocab)
        else:
            ce = F.cross_entropy(lg, ids[:, k + 1 :].unsqueeze(-1))
        per_depth.append(ce)
        mtp_logits.append(lg)
    total = args.mtp_weight * sum(ce.mean() for ce in per_depth)
    if main_ce is not None:
        total = total + main_ce.mean()
    return total, main_ce, per_depth, logits[:, :-1], mtp_logits


def gen_pool(run_dir, name, target, data, count, seq_len, seed):
    """``count`` sequences of ``seq_len`` bytes: ``seq_len // 2`` bytes of ``data`` at random
    offsets, then the target's greedy continuation. Cached as ``run_dir/name.npy``."""
    path = os.path.join(run_dir, name + ".npy")
    if os.path.exists(path):
        pool = np.load(path)
        if pool.shape == (count, seq_len):
            return pool
    rng = np.random.default_rng(seed)
    half = seq_len // 2
    starts = rng.integers(0, len(data) - half, size=count)
    prompts = np.stack([data[s : s + half] for s in starts]).astype(np.int64)
    parts = []
    t0 = time.time()
    for i in range(0, count, 64):
        batch = prompts[i : i + 64]
        parts.append(
            np.concatenate(
                [batch, tiny_lib.greedy_generate_batch(target, batch, seq_len - half)], axis=1
            )
        )
        log(
            run_dir,
            f"generated {min(i + 64, count)}/{count} {name} sequences ({time.time() - t0:.0f}s)",
        )
    pool = np.concatenate(parts)
    np.save(path + ".tmp.npy", pool)
    os.replace(path + ".tmp.npy", path)
    return pool


@paddle.no_grad()
def evaluate_depths(target, mtp, windows: np.ndarray, depth: int, batch_size: int = 32) -> dict:
    """Teacher-forced per-depth figures on ``windows [N, S]``: the MTP loss against the
    corpus byte (``ce``), top-1 agreement with the target's argmax (``agree``), and the
    chained agreement ``accept``: at depth k, the share of chains whose depths 1..k all agree
    with the target, i.e. the acceptance rate of draft position k if the target's argmax
    were the text (exactly so on target-generated windows)."""
    was_training = mtp.training
    mtp.eval()
    seq = windows.shape[1]
    bias = causal_bias(seq)
    ce_sum, agree_sum, accept_sum, count = (
        np.zeros(depth),
        np.zeros(depth),
        np.zeros(depth),
        np.zeros(depth),
    )
    layers = mtp_layers_of(mtp)
    for s in range(0, len(windows), batch_size):
        ids = paddle.to_tensor(windows[s : s + batch_size].astype(np.int64))
        hidden, logits = target_forward(target, ids, bias, True)
        outs = unrolled_mtp_forward(layers, ids[:, 1:-1], hidden[:, :-2], depth)
        want = logits[:, 1:-1].argmax(-1).numpy()  # target's argmax for row p (token p + 2)
        agree = []
        for k, out in enumerate(outs, start=1):
            lg = layers[(k - 1) % len(layers)].compute_logits(out)  # [B, S-2, V]
            ce = F.cross_entropy(lg[:, k - 1 :], ids[:, k + 1 :].unsqueeze(-1), reduction="sum")
            ok = lg.argmax(-1).numpy() == want
            agree.append(ok)
            ce_sum[k - 1] += float(ce)
            agree_sum[k - 1] += ok[:, k - 1 :].sum()
            # chain starting at row c: depth j sits at row c + j - 1
            n = ok.shape[1] - (k - 1)
            chain = np.ones((ok.shape[0], n), bool)
            for j in range(1, k + 1):
                chain &= agree[j - 1][:, j - 1 : j - 1 + n]
            accept_sum[k - 1] += chain.sum()
            count[k - 1] += ok[:, k - 1 :].size
    if was_training:
        mtp.train()
    r = lambda a: [round(float(x), 4) for x in a]  # noqa: E731
    return {
        "ce": r(ce_sum / count),
        "agree": r(agree_sum / count),
        "accept": r(accept_sum / count),
        "windows": len(windows),
    }


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

    if args.init_from:
        base_target, base_mtp, base_config = tiny_lib.load_tiny(args.init_from)
        config = dataclasses.replace(base_config, num_nextn_predict_layers=args.mtp_layers)
        target = base_target
        mtp = build_mtp(config, target)
        # every new MTP layer starts from the checkpoint's (first) layer
        first = mtp_layers_of(base_mtp)[0].state_dict()
        for layer in mtp_layers_of(mtp):
            layer.set_state_dict(first)
    else:
        config = train_arch.build_config(args)
        target = TinyTargetModel(config)
        mtp = build_mtp(config, target)
    train_arch.freeze_router_bias(target, mtp)
    if args.freeze_target:
        target.eval()
        for p in target.parameters():
            p.stop_gradient = True
    mtp.train()
    params = list(mtp.parameters()) + ([] if args.freeze_target else list(target.parameters()))
    named = [("mtp." + n, p.name) for n, p in mtp.named_parameters()]
    if not args.freeze_target:
        named += [("target." + n, p.name) for n, p in target.named_parameters()]
    n_params = sum(
        int(np.prod(p.shape)) for p in list(target.parameters()) + list(mtp.parameters())
    )
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
    n_gen = int(round(args.batch_size * args.gen_fraction))
    pool = (
        gen_pool(args.run_dir, "gen_train", target, train, args.gen_pool, args.seq_len, args.seed)
        if n_gen
        else None
    )
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
            "mtp_layers",
            "mtp_depth",
            "init_from",
            "freeze_target",
            "distill",
            "gen_fraction",
            *train_arch.ARCH_SHAPE_KEYS,
        )
        changed = [k for k in shape_keys if k in saved and saved[k] != getattr(args, k)]
        if changed:
            raise SystemExit(
                f"{ckpt_path} was trained with different {changed}: "
                f"{ {k: saved[k] for k in changed} }"
            )
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
        log(
            args.run_dir,
            f"fresh run: {n_params} params, corpus {split.describe()}, args {vars(args)}",
        )

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

    heldout_gen = None
    if (args.mtp_depth > 1 or args.distill) and args.freeze_target:  # a fixed target's own text
        heldout = split.heldout_array()
        heldout_gen = gen_pool(
            args.run_dir, "gen_heldout", target, heldout, 64, args.seq_len, args.seed + 1
        )
    bias = causal_bias(args.seq_len)
    budget = args.wall_budget_min * 60.0
    last_ckpt = time.time()
    seg_start, seg_elapsed0 = time.time(), elapsed
    recent = []
    while not args.eval_only and step < args.max_steps and elapsed < budget:
        t0 = time.time()
        starts = rng.integers(0, len(train) - args.seq_len, size=args.batch_size - n_gen)
        batch = [train[s : s + args.seq_len] for s in starts]
        if n_gen:
            batch += list(pool[rng.integers(0, len(pool), size=n_gen)])
        batch = np.stack(batch).astype(np.int64)
        opt.set_lr(lr_at(step, args))
        total, main_ce, per_depth, _, _ = losses(target, mtp, paddle.to_tensor(batch), bias, args)
        total.backward()
        opt.step()
        opt.clear_grad()
        step += 1
        elapsed = seg_elapsed0 + (time.time() - seg_start)
        recent.append(
            [float(main_ce.mean()) if main_ce is not None else 0.0]
            + [float(ce.mean()) for ce in per_depth]
            + [time.time() - t0]
        )
        if step % 50 == 0:
            m = np.mean(recent, axis=0)
            depths = " ".join(f"{x:.4f}" for x in m[1:-1])
            log(
                args.run_dir,
                f"step {step} lr {lr_at(step - 1, args):.2e} main {m[0]:.4f} "
                f"mtp[depth] {depths} {1.0 / m[-1]:.2f} steps/s elapsed {elapsed:.0f}s",
            )
            recent = []
        if step % args.eval_every == 0:
            if heldout_gen is not None:
                quick = evaluate_depths(target, mtp, heldout_gen, args.mtp_depth)
            else:
                quick = tiny_lib.evaluate_dense(
                    target, mtp, split.heldout_array(), args.seq_len, max_windows=256
                )
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
            target,
            mtp_layers_of(mtp)[0],
            split.heldout_array(),
            args.seq_len,
            max_windows=args.export_eval_windows,
        )
    }
    depth = max(args.mtp_depth, 3)
    heldout = split.heldout_array()
    gen = gen_pool(args.run_dir, "gen_heldout", target, heldout, 64, args.seq_len, args.seed + 1)
    n_win = len(heldout) // args.seq_len
    pick = np.linspace(0, n_win - 1, min(n_win, args.export_eval_windows or 256)).astype(np.int64)
    corpus_windows = heldout[: n_win * args.seq_len].reshape(n_win, args.seq_len)[pick]
    metrics["depth_teacher_forced"] = {
        "depth": depth,
        "generated": evaluate_depths(target, mtp, gen, depth),
        "corpus": evaluate_depths(target, mtp, corpus_windows, depth),
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
    if args.init_from:
        with open(os.path.join(args.init_from, tiny_lib.METRICS_FILE), encoding="utf-8") as f:
            base = json.load(f)
        first = base.get("stages", [base])[0]
        keep = ("steps", "train_wall_time_s", "train_args", "card_note", "seed")
        metrics["stages"] = [{k: first[k] for k in keep if k in first}]
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
    if config.n_routed_experts:
        windows = corpus_windows[: min(64, len(corpus_windows))]
        metrics["expert_load"] = train_arch.expert_load(target, mtp, windows)
    train_arch.save_folder(args.export, target, mtp, config, metrics)
    metrics["serving"] = serving_acceptance(args.export)
    train_arch.save_folder(args.export, target, mtp, config, metrics)
    size = os.path.getsize(os.path.join(args.export, tiny_lib.WEIGHTS_FILE))
    write_card(args.export, config, metrics, size)
    log(
        args.run_dir,
        f"exported to {args.export}: "
        f"{json.dumps(metrics['heldout_teacher_forced'])} "
        f"prefix score {metrics['fixed_prefix_score']['main_loss']}",
    )


#: Serving-path acceptance on the card: K = S = 3, greedy, batch 1, this many new tokens.
SERVING_K, SERVING_TOKENS = 3, 96


def serving_acceptance(checkpoint: str) -> dict:
    """Mean accepted length and acceptance per draft position of the exported checkpoint in
    the reference engine (K = S = 3, greedy, batch 1) on the demo and the held-out prompts."""
    from fastdeploy_mtp.engine_args import speculative_config
    from fastdeploy_mtp.entrypoints.offline import run_prompts
    from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS, heldout_prompts

    out = {"k": SERVING_K, "steps": SERVING_K, "max_tokens": SERVING_TOKENS, "batch": 1}
    for name, prompts in (("demo", DEMO_PROMPTS), ("heldout", heldout_prompts())):
        spec = speculative_config(SERVING_K, SERVING_K)
        _, _, m = run_prompts(prompts, SERVING_TOKENS, spec, 1, f"card {name}", checkpoint)
        out[name] = {
            "mean_accepted_length": round(m.mean_accepted_length, 4),
            "acceptance_per_position": [round(a, 4) for a in m.acceptance_per_position],
        }
    return out


def _command(ta: dict, keys) -> str:
    flags = [
        (f"--{k.replace('_', '-')}", ta[k]) for k in keys if k in ta and ta[k] not in (None, False)
    ]
    return " ".join(flag if value is True else f"{flag} {value}" for flag, value in flags)


def training_lines(m: dict) -> list[str]:
    """The card's training section: the target (stage 1) and, when the MTP layers were
    retrained on the frozen target, stage 2."""
    stages = m.get("stages", []) + [m]
    first = stages[0]
    ta = first["train_args"]
    lines = [
        f"Stage 1, target and MTP layer: `scripts/train_tiny.py`, seed {first['seed']}: AdamW "
        f"(betas 0.9/0.95, weight decay {ta['weight_decay']} on matrices), peak lr {ta['lr']} with "
        f"{ta['warmup_steps']} warmup steps and cosine decay to {ta['min_lr_ratio']}x at step "
        f"{ta['max_steps']}, grad-norm clip {ta['grad_clip']}, batch {ta['batch_size']} x "
        f"{ta['seq_len']} bytes sampled uniformly at random offsets of the train concatenation. "
        + train_arch.stage1_loss_text(ta)
        + f" One CPU thread. **{first['steps']} steps** "
        f"({first['steps'] * ta['batch_size'] * ta['seq_len'] / 1e6:.1f}M tokens), "
        f"**{first['train_wall_time_s'] / 60:.1f} minutes** of training wall time (wall budget "
        f"flag {ta['wall_budget_min']} min).",
        "",
        *([f"Stage 1 run notes: {first['card_note']}", ""] if first.get("card_note") else []),
        "Command: `OMP_NUM_THREADS=1 python scripts/train_tiny.py --run-dir RUN "
        + _command(ta, train_arch.stage1_command_keys(ta))
        + "`.",
        "",
    ]
    if len(stages) == 1:
        return lines
    ta = m["train_args"]
    layers = ta.get("mtp_layers", 1)
    lines += [
        f"Stage 2, MTP {'layer' if layers == 1 else f'layers ({layers} distinct)'} for drafting: "
        "the target's weights are frozen (its numbers below are stage 1's, unchanged) and the MTP "
        f"layers are trained unrolled for **{ta['mtp_depth']} substeps** on their own hidden "
        "states, attending as the proposer's substeps do at serving time, with one loss per depth "
        "(depth k scores the token k + 1 ahead). "
        + (
            "Each depth is scored against the target's own next-token distribution (soft "
            "cross-entropy), since a draft is accepted when it matches the target, not the text. "
            if ta.get("distill")
            else ""
        )
        + (
            f"{ta['gen_fraction']:.0%} of each batch is the target's own greedy continuations of "
            f"corpus prompts ({ta['gen_pool']} sequences generated once), the text it produces "
            "when it serves. "
            if ta.get("gen_fraction")
            else ""
        )
        + f"Every layer starts from stage 1's MTP layer. AdamW, peak lr {ta['lr']}, "
        f"{ta['warmup_steps']} warmup steps, cosine to {ta['min_lr_ratio']}x at step "
        f"{ta['max_steps']}, batch {ta['batch_size']} x {ta['seq_len']}. **{m['steps']} steps, "
        f"{m['train_wall_time_s'] / 60:.1f} minutes** of training wall time on one CPU thread.",
        "",
        *([f"Stage 2 run notes: {m['card_note']}", ""] if m.get("card_note") else []),
        "Command: `OMP_NUM_THREADS=1 python scripts/train_tiny.py --run-dir RUN2 --init-from "
        "STAGE1 --freeze-target "
        + _command(
            ta,
            (
                "distill",
                "mtp_depth",
                "mtp_layers",
                "gen_fraction",
                "gen_pool",
                "max_steps",
                "wall_budget_min",
                "lr",
                "warmup_steps",
                "batch_size",
                "seq_len",
            ),
        ).replace("--distill True", "--distill")
        + "` then the same with `--eval-only --export fastdeploy_mtp/assets`.",
        "",
    ]
    return lines


def drafting_lines(m: dict) -> list[str]:
    """The card's drafting-quality tables (present when the export measured them)."""
    lines: list[str] = []
    dt = m.get("depth_teacher_forced")
    if dt:
        rows = []
        for name, key in (
            ("target's greedy continuations", "generated"),
            ("held-out corpus", "corpus"),
        ):
            r = dt[key]
            for k in range(dt["depth"]):
                rows.append(
                    f"| {name} | {k + 1} | {r['agree'][k]:.4f} | {r['accept'][k]:.4f} | "
                    f"{r['ce'][k]:.4f} |"
                )
        lines += [
            "Drafting, teacher forced (training path, unrolled substeps): per depth, the share of "
            "rows whose argmax equals the target's (`agree`), the share of chains whose depths "
            "1..k all do (`accept`, what draft position k's acceptance would be if the target's "
            "argmax were the text; exactly so on its own continuations), and the cross-entropy "
            f"against the text. 64 held-out continuations and {dt['corpus']['windows']} held-out "
            "corpus windows.",
            "",
            "| windows | depth | agree | accept | CE vs text |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    sv = m.get("serving")
    if sv:

        def fmt(x):
            return " / ".join(f"{a:.2f}" for a in x["acceptance_per_position"])

        lines += [
            f"**Serving** (reference engine, K = S = {sv['k']}, greedy, batch {sv['batch']}, "
            f"{sv['max_tokens']} new tokens per prompt): mean accepted length "
            f"**{sv['demo']['mean_accepted_length']:.2f}** on the demo prompts (acceptance per "
            f"draft position {fmt(sv['demo'])}) and "
            f"**{sv['heldout']['mean_accepted_length']:.2f}** on held-out prompts "
            f"({fmt(sv['heldout'])}). Acceptance per position is cumulative: a draft counts only "
            "if the drafts before it in its round were accepted.",
            "",
        ]
    return lines


def tiny_model_lines(config, m, weights_bytes, cfg_rows):
    """The card's title, files and model sections for the dense tiny model."""
    return [
        "# Tiny byte-level target model + MTP layer",
        "",
        "Shipped with `fastdeploy_mtp` so the proposer and the reference engine can be tested end "
        "to end on a CPU. It is a model folder like any other (`model_type: fastdeploy_mtp_tiny`): "
        "load it with `fastdeploy_mtp.models.load_model(fastdeploy_mtp.models.ASSETS_DIR)` (or "
        "`load_tiny()`), which returns `(target, mtp, config)`; tokens are bytes, ids 0..255 "
        "(`tokenizer.json`, read by `fastdeploy_mtp.tokenization.load_tokenizer`), and its chat "
        "template (`tokenizer_config.json`) renders `role: content` lines then `assistant:`.",
        "",
        "Files: `model.safetensors` (float32, Paddle `[in, out]` Linear layout, "
        f"{weights_bytes / 1e6:.2f} MB; target tensors under their own names, MTP layer under "
        "`mtp.`), `config.json` (`ModelConfig` plus `architectures` and `model_type`), "
        "`tokenizer.json` + `tokenizer_config.json` (written by `scripts/make_byte_tokenizer.py`), "
        "`metrics.json` (every number below).",
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
        "`forward` returns)"
        + (
            f"; the checkpoint carries **{config.num_nextn_predict_layers} distinct MTP layers** "
            "(`num_nextn_predict_layers`, tensors under `mtp.layers.{i}.`), substep s running "
            "layer s by default"
            if config.num_nextn_predict_layers > 1
            else ""
        )
        + f". Parameters: {m['params']} (target + MTP, shared ones once).",
        "",
        "| field | value |",
        "|---|---|",
        cfg_rows,
        "",
    ]


def write_card(out_dir, config, m, weights_bytes):
    """Render CARD.md from the config and the metrics."""
    tf, fp, c = m["heldout_teacher_forced"], m["fixed_prefix_score"], m["corpus"]
    ta = m.get("stages", [m])[0]["train_args"]
    cfg_rows = "\n".join(f"| `{k}` | {v} |" for k, v in config.to_dict().items())
    tiny = config.model_type == TINY_MODEL_TYPE
    shipped_test = "test_shipped_checkpoint.py" if tiny else "test_shipped_mla_checkpoint.py"
    lines = [
        *(
            tiny_model_lines(config, m, weights_bytes, cfg_rows)
            if tiny
            else train_arch.deepseek_model_lines(config, m, weights_bytes, cfg_rows)
        ),
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
        *training_lines(m),
        "## Held-out results (teacher forcing)",
        "",
        (
            "All "
            if tf["windows"] == c["heldout_bytes"] // ta["seq_len"]
            else "An evenly spaced subset of "
        )
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
        *drafting_lines(m),
        f"Fixed-prefix score (re-checked by `tests/models/{shipped_test}`): the first "
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
        *([] if tiny else train_arch.extra_limitations(m)),
        "",
    ]
    with open(os.path.join(out_dir, "CARD.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()

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

End of text: with ``--eot-id ID`` (default 256) the corpus is read as documents
(:func:`fastdeploy_mtp.models.corpus.documents`: each top-level ``def``/``class`` and each run
of other top-level lines) each followed by the token ``ID``, which becomes the model's EOS
(``ori_vocab_size`` grows past it); ``--eot-fraction F`` places that share of each batch's
windows around a document end and ``--doc-start-fraction F`` starts that share at a
document's first byte (a served prompt starts the context the same way). ``--init-from`` a
folder whose vocabulary is smaller (a released folder keeps only its real rows) pads it to
``--vocab-size``.

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
    ("--vocab-size", 272, "padded vocab (>= 257)"),
    (
        "--eot-id",
        corpus_lib.EOT_ID,
        "end-of-text id after each document of the corpus (-1: the files' raw bytes, no end)",
    ),
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
    (
        "--eot-fraction",
        0.0,
        "share of each batch's corpus windows placed to hold a document end (--eot-id)",
    ),
    (
        "--doc-start-fraction",
        0.0,
        "share of each batch's corpus windows that start at a document's first byte, as a "
        "prompt starts the context at serving time (--eot-id)",
    ),
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


def copy_padded(dst, src) -> None:
    """Load ``src``'s parameters into ``dst``; where ``dst``'s is larger (a vocabulary padded
    further) the leading slice is ``src``'s and the rest keeps ``dst``'s initialisation."""
    state = dst.state_dict()
    for name, value in src.state_dict().items():
        have = state[name].numpy()
        have[tuple(slice(0, n) for n in value.shape)] = value.numpy()
        state[name] = paddle.to_tensor(have)
    dst.set_state_dict(state)


def build_models(args):
    """``(target, mtp, config)`` to train: fresh from the flags, or ``--init-from``'s weights
    (its first MTP layer copied into every MTP layer) with the vocabulary padded to
    ``--vocab-size`` when the folder holds fewer rows (a released folder keeps only the real
    ones) and ``--eot-id`` added (:func:`train_arch.with_eot`)."""
    if not args.init_from:
        config = train_arch.build_config(args)
        target = TinyTargetModel(config)
        return target, build_mtp(config, target), config
    base_target, base_mtp, base_config = tiny_lib.load_tiny(args.init_from)
    config = dataclasses.replace(
        base_config,
        num_nextn_predict_layers=args.mtp_layers,
        vocab_size=max(base_config.vocab_size, args.vocab_size),
    )
    config = train_arch.with_eot(config, args)
    target = TinyTargetModel(config)
    copy_padded(target, base_target)
    mtp = build_mtp(config, target)
    for layer in mtp_layers_of(mtp):
        copy_padded(layer, mtp_layers_of(base_mtp)[0])
    return target, mtp, config


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

    target, mtp, config = build_models(args)
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
    train = split.documents_array(split.train_files) if args.eot_id >= 0 else split.train_array()
    rng = np.random.default_rng(args.seed)
    n_gen = int(round(args.batch_size * args.gen_fraction))
    n_end, n_start = (
        (
            int(round((args.batch_size - n_gen) * f))
            for f in (args.eot_fraction, args.doc_start_fraction)
        )
        if args.eot_id >= 0
        else (0, 0)
    )
    doc_ends = np.flatnonzero(train == args.eot_id)
    doc_starts = np.concatenate([[0], doc_ends + 1])
    doc_starts = doc_starts[doc_starts <= len(train) - args.seq_len]
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
            "eot_id",
            "eot_fraction",
            "doc_start_fraction",
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
        starts = rng.integers(
            0, len(train) - args.seq_len, size=args.batch_size - n_gen - n_end - n_start
        )
        if n_start:  # windows whose position 0 is a document's first byte
            starts = np.concatenate([starts, doc_starts[rng.integers(0, len(doc_starts), n_start)]])
        if n_end:  # windows holding a document end at a random position past the first
            at = doc_ends[rng.integers(0, len(doc_ends), size=n_end)]
            at = at - rng.integers(1, args.seq_len, size=n_end)
            starts = np.concatenate([starts, np.clip(at, 0, len(train) - args.seq_len)])
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
                "continuation": continuation_text(new, args.eot_id),
                "actual": text[anchor : anchor + CONTINUATION_BYTES].decode("utf-8", "replace"),
            }
        )
    metrics["greedy_continuations"] = conts
    if args.eot_id >= 0:
        docs = split.documents_array(split.heldout_files)
        metrics["end_of_text"] = evaluate_eot(target, docs, args.seq_len, args.eot_id)
    if args.init_from:
        with open(os.path.join(args.init_from, tiny_lib.METRICS_FILE), encoding="utf-8") as f:
            base = json.load(f)
        keep = ("steps", "train_wall_time_s", "train_args", "card_note", "seed")
        earlier = [*base.get("stages", []), base]
        metrics["stages"] = [{k: st[k] for k in keep if k in st} for st in earlier]
        if args.eot_id >= 0 and ("before" in base or "end_of_text" not in base):
            metrics["before"] = base.get("before") or {k: base[k] for k in BEFORE if k in base}
    metrics.update(
        {
            "card_note": args.card_note,
            "steps": step,
            "train_wall_time_s": round(elapsed, 1),
            "params": n_params,
            "seed": args.seed,
            "corpus": {**split.describe(), **document_counts(split, args.eot_id)},
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


def document_counts(split, eot_id: int) -> dict:
    """How many documents each split has when read as documents (nothing without the token)."""
    if eot_id < 0:
        return {}
    return {
        f"{name}_documents": int((split.documents_array(files) == eot_id).sum())
        for name, files in (("train", split.train_files), ("heldout", split.heldout_files))
    }


def continuation_text(ids, eot_id: int) -> str:
    """Greedy bytes as text, cut after the first end-of-text id (shown as its token)."""
    ids = [int(t) for t in ids]
    if eot_id in ids:
        return bytes(ids[: ids.index(eot_id)]).decode("utf-8", "replace") + EOT_TEXT
    return bytes(ids).decode("utf-8", "replace")


@paddle.no_grad()
def evaluate_eot(target, docs: np.ndarray, seq_len: int, eot_id: int, batch_size: int = 32):
    """Teacher-forced end-of-text figures of the target on the held-out documents stream
    ``docs [N]`` (int64, ``eot_id`` after each document), in its non-overlapping ``seq_len``
    windows: the next-token loss over the stream, ``recall`` (the share of document ends, where
    the next token is ``eot_id``, at which the target's argmax is ``eot_id``) and ``precision``
    (the share of the target's ``eot_id`` argmaxes that fall at a document end)."""
    n_win = len(docs) // seq_len
    windows = docs[: n_win * seq_len].reshape(n_win, seq_len)
    bias = causal_bias(seq_len)
    loss, ends, hits, said = 0.0, 0, 0, 0
    for s in range(0, n_win, batch_size):
        ids = paddle.to_tensor(windows[s : s + batch_size])
        _, logits = target_forward(target, ids, bias, True)
        loss += float(F.cross_entropy(logits[:, :-1], ids[:, 1:].unsqueeze(-1), reduction="sum"))
        pred, want = logits[:, :-1].argmax(-1).numpy(), ids[:, 1:].numpy()
        ends += int((want == eot_id).sum())
        hits += int(((want == eot_id) & (pred == eot_id)).sum())
        said += int((pred == eot_id).sum())
    return {
        "windows": n_win,
        "window": seq_len,
        "doc_ends": ends,
        "loss": round(loss / (n_win * (seq_len - 1)), 5),
        "recall": round(hits / max(ends, 1), 4),
        "precision": round(hits / max(said, 1), 4),
    }


#: The figures of a checkpoint trained without the end-of-text token that a fine-tune from it
#: keeps (``metrics["before"]``), for the card's before/after table.
BEFORE = ("heldout_teacher_forced", "depth_teacher_forced", "fixed_prefix_score", "serving")
#: Serving-path acceptance on the card: K = S = 3, greedy, batch 1, this many new tokens
#: (the model's end-of-text masked, ``ignore_eos``, so every answer has this length), and
#: the same run up to STOP_TOKENS new tokens that ends where the model ends the answer.
SERVING_K, SERVING_TOKENS, STOP_TOKENS = 3, 96, 512
#: The sampling of the README's sampled example, for the sampled until-stop run.
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 7}
#: How the end-of-text token reads in the card's continuations.
EOT_TEXT = "<|endoftext|>"


def serving_acceptance(checkpoint: str) -> dict:
    """Mean accepted length and acceptance per draft position of the exported checkpoint in
    the reference engine (K = S = 3, batch 1) on the demo and the held-out prompts, greedy:
    :data:`SERVING_TOKENS` new tokens each with the end-of-text masked (``ignore_eos``); and
    up to :data:`STOP_TOKENS`, each request ending at the model's end-of-text, greedy
    (``until_stop``) and sampled as the README's example is (``until_stop_sampled``,
    :data:`SAMPLED`): how many ended there (``stopped``) and the mean answer length."""
    from fastdeploy_mtp.engine_args import speculative_config
    from fastdeploy_mtp.entrypoints.offline import run_prompts, run_requests
    from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS, heldout_prompts
    from fastdeploy_mtp.runtime.sampling_params import SamplingParams

    out = {"k": SERVING_K, "steps": SERVING_K, "max_tokens": SERVING_TOKENS, "batch": 1}
    out["stop_max_tokens"], out["sampled"] = STOP_TOKENS, SAMPLED
    spec = speculative_config(SERVING_K, SERVING_K)
    for name, prompts in (("demo", DEMO_PROMPTS), ("heldout", heldout_prompts())):
        fixed = SamplingParams(ignore_eos=True)
        _, _, m = run_prompts(prompts, SERVING_TOKENS, spec, 1, f"card {name}", checkpoint, fixed)
        out[name] = {
            "mean_accepted_length": round(m.mean_accepted_length, 4),
            "acceptance_per_position": [round(a, 4) for a in m.acceptance_per_position],
        }
        for key, sampling in (("until_stop", None), ("until_stop_sampled", SAMPLED)):
            params = SamplingParams(**sampling) if sampling else None
            reqs, _, ended = run_requests(
                prompts, STOP_TOKENS, spec, 1, f"card {name}", checkpoint, params
            )
            out[name][key] = {
                "mean_accepted_length": round(ended.mean_accepted_length, 4),
                "acceptance_per_position": [round(a, 4) for a in ended.acceptance_per_position],
                "stopped": sum(r.finish_reason == "stop" for r in reqs),
                "prompts": len(reqs),
                "mean_tokens": round(float(np.mean([len(r.output_token_ids) for r in reqs])), 1),
            }
    return out


def _command(ta: dict, keys) -> str:
    flags = [
        (f"--{k.replace('_', '-')}", ta[k]) for k in keys if k in ta and ta[k] not in (None, False)
    ]
    return " ".join(flag if value is True else f"{flag} {value}" for flag, value in flags)


def training_lines(m: dict) -> list[str]:
    """The card's training section: the target (stage 1), then each later stage: the MTP
    layers retrained on the frozen target, or target and MTP layers fine-tuned together."""
    stages = m.get("stages", []) + [m]
    first = stages[0]
    ta = first["train_args"]
    lines = [
        f"Stage 1, target and MTP layer: `scripts/train_tiny.py`, seed {first['seed']}: AdamW "
        f"(betas 0.9/0.95, weight decay {ta['weight_decay']} on matrices), peak lr {ta['lr']} with "
        f"{ta['warmup_steps']} warmup steps and cosine decay to {ta['min_lr_ratio']}x at step "
        f"{ta['max_steps']}, grad-norm clip {ta['grad_clip']}, batch {ta['batch_size']} x "
        f"{ta['seq_len']} bytes sampled uniformly at random offsets of the train "
        + ("documents stream. " if ta.get("eot_id", -1) >= 0 else "concatenation. ")
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
    for n, st in enumerate(stages[1:], start=2):
        lines += later_stage_lines(n, st)
    if len(stages) > 1:
        lines[-2] = lines[-2][:-1] + " then the same with `--eval-only --export OUT`."
    return lines


#: The flags a frozen-target stage's command line shows, and a fine-tune stage's.
FROZEN_KEYS = (
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
)
FINE_TUNE_KEYS = (
    "seed",
    "batch_size",
    "seq_len",
    "max_steps",
    "wall_budget_min",
    "lr",
    "warmup_steps",
    "mtp_depth",
    "distill",
    "mtp_weight",
    "eot_id",
    "eot_fraction",
    "doc_start_fraction",
)


def window_placement(ta: dict) -> str:
    """How a stage's training windows were placed, beyond uniform random offsets."""
    parts = [
        f"{ta[key]:.0%} {text}"
        for key, text in (
            ("doc_start_fraction", "start at a document's first byte (as a prompt does)"),
            ("eot_fraction", "hold a document end at a random position"),
        )
        if ta.get(key)
    ]
    return (
        f"; of each batch's windows {' and '.join(parts)}, the rest at random offsets"
        if parts
        else ""
    )


def later_stage_lines(n: int, st: dict) -> list[str]:
    """The card's paragraph and command of stage ``n`` (>= 2), which started from stage
    ``n - 1``'s checkpoint."""
    ta = st["train_args"]
    layers = ta.get("mtp_layers", 1)
    what = "layer" if layers == 1 else f"layers ({layers} distinct)"
    data = (
        f"the train documents stream (each document ended by `{EOT_TEXT}`, id {ta['eot_id']})"
        + window_placement(ta)
        if ta.get("eot_id", -1) >= 0
        else "the train concatenation"
    )
    schedule = (
        f"AdamW, peak lr {ta['lr']}, {ta['warmup_steps']} warmup steps, cosine to "
        f"{ta['min_lr_ratio']}x at step {ta['max_steps']}, batch {ta['batch_size']} x "
        f"{ta['seq_len']} from {data}. **{st['steps']} steps, "
        f"{st['train_wall_time_s'] / 60:.1f} minutes** of training wall time on one CPU thread."
    )
    if ta.get("freeze_target"):
        text = (
            f"Stage {n}, MTP {what} for drafting: the target's weights are frozen (its numbers "
            f"are stage {n - 1}'s, unchanged) and the MTP layers are trained unrolled for "
            f"**{ta['mtp_depth']} substeps** on their own hidden states, attending as the "
            "proposer's substeps do at serving time, with one loss per depth (depth k scores the "
            "token k + 1 ahead). "
            + (
                "Each depth is scored against the target's own next-token distribution (soft "
                "cross-entropy), since a draft is accepted when it matches the target, not the "
                "text. "
                if ta.get("distill")
                else ""
            )
            + (
                f"{ta['gen_fraction']:.0%} of each batch is the target's own greedy continuations "
                f"of corpus prompts ({ta['gen_pool']} sequences generated once), the text it "
                "produces when it serves. "
                if ta.get("gen_fraction")
                else ""
            )
            + f"Every layer starts from stage {n - 1}'s MTP layer. {schedule}"
        )
        command = "--freeze-target " + _command(ta, FROZEN_KEYS)
    else:
        text = (
            f"Stage {n}, fine-tune of the target and the MTP {what} together from stage "
            f"{n - 1}'s weights: " + train_arch.stage1_loss_text(ta) + f" {schedule}"
        )
        keys = FINE_TUNE_KEYS + (
            train_arch.ARCH_SHAPE_KEYS if ta.get("arch", "tiny") != "tiny" else ()
        )
        command = _command(ta, keys)
    return [
        text,
        "",
        *([f"Stage {n} run notes: {st['card_note']}", ""] if st.get("card_note") else []),
        f"Command: `OMP_NUM_THREADS=1 python scripts/train_tiny.py --run-dir RUN{n} "
        f"--init-from STAGE{n - 1} {command}`.",
        "",
    ]


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


#: The card's before/after rows: (label, path into metrics.json, format).
BEFORE_AFTER_ROWS = (
    ("target next-byte loss, held-out files", ("heldout_teacher_forced", "main_loss"), "{:.4f}"),
    ("target next-byte top-1, held-out files", ("heldout_teacher_forced", "main_top1"), "{:.4f}"),
    ("MTP top-1 for the byte after next", ("heldout_teacher_forced", "mtp_top1"), "{:.4f}"),
    ("fixed-prefix score (nats/byte)", ("fixed_prefix_score", "main_loss"), "{:.4f}"),
    *(
        (
            f"chained `accept` at depth 3, {name}",
            ("depth_teacher_forced", key, "accept", 2),
            "{:.4f}",
        )
        for key, name in (("generated", "target's continuations"), ("corpus", "held-out corpus"))
    ),
    *(
        row
        for key in ("demo", "heldout")
        for row in (
            (
                f"serving mean accepted length, {key} prompts",
                ("serving", key, "mean_accepted_length"),
                "{:.2f}",
            ),
            (
                f"serving acceptance per position, {key} prompts",
                ("serving", key, "acceptance_per_position"),
                "per position",
            ),
        )
    ),
)


def _before_after_rows(m: dict) -> list[str]:
    """The rows of the card's before/after table (``-`` where the earlier run lacks one)."""

    def cell(metrics: dict, path: tuple, fmt: str) -> str:
        value: object = metrics
        for key in path:
            try:
                value = value[key]  # type: ignore[index]
            except (KeyError, IndexError, TypeError):
                return "-"
        if fmt == "per position":
            return " / ".join(f"{a:.2f}" for a in value)  # type: ignore[attr-defined]
        return fmt.format(value)

    return [
        f"| {label} | {cell(m['before'], path, fmt)} | {cell(m, path, fmt)} |"
        for label, path, fmt in BEFORE_AFTER_ROWS
    ]


def eot_lines(m: dict) -> list[str]:
    """The card's end-of-text section: how the model learned to end its answers, how well it
    does, and the before/after table of a fine-tune from a checkpoint without the token."""
    eot, sv = m.get("end_of_text"), m.get("serving", {})
    if not eot:
        return []
    stop = sv.get("stop_max_tokens")

    def ends(run: str) -> str:
        return " and ".join(
            f"{sv[k][run]['stopped']} of {sv[k][run]['prompts']} {k} prompts (mean answer "
            f"{sv[k][run]['mean_tokens']:.0f} tokens; mean accepted length "
            f"{sv[k][run]['mean_accepted_length']:.2f})"
            for k in ("demo", "heldout")
            if run in sv.get(k, {})
        )

    lines = [
        "## End of text",
        "",
        f"Id 256 is `{EOT_TEXT}` (a special token of `tokenizer.json`, the tokenizer's "
        "`eos_token` and the config's EOS id; decoding leaves it out of the text). Training reads "
        "each file as documents the size of an answer: every top-level `def` or `class` with its "
        "decorators, and each run of other top-level lines between them "
        "(`fastdeploy_mtp.models.corpus.documents`), each followed by the token, so the model "
        "ends a function or a class with it and a request stops there (`finish_reason` "
        '`"stop"`).',
        "",
        f"Teacher forced on the held-out documents stream ({eot['windows']} windows of "
        f"{eot['window']} tokens, {eot['doc_ends']} document ends): next-token loss "
        f"{eot['loss']:.4f}; at "
        f"**{eot['recall']:.1%}** of the document ends the target's argmax is `{EOT_TEXT}` "
        f"(recall), and {eot['precision']:.1%} of its `{EOT_TEXT}` argmaxes fall at a document "
        "end (precision).",
        "",
        *(
            [
                f"Served (K = S = 3, up to {stop} new tokens), the answer ended with `{EOT_TEXT}` "
                f"greedily for {ends('until_stop')}; sampled (temperature "
                f"{sv['sampled']['temperature']}, top_p {sv['sampled']['top_p']}, seed "
                f"{sv['sampled']['seed']}, as the README's example) for "
                f"{ends('until_stop_sampled')}. Greedy decoding of a model this small falls into "
                "repetition (see the continuations below), most often a run of spaces, before it "
                "reaches the end of a function.",
                "",
            ]
            if "sampled" in sv
            else []
        ),
    ]
    if "before" in m:
        lines += [
            "Before and after the end-of-text stages (before: the checkpoint they started from, "
            "which had no end-of-text token; the serving rows mask the token, `ignore_eos`, so "
            f"every answer is {sv.get('max_tokens')} tokens long in both):",
            "",
            "| metric | before | after |",
            "|---|---|---|",
            *_before_after_rows(m),
            "",
        ]
    return lines


#: The config fields the dense tiny model's card lists (the others keep their defaults: no
#: MoE, no MLA).
TINY_CARD_FIELDS = (
    "vocab_size",
    "ori_vocab_size",
    "eos_token_ids",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rms_norm_eps",
    "rope_theta",
    "max_position_embeddings",
    "mtp_hidden_state",
    "mtp_concat_order",
    "block_size",
    "attention_bias",
    "mtp_final_norm",
    "num_nextn_predict_layers",
)


def vocab_sentence(config) -> str:
    """What the ids past the bytes are, for the card's opening paragraph."""
    if config.eos_token_ids:
        return (
            f"and id {config.eos_token_ids[0]} is `{EOT_TEXT}`, which ends an answer (the EOS id)"
        )
    return "and there is no end-of-text token"


def tiny_model_lines(config, m, weights_bytes, cfg_rows):
    """The card's title, files and model sections for the dense tiny model."""
    return [
        "# Tiny byte-level target model + MTP layer",
        "",
        "Shipped with `fastdeploy_mtp` so the proposer and the reference engine can be tested end "
        "to end on a CPU. It is a model folder like any other (`model_type: fastdeploy_mtp_tiny`): "
        "load it with `fastdeploy_mtp.models.load_model(fastdeploy_mtp.models.ASSETS_DIR)` (or "
        "`load_tiny()`), which returns `(target, mtp, config)`; tokens are bytes, ids 0..255 "
        "(`tokenizer.json`, read by `fastdeploy_mtp.tokenization.load_tokenizer`), "
        + vocab_sentence(config)
        + ", and its chat template (`tokenizer_config.json`) renders `role: content` lines then "
        "`assistant:`.",
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
        f"Vocabulary: {config.ori_vocab_size} ids padded to {config.vocab_size} (the "
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
    tiny = config.model_type == TINY_MODEL_TYPE
    cfg_rows = "\n".join(
        f"| `{k}` | {v} |" for k, v in config.to_dict().items() if not tiny or k in TINY_CARD_FIELDS
    )
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
        f"Held out: {c['heldout_files']} files, {c['heldout_bytes']} bytes."
        + (
            f" The end-of-text stages read the same files as documents (see End of text): "
            f"{c['train_documents']} train and {c['heldout_documents']} held-out documents."
            if "train_documents" in c
            else ""
        ),
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
        *eot_lines(m),
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

"""``fastdeploy-mtp``: run the shipped tiny checkpoint with and without MTP speculation.

fastdeploy-mtp demo [--num-speculative-tokens K] [--num-model-steps S] [--hybrid-ngram]
fastdeploy-mtp generate --prompt TEXT [--max-tokens N] [--num-speculative-tokens K] [--hybrid-ngram]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .config import CacheConfig, FDConfig, ModelConfig, SchedulerConfig, SpeculativeConfig

if TYPE_CHECKING:  # the CLI imports Paddle-backed modules only when a command runs
    from .models.model_config import ModelConfig as ArchConfig
    from .runtime.engine import Metrics


def build_config(arch: ArchConfig, k: int, steps: int, hybrid: bool, max_num_seqs: int, max_model_len: int) -> FDConfig:
    """FDConfig for the tiny checkpoint's architecture ``arch``; ``k = 0`` disables MTP. The
    byte model has no end-of-text token: a padded vocabulary id (never generated) stands in,
    so requests end at ``max_tokens``."""
    spec = (
        SpeculativeConfig(
            method="mtp",
            num_speculative_tokens=k,
            num_model_steps=min(steps, k),
            mtp_strategy="with_ngram" if hybrid else "default",
        )
        if k > 0
        else SpeculativeConfig(method=None)
    )
    w = k + 1
    return FDConfig(
        model_config=ModelConfig(
            max_model_len=max_model_len,
            vocab_size=arch.vocab_size,
            ori_vocab_size=arch.ori_vocab_size,
            hidden_size=arch.hidden_size,
            num_hidden_layers=arch.num_hidden_layers,
            eos_token_id=[arch.vocab_size - 1],
        ),
        speculative_config=spec,
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max(256, max_num_seqs * w + 64)
        ),
        cache_config=CacheConfig(
            block_size=arch.block_size, total_block_num=max_num_seqs * (-(-max_model_len // arch.block_size) + 3)
        ),
    )


def _progress(label: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        end = "\n" if done == total else ""
        print(f"\r  {label}: {done}/{total} requests done", end=end, file=sys.stderr, flush=True)

    return report


def run_prompts(
    prompts: Sequence[str],
    max_tokens: int,
    k: int,
    steps: int,
    hybrid: bool,
    max_num_seqs: int,
    label: str,
    checkpoint: str | None = None,
) -> tuple[list[str], list[list[int]], Metrics]:
    """Generate for ``prompts`` with the shipped checkpoint; returns (texts, token ids, metrics)."""
    from .models import ByteTokenizer, load_tiny
    from .runtime.engine import Engine
    from .runtime.request import Request

    target, mtp, arch = load_tiny(checkpoint)
    tok = ByteTokenizer()
    reqs = [Request(f"p{i}", tok.encode(p), max_tokens=max_tokens) for i, p in enumerate(prompts)]
    longest = max(len(r.prompt_token_ids) for r in reqs) + max_tokens + 2 * k + 8
    cfg = build_config(arch, k, steps, hybrid, max_num_seqs, longest)
    engine = Engine(cfg, target, mtp if k > 0 else None)
    out = engine.generate(reqs, progress=_progress(label))
    ids = [out[r.request_id] for r in reqs]
    texts = [tok.decode([t for t in seq if t < arch.ori_vocab_size]) for seq in ids]
    return texts, ids, engine.metrics


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    from .runtime.demo_prompts import DEMO_PROMPTS

    k = args.num_speculative_tokens
    source = args.checkpoint or "the shipped tiny checkpoint"
    print(
        f"fastdeploy-mtp demo: {source}, {len(DEMO_PROMPTS)} prompts, "
        f"{args.max_tokens} new tokens each, batch {args.max_num_seqs}",
        file=sys.stderr,
    )
    base_texts, base_ids, base = run_prompts(
        DEMO_PROMPTS, args.max_tokens, 0, 1, False, args.max_num_seqs, "without MTP", args.checkpoint
    )
    mode = f"MTP K={k} S={min(args.num_model_steps, k)}" + (" +ngram" if args.hybrid_ngram else "")
    spec_texts, spec_ids, spec = run_prompts(
        DEMO_PROMPTS,
        args.max_tokens,
        k,
        args.num_model_steps,
        args.hybrid_ngram,
        args.max_num_seqs,
        mode,
        args.checkpoint,
    )
    rows = [
        ["mode", "tokens/s", "target forwards", "mean accepted len", "acceptance per position", "speedup"],
        ["no speculation", f"{base.tokens_per_second:.1f}", str(base.target_forwards), "1.00", "-", "1.00x"],
        [
            mode,
            f"{spec.tokens_per_second:.1f}",
            str(spec.target_forwards),
            f"{spec.mean_accepted_length:.2f}",
            " ".join("-" if a is None else f"{a:.2f}" for a in spec.acceptance_per_position),
            f"{spec.tokens_per_second / base.tokens_per_second:.2f}x" if base.tokens_per_second else "-",
        ],
    ]
    print(_table(rows))
    print(f"\nsample ({DEMO_PROMPTS[0]!r} ->):\n{spec_texts[0]}")
    identical = spec_ids == base_ids
    print(f"\noutputs with and without MTP identical: {'yes' if identical else 'NO'}")
    return 0 if identical else 1


def cmd_generate(args: argparse.Namespace) -> int:
    k = args.num_speculative_tokens
    texts, _, metrics = run_prompts(
        [args.prompt], args.max_tokens, k, args.num_model_steps, args.hybrid_ngram, 1, "generate", args.checkpoint
    )
    print(args.prompt + texts[0])
    if k > 0:
        per_position = ["-" if a is None else round(a, 2) for a in metrics.acceptance_per_position]
        print(
            f"[mean accepted length {metrics.mean_accepted_length:.2f}, acceptance per position {per_position}]",
            file=sys.stderr,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fastdeploy-mtp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, k_default: int) -> None:
        p.add_argument("--num-speculative-tokens", type=int, default=k_default, help="K (0 = no MTP)")
        p.add_argument(
            "--num-model-steps",
            type=int,
            default=None,
            help="MTP substeps per round (1..K; default K, or 1 with --hybrid-ngram)",
        )
        p.add_argument("--hybrid-ngram", action="store_true", help="fill slots past the MTP steps by n-gram match")
        p.add_argument("--max-tokens", type=int, default=64)
        p.add_argument("--checkpoint", default=None, help="tiny checkpoint folder (default: the shipped one)")

    demo = sub.add_parser("demo", help="bundled prompts with and without MTP; a comparison table")
    common(demo, 3)
    demo.add_argument("--max-num-seqs", type=int, default=8)
    demo.set_defaults(func=cmd_demo)
    gen = sub.add_parser("generate", help="continue one prompt")
    common(gen, 3)
    gen.add_argument("--prompt", required=True)
    gen.set_defaults(func=cmd_generate)
    args = ap.parse_args(argv)
    if args.num_speculative_tokens < 0:
        ap.error("--num-speculative-tokens must be >= 0")
    if args.num_model_steps is None:
        args.num_model_steps = 1 if args.hybrid_ngram else max(args.num_speculative_tokens, 1)
    if args.num_model_steps < 1:
        ap.error("--num-model-steps must be >= 1")
    if args.max_tokens <= 0:
        ap.error("--max-tokens must be > 0")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

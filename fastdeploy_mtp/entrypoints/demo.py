"""``fastdeploy-mtp demo``: the bundled prompts with and without MTP, and a comparison table."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from ..config import SpeculativeConfig
from ..engine_args import UsageError, add_max_num_seqs_arg, add_sampling_args, speculation_label
from ..runtime.demo_prompts import DEMO_PROMPTS
from .demo_report import check_plot_path, comparison_table, plot_acceptance
from .demo_sweep import SWEEP_LEGEND, batch_sizes, run_sweep, sweep_table
from .offline import METRICS_LEGEND, add_offline_args, emit_json, resolve_offline_args, run_prompts

if TYPE_CHECKING:
    from ..runtime.engine_metrics import Metrics
    from ..runtime.sampling_params import SamplingParams

#: ``demo``'s batch slots by default: one prompt at a time, where speculation pays most on a
#: CPU (see :func:`batch_note`).
DEMO_MAX_NUM_SEQS = 1


def batch_note(max_num_seqs: int) -> str:
    """One line, printed under the demo table, on how the batch size changes the gain on a CPU:
    a target forward over a round's K + 1 tokens costs little more than over one token at
    batch 1, but at batch 8 the forward over K + 1 tokens per slot costs clearly more than over
    one per slot (the MTP substep grows too), so the same speculation gains much less."""
    where = (
        "try --max-num-seqs 8 to see it"
        if max_num_seqs == 1
        else f"as here at batch {max_num_seqs}; --max-num-seqs {DEMO_MAX_NUM_SEQS} is the default"
    )
    return (
        "note: on a CPU speculation pays most at batch 1, where verifying K+1 tokens costs little "
        "more than 1 token; in a larger batch verification costs more and the gain shrinks "
        f"({where})"
    )


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand to ``sub`` (an ``add_subparsers`` result)."""
    demo = sub.add_parser("demo", help="bundled prompts with and without MTP; a comparison table")
    add_offline_args(demo)
    add_max_num_seqs_arg(
        demo,
        DEMO_MAX_NUM_SEQS,
        f"batch slots (default {DEMO_MAX_NUM_SEQS}: where speculation pays most on a CPU)",
    )
    demo.add_argument(
        "--plot",
        metavar="FILE",
        default=None,
        help="bar chart of acceptance per draft position (PNG)",
    )
    demo.add_argument(
        "--batch-sizes",
        metavar="B,B,...",
        type=batch_sizes,
        default=None,
        help="instead of the comparison: a row per batch size B (B requests, B slots, each "
        "generating exactly --max-tokens tokens), e.g. 1,2,4,8,16,32,64,128",
    )
    add_sampling_args(demo, only=("temperature", "top_p", "seed"))
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    spec, sampling, model = resolve_offline_args(args)
    if not spec.enabled:
        raise UsageError(
            "demo compares decoding with and without MTP: it needs speculation (K > 0)"
        )
    if args.batch_sizes is not None:
        return _cmd_sweep(args, spec, sampling, model)
    if args.plot is not None:
        check_plot_path(args.plot)  # fail before the run, not after it
    source = args.model or "the shipped tiny checkpoint"
    print(
        f"fastdeploy-mtp demo: {source}, {len(DEMO_PROMPTS)} prompts, {args.max_tokens} new tokens "
        f"each, batch {args.max_num_seqs}",
        file=sys.stderr,
    )
    plain = SpeculativeConfig(method=None)
    runs = [
        run_prompts(
            DEMO_PROMPTS,
            args.max_tokens,
            s,
            args.max_num_seqs,
            speculation_label(s),
            model,
            sampling,
            dtype=args.dtype,
            tokenizer=args.tokenizer,
        )
        for s in (plain, spec)
    ]
    (_, base_ids, base), (spec_texts, spec_ids, metrics) = runs
    identical = spec_ids == base_ids
    speedup = metrics.tokens_per_second / base.tokens_per_second if base.tokens_per_second else None
    mode = speculation_label(spec)
    if args.plot is not None:
        plot_acceptance(args.plot, metrics, mode)
        print(f"acceptance per position plotted to {args.plot}", file=sys.stderr)
    if args.json:
        result = {
            "checkpoint": args.model,
            "num_prompts": len(DEMO_PROMPTS),
            "max_tokens": args.max_tokens,
            "max_num_seqs": args.max_num_seqs,
            "speculative_config": dataclasses.asdict(spec),
            "sampling": sampling.to_dict(),
        }
        rows = _rows_json(plain, base, spec, metrics, speedup, identical, spec_texts[0])
        emit_json({**result, **rows, "note": batch_note(args.max_num_seqs)})
        return 0 if identical else 1
    print(comparison_table(speculation_label(plain), base, mode, metrics, speedup))
    print(batch_note(args.max_num_seqs))
    print(METRICS_LEGEND)
    print(f"\nsample ({DEMO_PROMPTS[0]!r} ->):\n{spec_texts[0]}")
    print(f"\noutputs with and without MTP identical: {'yes' if identical else 'NO'}")
    return 0 if identical else 1


def _rows_json(
    plain: SpeculativeConfig,
    base: Metrics,
    spec: SpeculativeConfig,
    metrics: Metrics,
    speedup: float | None,
    identical: bool,
    sample: str,
) -> dict[str, Any]:
    """The measured part of ``demo --json``: a row per mode, the comparison, a sample."""
    return {
        "rows": [
            {"mode": speculation_label(plain), "speedup": 1.0, "metrics": base.as_dict()},
            {
                "mode": speculation_label(spec),
                "speedup": None if speedup is None else round(speedup, 3),
                "metrics": metrics.as_dict(),
            },
        ],
        "outputs_identical": identical,
        "sample": {"prompt": DEMO_PROMPTS[0], "text": sample},
    }


def _cmd_sweep(
    args: argparse.Namespace, spec: SpeculativeConfig, sampling: SamplingParams, model: str
) -> int:
    """``demo --batch-sizes``: the batch-size table (or its JSON); exit status 1 if any
    batch size's outputs differ with and without speculation."""
    if args.plot is not None:
        raise UsageError("--plot: not with --batch-sizes (it plots the comparison's run)")
    if args.max_num_seqs != DEMO_MAX_NUM_SEQS:
        raise UsageError(
            "--max-num-seqs: --batch-sizes gives each row as many slots as requests; leave "
            "--max-num-seqs out"
        )
    source = args.model or "the shipped tiny checkpoint"
    work = (
        f"every request generates exactly {args.max_tokens} tokens (ignore_eos: the end-of-text "
        "token is masked, so both sides do the same work)"
    )
    print(f"fastdeploy-mtp demo: {source}, batch sizes {args.batch_sizes}; {work}", file=sys.stderr)
    rows = run_sweep(args, spec, sampling, model)
    identical = all(r.identical for r in rows)
    if args.json:
        emit_json(
            {
                "checkpoint": args.model,
                "max_tokens": args.max_tokens,
                "ignore_eos": True,
                "speculative_config": dataclasses.asdict(spec),
                "mode": speculation_label(spec),
                "sampling": sampling.to_dict(),
                "rows": [r.as_dict() for r in rows],
                "outputs_identical": identical,
            }
        )
        return 0 if identical else 1
    print(f"{speculation_label(spec)} against no speculation; {work}\n")
    print(sweep_table(rows))
    print(SWEEP_LEGEND)
    print(f"\noutputs with and without speculation identical: {'yes' if identical else 'NO'}")
    return 0 if identical else 1

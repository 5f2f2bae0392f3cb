"""End-to-end benchmark on the shipped tiny checkpoint: mean accepted length, acceptance
per draft position, glue time per round and wall-clock speedup of MTP speculation over plain
decoding, measured in one run.

Rows: batch 1 and 8; K = 1, 2, 3 with the MTP layer drafting every slot (S = K) and with
the n-gram hybrid (S = 1, n-gram fills the rest); adaptive draft length off and on; and, with
``--checkpoint-3 DIR``, the same for a checkpoint with 3 distinct MTP layers; beside them the
model-free methods ``ngram`` and ``suffix`` at K = 3 (no MTP layer runs). Every speculative
run is checked token-for-token against the plain run (greedy equivalence). Prompts: the demo
prompts, plus held-out prompts (files the model never trained on) for the default
configuration, K = S = 3 and the model-free methods.

    python scripts/bench_e2e.py [--max-tokens 96] [--repeat 3] [--checkpoint-3 DIR] [--json out.json]

Each row is the median of ``--repeat`` runs (fresh engine each): single runs on a shared
2-core VM vary by 10-20%.

``--json F`` writes one object per row: ``method``, ``prompts``, ``batch``, ``layers``, ``k``, ``steps``,
``hybrid``, ``adaptive``, ``default`` (the configuration ``fastdeploy-mtp serve`` / ``demo`` use
when not told otherwise), ``mean_accepted_length``, ``acceptance_per_position``,
``glue_ms_per_round`` (time per engine step outside model forwards and logits), ``speedup``
(tokens/s over plain decoding of the same prompts at the same batch) and the raw metrics.

With ``--sampling`` it measures sampling instead (demo prompts, seed 7, top_p 1): at
temperature 0.7 and 1.0, TARGET_MATCH against REJECTION verification, for K = 1, 3 (S = K)
and the hybrid, at batch 1 and 8, each against plain sampling at the same temperature.
TARGET_MATCH runs are checked token-for-token against the plain run (seeded sampling is
exact under speculation); REJECTION runs are equal in distribution only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastdeploy_mtp.config import SpeculativeConfig  # noqa: E402
from fastdeploy_mtp.engine_args import default_speculative_config, speculative_config  # noqa: E402
from fastdeploy_mtp.entrypoints.offline import per_position_text, run_prompts  # noqa: E402
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS, heldout_prompts  # noqa: E402
from fastdeploy_mtp.runtime.sampling_params import SamplingParams  # noqa: E402

#: (K, S, hybrid) of the table.
CONFIGS = ((1, 1, False), (2, 2, False), (3, 3, False), (2, 1, True), (3, 1, True))
#: (method, K) rows of the model-free methods.
MODEL_FREE = (("ngram", 3), ("suffix", 3))
HEADER = (
    f"{'method':>6} {'prompts':>8} {'batch':>5} {'L':>2} {'K':>2} {'S':>2} {'hybrid':>6} {'adapt':>5} {'tok/s':>8} "
    f"{'accepted len':>12} {'glue ms':>8} {'speedup':>8}  per-position acceptance"
)


def spec_of(k: int, steps: int, hybrid: bool, adaptive: bool):
    spec = speculative_config(k, steps, hybrid)
    spec.adaptive_draft_length = adaptive
    return spec


def default_key() -> tuple[int, int, bool, bool]:
    """(K, S, hybrid, adaptive) of the configuration serve/demo use when not told otherwise."""
    spec = default_speculative_config()
    return (
        spec.num_speculative_tokens,
        spec.num_model_steps,
        spec.mtp_strategy == "with_ngram",
        spec.adaptive_draft_length,
    )


def median_run(repeat: int, prompts, max_tokens, spec, batch, label, checkpoint):
    """``repeat`` runs of the same configuration (a fresh engine each, as a server restart);
    returns the token ids (identical across runs: greedy) and the metrics of the run with the
    median tokens/s, so one noisy run does not decide a row."""
    runs = []
    for _ in range(repeat):
        _, ids, m = run_prompts(prompts, max_tokens, spec, batch, label, checkpoint)
        if runs and ids != runs[0][0]:
            raise SystemExit(f"{label}: tokens differ between repeated runs")
        runs.append((ids, m))
    runs.sort(key=lambda r: r[1].tokens_per_second)
    return runs[len(runs) // 2]


def greedy_table(args) -> list[dict]:
    from fastdeploy_mtp.models import load_tiny

    shipped_layers = load_tiny(args.checkpoint)[2].num_nextn_predict_layers
    variants = [(shipped_layers, args.checkpoint)]
    if args.checkpoint_3:
        variants.append(
            (load_tiny(args.checkpoint_3)[2].num_nextn_predict_layers, args.checkpoint_3)
        )
    default = default_key()
    prompt_sets = {"demo": DEMO_PROMPTS, "heldout": heldout_prompts()}
    rows = []
    print(HEADER)
    for batch in (1, 8):
        for name, prompts in prompt_sets.items():
            base_ids, base = median_run(
                args.repeat,
                prompts,
                args.max_tokens,
                speculative_config(0),
                batch,
                f"{name} batch {batch} plain",
                args.checkpoint,
            )
            print(
                f"{'none':>6} {name:>8} {batch:>5} {'-':>2} {0:>2} {'-':>2} {'-':>6} {'-':>5} "
                f"{base.tokens_per_second:8.1f} {1.0:12.2f} {base.glue_ms_per_round:8.2f} {1.0:7.2f}x  -",
                flush=True,
            )
            for layers, ckpt in variants:
                for k, steps, hybrid in CONFIGS:
                    for adaptive in (False, True):
                        key = (k, steps, hybrid, adaptive)
                        is_default = key == default and ckpt == args.checkpoint
                        if name == "heldout" and not (
                            is_default or (k, steps, hybrid) == (3, 3, False)
                        ):
                            continue
                        label = (
                            f"{name} batch {batch} L={layers} K={k} S={steps} adaptive={adaptive}"
                        )
                        ids, m = median_run(
                            args.repeat, prompts, args.max_tokens, spec_of(*key), batch, label, ckpt
                        )
                        if ids != base_ids:
                            raise SystemExit(f"{label}: tokens differ from plain decoding")
                        speedup = m.tokens_per_second / base.tokens_per_second
                        print(
                            f"{'mtp':>6} {name:>8} {batch:>5} {layers:>2} {k:>2} {steps:>2} {str(hybrid):>6} "
                            f"{'on' if adaptive else 'off':>5} {m.tokens_per_second:8.1f} "
                            f"{m.mean_accepted_length:12.2f} {m.glue_ms_per_round:8.2f} {speedup:7.2f}x  "
                            f"{per_position_text(m)}{'   <- default' if is_default else ''}",
                            flush=True,
                        )
                        rows.append(
                            dict(
                                method="mtp",
                                prompts=name,
                                batch=batch,
                                layers=layers,
                                k=k,
                                steps=steps,
                                hybrid=hybrid,
                                adaptive=adaptive,
                                default=is_default,
                                **m.as_dict(),
                                speedup=round(speedup, 4),
                                plain_glue_ms_per_round=round(base.glue_ms_per_round, 4),
                            )
                        )
            for method, k in MODEL_FREE:
                spec = SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": k})
                label = f"{name} batch {batch} {method} K={k}"
                ids, m = median_run(
                    args.repeat, prompts, args.max_tokens, spec, batch, label, args.checkpoint
                )
                if ids != base_ids:
                    raise SystemExit(f"{label}: tokens differ from plain decoding")
                speedup = m.tokens_per_second / base.tokens_per_second
                print(
                    f"{method:>6} {name:>8} {batch:>5} {'-':>2} {k:>2} {'-':>2} {'-':>6} {'off':>5} "
                    f"{m.tokens_per_second:8.1f} {m.mean_accepted_length:12.2f} {m.glue_ms_per_round:8.2f} "
                    f"{speedup:7.2f}x  {per_position_text(m)}",
                    flush=True,
                )
                rows.append(
                    dict(
                        method=method,
                        prompts=name,
                        batch=batch,
                        layers=0,
                        k=k,
                        steps=0,
                        hybrid=False,
                        adaptive=False,
                        default=False,
                        **m.as_dict(),
                        speedup=round(speedup, 4),
                        plain_glue_ms_per_round=round(base.glue_ms_per_round, 4),
                    )
                )
    return rows


def sampling_table(max_tokens: int, checkpoint: str | None) -> list[dict]:
    """The ``--sampling`` rows (see the module docstring)."""
    rows = []
    print(
        f"{'T':>4} {'verify':>12} {'batch':>5} {'K':>2} {'S':>2} {'hybrid':>6} {'tok/s':>8} {'accepted len':>12} "
        f"{'speedup':>8}  per-position acceptance"
    )
    for temperature in (0.7, 1.0):
        sp = SamplingParams(temperature=temperature, seed=7)
        for batch in (1, 8):
            label = f"T={temperature} batch {batch} plain"
            _, base_ids, base = run_prompts(
                DEMO_PROMPTS, max_tokens, speculative_config(0), batch, label, checkpoint, sp
            )
            print(
                f"{temperature:>4} {'-':>12} {batch:>5} {0:>2} {'-':>2} {'-':>6} {base.tokens_per_second:8.1f}"
            )
            for strategy in ("target_match", "rejection"):
                for k, steps, hybrid in ((1, 1, False), (3, 3, False), (3, 1, True)):
                    spec = speculative_config(k, steps, hybrid)
                    spec.verify_strategy = strategy
                    label = f"T={temperature} {strategy} batch {batch} K={k}"
                    _, ids, m = run_prompts(
                        DEMO_PROMPTS, max_tokens, spec, batch, label, checkpoint, sp
                    )
                    if strategy == "target_match" and ids != base_ids:
                        raise SystemExit(
                            f"{label}: seeded TARGET_MATCH tokens differ from plain sampling"
                        )
                    speedup = m.tokens_per_second / base.tokens_per_second
                    per_pos = per_position_text(m)
                    print(
                        f"{temperature:>4} {strategy:>12} {batch:>5} {k:>2} {steps:>2} {str(hybrid):>6} "
                        f"{m.tokens_per_second:8.1f} {m.mean_accepted_length:12.2f} {speedup:7.2f}x  {per_pos}",
                        flush=True,
                    )
                    rows.append(
                        dict(
                            temperature=temperature,
                            verify_strategy=strategy,
                            batch=batch,
                            k=k,
                            steps=steps,
                            hybrid=hybrid,
                            **m.as_dict(),
                            speedup=speedup,
                        )
                    )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument(
        "--checkpoint", default=None, help="tiny checkpoint folder (default: the shipped one)"
    )
    ap.add_argument(
        "--checkpoint-3", default=None, help="a checkpoint with 3 distinct MTP layers to compare"
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs per row; the row reports the median tokens/s (default 3)",
    )
    ap.add_argument(
        "--sampling", action="store_true", help="the sampling table (see above) instead"
    )
    args = ap.parse_args()
    rows = sampling_table(args.max_tokens, args.checkpoint) if args.sampling else greedy_table(args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

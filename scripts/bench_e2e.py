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

    python scripts/bench_e2e.py [--max-tokens 96] [--repeat 3] [--checkpoint-3 DIR]
                                [--json out.json]

Each row is the median of ``--repeat`` runs (fresh engine each): single runs on a shared
2-core VM vary by 10-20%.

``--json F`` writes one object per row: ``method``, ``prompts``, ``batch``, ``layers``, ``k``,
``steps``, ``hybrid``, ``adaptive``, ``default`` (the configuration ``fastdeploy-mtp serve`` /
``demo`` use when not told otherwise), ``mean_accepted_length``, ``acceptance_per_position``,
``glue_ms_per_round`` (time per engine step outside model forwards and logits), ``speedup``
(tokens/s over plain decoding of the same prompts at the same batch) and the raw metrics.

With ``--sampling`` it measures sampling instead (demo prompts, seed 7, top_p 1): at
temperature 0.7 and 1.0, TARGET_MATCH against REJECTION verification, for K = 1, 3 (S = K)
and the hybrid, at batch 1 and 8, each against plain sampling at the same temperature.
TARGET_MATCH runs are checked token-for-token against the plain run (seeded sampling is
exact under speculation); REJECTION runs are equal in distribution only.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_report import bench_parser, write_json  # noqa: E402

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
    f"{'method':>6} {'prompts':>8} {'batch':>5} {'L':>2} {'K':>2} {'S':>2} {'hybrid':>6} "
    f"{'adapt':>5} {'tok/s':>8} {'accepted len':>12} {'glue ms':>8} {'speedup':>8}  "
    "per-position acceptance"
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


def table_line(cells, tokens_per_second, accepted, glue_ms, speedup, tail) -> str:
    """One printed row of the greedy table: `cells` are its (method, prompts, batch, L, K, S,
    hybrid, adaptive) columns as printed, then the measured columns and `tail`."""
    method, prompts, batch, layers, k, steps, hybrid, adaptive = cells
    return (
        f"{method:>6} {prompts:>8} {batch:>5} {layers:>2} {k:>2} {steps:>2} {hybrid:>6} "
        f"{adaptive:>5} {tokens_per_second:8.1f} {accepted:12.2f} {glue_ms:8.2f} "
        f"{speedup:7.2f}x  {tail}"
    )


def measured_row(args, plain, run, cells, fields, tail="") -> dict:
    """The median of ``args.repeat`` runs of ``run`` = (prompts, spec, batch, label,
    checkpoint), checked token for token against ``plain`` = (token ids, metrics) of plain
    decoding, printed as `cells` and returned as `fields` with the metrics and the speedup."""
    base_ids, base = plain
    prompts, spec, batch, label, checkpoint = run
    ids, m = median_run(args.repeat, prompts, args.max_tokens, spec, batch, label, checkpoint)
    if ids != base_ids:
        raise SystemExit(f"{label}: tokens differ from plain decoding")
    speedup = m.tokens_per_second / base.tokens_per_second
    numbers = (m.tokens_per_second, m.mean_accepted_length, m.glue_ms_per_round, speedup)
    print(table_line(cells, *numbers, per_position_text(m) + tail), flush=True)
    return dict(
        **fields,
        **m.as_dict(),
        speedup=round(speedup, 4),
        plain_glue_ms_per_round=round(base.glue_ms_per_round, 4),
    )


def mtp_rows(args, plain, name, prompts, batch, variants) -> list[dict]:
    """The MTP rows of one prompt set and batch: every (layers, checkpoint) variant, K, S,
    hybrid and adaptive setting (held-out prompts: the default and K = S = 3 only)."""
    default = default_key()
    rows = []
    for layers, ckpt in variants:
        for k, steps, hybrid in CONFIGS:
            for adaptive in (False, True):
                key = (k, steps, hybrid, adaptive)
                is_default = key == default and ckpt == args.checkpoint
                if name == "heldout" and not (is_default or (k, steps, hybrid) == (3, 3, False)):
                    continue
                label = f"{name} batch {batch} L={layers} K={k} S={steps} adaptive={adaptive}"
                on = "on" if adaptive else "off"
                cells = ("mtp", name, batch, layers, k, steps, str(hybrid), on)
                fields = dict(method="mtp", prompts=name, batch=batch, layers=layers, k=k)
                fields.update(steps=steps, hybrid=hybrid, adaptive=adaptive, default=is_default)
                run = (prompts, spec_of(*key), batch, label, ckpt)
                tail = "   <- default" if is_default else ""
                rows.append(measured_row(args, plain, run, cells, fields, tail))
    return rows


def model_free_rows(args, plain, name, prompts, batch) -> list[dict]:
    """The rows of the model-free methods (no MTP layer runs) for one prompt set and batch."""
    rows = []
    for method, k in MODEL_FREE:
        spec = SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": k})
        label = f"{name} batch {batch} {method} K={k}"
        cells = (method, name, batch, "-", k, "-", "-", "off")
        fields = dict(method=method, prompts=name, batch=batch, layers=0, k=k, steps=0)
        fields.update(hybrid=False, adaptive=False, default=False)
        run = (prompts, spec, batch, label, args.checkpoint)
        rows.append(measured_row(args, plain, run, cells, fields))
    return rows


def greedy_table(args) -> list[dict]:
    from fastdeploy_mtp.models import load_tiny

    shipped_layers = load_tiny(args.checkpoint)[2].num_nextn_predict_layers
    variants = [(shipped_layers, args.checkpoint)]
    if args.checkpoint_3:
        variants.append(
            (load_tiny(args.checkpoint_3)[2].num_nextn_predict_layers, args.checkpoint_3)
        )
    prompt_sets = {"demo": DEMO_PROMPTS, "heldout": heldout_prompts()}
    rows = []
    print(HEADER)
    for batch in (1, 8):
        for name, prompts in prompt_sets.items():
            label = f"{name} batch {batch} plain"
            plain = median_run(
                args.repeat,
                prompts,
                args.max_tokens,
                speculative_config(0),
                batch,
                label,
                args.checkpoint,
            )
            base = plain[1]
            cells = ("none", name, batch, "-", 0, "-", "-", "-")
            line = table_line(cells, base.tokens_per_second, 1.0, base.glue_ms_per_round, 1.0, "-")
            print(line, flush=True)
            rows += mtp_rows(args, plain, name, prompts, batch, variants)
            rows += model_free_rows(args, plain, name, prompts, batch)
    return rows


def sampling_rows(plain, temperature, batch, max_tokens, checkpoint) -> list[dict]:
    """The speculative rows of the ``--sampling`` table at one temperature and batch, against
    ``plain`` = (token ids, metrics) of plain sampling."""
    base_ids, base = plain
    sp = SamplingParams(temperature=temperature, seed=7)
    rows = []
    for strategy in ("target_match", "rejection"):
        for k, steps, hybrid in ((1, 1, False), (3, 3, False), (3, 1, True)):
            spec = speculative_config(k, steps, hybrid)
            spec.verify_strategy = strategy
            label = f"T={temperature} {strategy} batch {batch} K={k}"
            _, ids, m = run_prompts(DEMO_PROMPTS, max_tokens, spec, batch, label, checkpoint, sp)
            if strategy == "target_match" and ids != base_ids:
                raise SystemExit(f"{label}: seeded TARGET_MATCH tokens differ from plain sampling")
            speedup = m.tokens_per_second / base.tokens_per_second
            print(
                f"{temperature:>4} {strategy:>12} {batch:>5} {k:>2} {steps:>2} {str(hybrid):>6} "
                f"{m.tokens_per_second:8.1f} {m.mean_accepted_length:12.2f} {speedup:7.2f}x  "
                f"{per_position_text(m)}",
                flush=True,
            )
            fields = dict(temperature=temperature, verify_strategy=strategy, batch=batch, k=k)
            rows.append(dict(**fields, steps=steps, hybrid=hybrid, **m.as_dict(), speedup=speedup))
    return rows


def sampling_table(max_tokens: int, checkpoint: str | None) -> list[dict]:
    """The ``--sampling`` rows (see the module docstring)."""
    rows = []
    print(
        f"{'T':>4} {'verify':>12} {'batch':>5} {'K':>2} {'S':>2} {'hybrid':>6} {'tok/s':>8} "
        f"{'accepted len':>12} {'speedup':>8}  per-position acceptance"
    )
    for temperature in (0.7, 1.0):
        sp = SamplingParams(temperature=temperature, seed=7)
        for batch in (1, 8):
            label = f"T={temperature} batch {batch} plain"
            _, base_ids, base = run_prompts(
                DEMO_PROMPTS, max_tokens, speculative_config(0), batch, label, checkpoint, sp
            )
            print(
                f"{temperature:>4} {'-':>12} {batch:>5} {0:>2} {'-':>2} {'-':>6} "
                f"{base.tokens_per_second:8.1f}"
            )
            plain = (base_ids, base)
            rows += sampling_rows(plain, temperature, batch, max_tokens, checkpoint)
    return rows


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument(
        "--checkpoint", default=None, help="tiny checkpoint folder (default: the shipped one)"
    )
    ap.add_argument(
        "--checkpoint-3", default=None, help="a checkpoint with 3 distinct MTP layers to compare"
    )
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
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

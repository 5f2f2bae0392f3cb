"""Structured-output benchmark on the shipped tiny checkpoint: what speculative drafting gains
under grammar constraints, and what the grammar work costs, measured in one run.

Rows: batch 8 and 1 over the demo prompts; drafting off, MTP K = 3 S = 3, MTP K = 3 S = 1 with
the n-gram hybrid, ``ngram`` K = 3 and ``suffix`` K = 3; each with no constraint and with the
requests constrained (a mix: request ``i`` gets a JSON schema, a regex or a choice by
``i % 3``). Columns: tokens/s, mean accepted length, drafts checked against a grammar and the
share of them cut before verification, grammar host milliseconds per round
(``guided_seconds / guided_rounds``) and their share of the generation loop's wall time, and
the speed-up over drafting off under the same constraints at the same batch.

Every speculative run is checked token-for-token against the run without drafting under the
same constraints (the target decides every token, so drafting must not change one); the script
exits with an error naming the row otherwise.

    python scripts/bench_guided.py [--max-tokens 64] [--repeat 3] [--batch 8 1] [--json out.json]

Each row is the median (by tokens/s) of ``--repeat`` runs, a fresh engine each, and its
speed-up the median of its per-repeat ratios; the repeats run the rows round-robin, so a
change in the machine's load hits every row alike. Single runs on a shared 2-core VM still
vary by 10-20% or more: compare rows of one run.

``--json F`` writes one object per row: ``method``, ``k``, ``steps``, ``hybrid``, ``batch``,
``constrained``, ``guided_drafts_checked``, ``guided_drafts_cut``, ``guided_ms_per_round``,
``guided_share`` (grammar seconds / wall seconds), ``speedup`` and the raw metrics
(:meth:`~fastdeploy_mtp.runtime.engine_metrics.Metrics.as_dict`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_report import bench_parser, write_json  # noqa: E402

from fastdeploy_mtp.config import SpeculativeConfig  # noqa: E402
from fastdeploy_mtp.engine_args import speculative_config  # noqa: E402
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS  # noqa: E402

#: The constraints request ``i`` gets by ``i % 3`` in a constrained run.
CONSTRAINTS: tuple[dict[str, Any], ...] = (
    {
        "kind": "json",
        "spec": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 12},
                "size": {"type": "integer", "minimum": 0, "maximum": 999},
                "items": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 8},
                    "maxItems": 3,
                },
            },
            "required": ["name", "size", "items"],
            "additionalProperties": False,
        },
    },
    {"kind": "regex", "spec": r"(self\.)?[a-z_]{1,12}( = [a-z_]{1,12}\([a-z_, ]{0,16}\))?\n"},
    {"kind": "choice", "spec": ["return None", "return self", "raise ValueError(name)", "pass"]},
)
#: (method, K, S, hybrid) of the rows, drafting off first (S is 0 for the model-free methods).
CONFIGS = (
    ("none", 0, 0, False),
    ("mtp", 3, 3, False),
    ("mtp", 3, 1, True),
    ("ngram", 3, 0, False),
    ("suffix", 3, 0, False),
)


def spec_of(method: str, k: int, steps: int, hybrid: bool) -> SpeculativeConfig:
    """The speculation of a :data:`CONFIGS` row."""
    if method in ("none", "mtp"):
        return speculative_config(k, steps or None, hybrid)
    return SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": k})


def label_of(method: str, k: int, steps: int, hybrid: bool) -> str:
    """``"mtp K3 S1+ng"``: a row's drafting as the table prints it."""
    if method == "none":
        return method
    return f"{method} K{k}" + (f" S{steps}" if steps else "") + ("+ng" if hybrid else "")


HEADER = (
    f"{'drafting':>13} {'batch':>5} {'constraint':>10} {'tok/s':>8} {'acc len':>7} {'checked':>7} "
    f"{'cut':>6} {'cut %':>6} {'gram ms/rd':>10} {'gram %':>6} {'speedup':>8}"
)


def run_once(
    spec: SpeculativeConfig, batch: int, constrained: bool, max_tokens: int
) -> tuple[list[list[int]], Any]:
    """One generation of the demo prompts (greedy; with the mixed constraints if
    ``constrained``) on a fresh engine of ``batch`` slots; returns (output token ids per
    prompt, the run's :class:`~fastdeploy_mtp.runtime.engine_metrics.Metrics`)."""
    from fastdeploy_mtp.assembly import build_engine
    from fastdeploy_mtp.engine_args import build_config
    from fastdeploy_mtp.models import ASSETS_DIR, load_model
    from fastdeploy_mtp.runtime.request import Request
    from fastdeploy_mtp.runtime.sampling_params import SamplingParams
    from fastdeploy_mtp.tokenization import load_generation_config, load_tokenizer

    target, mtp, arch = load_model(ASSETS_DIR)
    tok = load_tokenizer(ASSETS_DIR)
    eos = list(
        dict.fromkeys(
            [
                *tok.eos_token_ids,
                *load_generation_config(ASSETS_DIR).eos_token_ids,
                *arch.eos_token_ids,
            ]
        )
    )
    reqs = [
        Request(
            f"p{i}",
            tok.encode(p),
            max_tokens=max_tokens,
            sampling=SamplingParams(
                stop_token_ids=eos,
                guided=CONSTRAINTS[i % len(CONSTRAINTS)] if constrained else None,
            ),
        )
        for i, p in enumerate(DEMO_PROMPTS)
    ]
    k = spec.num_speculative_tokens if spec.enabled else 0
    longest = max(len(r.prompt_token_ids) for r in reqs) + max_tokens + 2 * k + 8
    cfg = build_config(arch, spec, batch, longest)
    cfg.model_config.model = ASSETS_DIR  # the grammars run on its tokenizer.json
    with build_engine(cfg, target, mtp if spec.uses_mtp else None) as engine:
        engine.generate(reqs)
    return [list(r.output_token_ids) for r in reqs], engine.metrics


def group_runs(args: argparse.Namespace, batch: int, constrained: bool) -> list[tuple[Any, float]]:
    """Every :data:`CONFIGS` row at ``batch`` with or without the constraints, ``--repeat``
    times round-robin (each repeat runs every row once, so a change in the machine's load
    hits the rows alike). Per row: the metrics of the run with the median tokens/s, and the
    median over repeats of its tokens/s over the same repeat's run without drafting. Exits
    when a row's tokens differ between repeats or from the run without drafting."""
    names = [
        f"batch {batch} {'constrained' if constrained else 'free'} {label_of(*c)}" for c in CONFIGS
    ]
    ids: list[list[list[int]]] = [[] for _ in CONFIGS]
    metrics: list[list[Any]] = [[] for _ in CONFIGS]
    for _ in range(args.repeat):
        for i, config in enumerate(CONFIGS):
            out, m = run_once(spec_of(*config), batch, constrained, args.max_tokens)
            if ids[i] and out != ids[i]:
                raise SystemExit(f"{names[i]}: tokens differ between repeated runs")
            if i and out != ids[0]:
                raise SystemExit(f"{names[i]}: tokens differ from the run without drafting")
            ids[i] = out
            metrics[i].append(m)
    rows = []
    for runs in metrics:
        ratios = sorted(m.tokens_per_second / b.tokens_per_second for m, b in zip(runs, metrics[0]))
        rows.append(
            (
                sorted(runs, key=lambda m: m.tokens_per_second)[len(runs) // 2],
                ratios[len(ratios) // 2],
            )
        )
    return rows


def row_of(
    config: tuple[str, int, int, bool], batch: int, constrained: bool, m: Any, speedup: float
) -> dict[str, Any]:
    """Print one table row and return its ``--json`` object."""
    checked, cut = m.guided_drafts_checked, m.guided_drafts_cut
    share = m.guided_seconds / m.wall_seconds if m.wall_seconds else 0.0
    cut_pct = f"{100.0 * cut / checked:5.1f}%" if checked else f"{'-':>6}"
    print(
        f"{label_of(*config):>13} {batch:>5} {'mixed' if constrained else 'none':>10} "
        f"{m.tokens_per_second:8.1f} {m.mean_accepted_length:7.2f} {checked:7d} {cut:6d} {cut_pct} "
        f"{m.guided_ms_per_round:10.3f} {100.0 * share:5.1f}% {speedup:7.2f}x",
        flush=True,
    )
    method, k, steps, hybrid = config
    return dict(
        method=method,
        k=k,
        steps=steps,
        hybrid=hybrid,
        batch=batch,
        constrained=constrained,
        guided_drafts_checked=checked,
        guided_drafts_cut=cut,
        guided_ms_per_round=round(m.guided_ms_per_round, 4),
        guided_share=round(share, 4),
        speedup=round(speedup, 4),
        **m.as_dict(),
    )


def table(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    print(HEADER)
    for batch in args.batch:
        for constrained in (False, True):
            for config, (m, speedup) in zip(CONFIGS, group_runs(args, batch, constrained)):
                rows.append(row_of(config, batch, constrained, m, speedup))
    return rows


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs per row; the row reports the median (default 3)"
    )
    ap.add_argument(
        "--batch", type=int, nargs="+", default=[8, 1], help="batch sizes (default 8 1)"
    )
    args = ap.parse_args()
    rows = table(args)
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

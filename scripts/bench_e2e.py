"""End-to-end benchmark on the shipped tiny checkpoint: mean accepted length and wall-clock
speedup of MTP speculation over plain decoding, at batch 1 and 8, for K = 1, 2, 3 with the
MTP layer drafting every slot (S = K) and with the n-gram hybrid (S = 1, n-gram fills the
rest). Ratios are measured in one run; every speculative run is checked token-for-token
against the plain run (greedy equivalence).

    python scripts/bench_e2e.py [--max-tokens 96] [--json out.json]

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

from fastdeploy_mtp.cli import per_position_text, run_prompts, speculative_config  # noqa: E402
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS  # noqa: E402
from fastdeploy_mtp.runtime.sampling_params import SamplingParams  # noqa: E402


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
            print(f"{temperature:>4} {'-':>12} {batch:>5} {0:>2} {'-':>2} {'-':>6} {base.tokens_per_second:8.1f}")
            for strategy in ("target_match", "rejection"):
                for k, steps, hybrid in ((1, 1, False), (3, 3, False), (3, 1, True)):
                    spec = speculative_config(k, steps, hybrid)
                    spec.verify_strategy = strategy
                    label = f"T={temperature} {strategy} batch {batch} K={k}"
                    _, ids, m = run_prompts(DEMO_PROMPTS, max_tokens, spec, batch, label, checkpoint, sp)
                    if strategy == "target_match" and ids != base_ids:
                        raise SystemExit(f"{label}: seeded TARGET_MATCH tokens differ from plain sampling")
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--sampling", action="store_true", help="the sampling table (see above) instead")
    args = ap.parse_args()
    if args.sampling:
        rows = sampling_table(args.max_tokens, args.checkpoint)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return 0
    rows = []
    header = (
        f"{'batch':>5} {'K':>2} {'S':>2} {'hybrid':>6} {'tok/s':>8} {'accepted len':>12} {'speedup':>8}"
        "  per-position acceptance"
    )
    print(header)
    for batch in (1, 8):
        _, base_ids, base = run_prompts(
            DEMO_PROMPTS, args.max_tokens, speculative_config(0), batch, f"batch {batch} plain", args.checkpoint
        )
        print(
            f"{batch:>5} {0:>2} {'-':>2} {'-':>6} {base.tokens_per_second:8.1f} {1.0:12.2f} {1.0:7.2f}x  -", flush=True
        )
        for k in (1, 2, 3):
            for hybrid in (False, True):
                if hybrid and k == 1:
                    continue  # the hybrid needs K > S = 1
                steps = 1 if hybrid else k
                spec = speculative_config(k, steps, hybrid)
                _, ids, m = run_prompts(
                    DEMO_PROMPTS, args.max_tokens, spec, batch, f"batch {batch} K={k}", args.checkpoint
                )
                if ids != base_ids:
                    raise SystemExit(f"batch {batch} K={k} hybrid={hybrid}: tokens differ from plain decoding")
                speedup = m.tokens_per_second / base.tokens_per_second
                per_pos = per_position_text(m)
                print(
                    f"{batch:>5} {k:>2} {steps:>2} {str(hybrid):>6} {m.tokens_per_second:8.1f} "
                    f"{m.mean_accepted_length:12.2f} {speedup:7.2f}x  {per_pos}",
                    flush=True,
                )
                rows.append(dict(batch=batch, k=k, steps=steps, hybrid=hybrid, **m.as_dict(), speedup=speedup))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The draft planner's method mix on a workload of repetitive and free-form requests: the
shipped checkpoint, the default configuration, one batch mixing both kinds, real step times.

Repetitive requests continue text that repeats a line (the n-gram and suffix methods' ground);
free-form ones are the demo prompts. Per kind it reports the drafts each method made, their
acceptance and the kind's mean accepted length, and checks every output against plain decoding.

    python scripts/bench_method_mix.py [--max-tokens 128] [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_report import bench_parser, print_table, write_json  # noqa: E402

from fastdeploy_mtp.assembly import build_engine  # noqa: E402
from fastdeploy_mtp.engine_args import (  # noqa: E402
    build_config,
    default_speculative_config,
    speculative_config,  # noqa: E402
)
from fastdeploy_mtp.models import load_tiny  # noqa: E402
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS  # noqa: E402
from fastdeploy_mtp.runtime.draft_methods import METHOD_LABELS  # noqa: E402
from fastdeploy_mtp.runtime.request import Request  # noqa: E402
from fastdeploy_mtp.runtime.sampling_params import SamplingParams  # noqa: E402

REPETITIVE = [
    "    x = compute(x)\n" * 6,
    "assert value == 1\n" * 6,
    "for i in range(10):\n    total += i\n" * 3,
    "name = 'alpha'\nname = 'alpha'\n" * 3,
]
FREE_FORM = DEMO_PROMPTS[:4]


def requests(max_tokens: int) -> list[Request]:
    out = []
    for kind, prompts in (("repetitive", REPETITIVE), ("free-form", FREE_FORM)):
        for i, text in enumerate(prompts):
            sp = SamplingParams(ignore_eos=True)
            out.append(
                Request(f"{kind}-{i}", list(text.encode()), max_tokens=max_tokens, sampling=sp)
            )
    return out


def run(spec, max_tokens: int, seen: dict | None = None) -> dict[str, list[int]]:
    target, mtp, arch = load_tiny()
    cfg = build_config(arch, spec, len(REPETITIVE) + len(FREE_FORM), 512)
    engine = build_engine(cfg, target, mtp if spec.enabled else None)
    if seen is not None:
        execute = engine.runner.execute

        def counted():
            out = execute()
            for idx, state in engine.scheduler.slots.items():
                code, kind = int(out.draft_methods[idx]), state.request.request_id.rsplit("-", 1)[0]
                if code >= 0 and out.decode_mask[idx]:
                    n = int((out.drafts[idx] >= 0).sum())
                    acc = max(int(out.accept_num[idx]) - 1, 0)
                    seen[kind][METHOD_LABELS[code]] += n
                    seen[kind][METHOD_LABELS[code] + " accepted"] += min(acc, n)
                if out.decode_mask[idx]:
                    seen[kind]["steps"] += 1
                    seen[kind]["emitted"] += int(out.accept_num[idx])
            return out

        engine.runner.execute = counted
    return engine.generate(requests(max_tokens))


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    plain = run(speculative_config(0, None, False), args.max_tokens)
    rows = []
    for r in range(args.repeat):
        seen: dict = collections.defaultdict(collections.Counter)
        out = run(default_speculative_config(), args.max_tokens, seen)
        assert out == plain, "speculative output differs from plain decoding"
        for kind in ("repetitive", "free-form"):
            c = seen[kind]
            drafts = {m: c[m] for m in METHOD_LABELS if c[m]}
            total = sum(drafts.values()) or 1
            rows.append(
                {
                    "repeat": r,
                    "kind": kind,
                    "mix": {m: round(n / total, 3) for m, n in drafts.items()},
                    "acceptance": {m: round(c[m + " accepted"] / c[m], 3) for m in drafts},
                    "mean_accepted_length": round(c["emitted"] / max(c["steps"], 1), 3),
                }
            )
    print_table(
        [
            "repeat",
            "requests",
            "method mix (share of drafts)",
            "acceptance per method",
            "mean accepted len",
        ],
        (
            [
                str(row["repeat"] + 1),
                row["kind"],
                " ".join(f"{m} {s:.0%}" for m, s in row["mix"].items()),
                " ".join(f"{m} {a:.2f}" for m, a in row["acceptance"].items()),
                f"{row['mean_accepted_length']:.2f}",
            ]
            for row in rows
        ),
    )
    print("outputs equal plain decoding: yes")
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``demo --batch-sizes``: one row per batch size, plain decoding against the configured
speculation with every request running to ``--max-tokens``; and the column formats that
``scripts/bench_serve.py --batch-sizes`` shares with it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import SpeculativeConfig
from ..engine_args import positive_int, speculation_label
from ..runtime.demo_prompts import DEMO_PROMPTS
from ..runtime.sampling_params import SamplingParams
from .demo_report import table
from .offline import run_prompts

if TYPE_CHECKING:
    from ..runtime.engine_metrics import Metrics

#: the columns of a batch-size table after ``batch`` (``demo`` adds ``outputs identical``)
SWEEP_COLUMNS = (
    "tokens/s plain",
    "tokens/s spec",
    "ratio",
    "drafts/slot/round",
    "mean accepted len",
    "method mix",
)

#: what the columns of a batch-size table mean (printed under it)
SWEEP_LEGEND = (
    "  ratio: tokens/s spec / tokens/s plain at the same batch size, same run\n"
    "  drafts/slot/round: drafts offered / (decoding slot, target step) pairs: how many of K "
    "the drafting chose on average\n"
    "  mean accepted len: tokens emitted per decoding slot per target step (1.00 = no gain)\n"
    "  method mix: each drafting method's share of the drafts offered"
)


def batch_sizes(text: str) -> list[int]:
    """argparse ``type``: comma-separated batch sizes, each > 0 (``"1,2,4"``)."""
    return [positive_int(part.strip()) for part in text.split(",")]


def method_drafts(m: Metrics) -> dict[str, list[int]]:
    """Drafts offered and accepted per drafting method, ``{method: [offered, accepted]}``
    (the engine's :attr:`~fastdeploy_mtp.runtime.engine_metrics.Metrics.method_drafts`)."""
    return {name: [int(offered), int(acc)] for name, (offered, acc) in m.method_drafts.items()}


def mix_text(offered: Mapping[str, float]) -> str:
    """``{method: drafts offered}`` as shares, largest first (``"mtp 72% ngram 28%"``);
    ``"-"`` when no draft was offered."""
    total = sum(offered.values())
    if total <= 0:
        return "-"
    shares = sorted(((n / total, name) for name, n in offered.items() if n > 0), reverse=True)
    return " ".join(f"{name} {share:.0%}" for share, name in shares)


def per_step(count: float, decode_steps: float) -> float:
    """``count`` (drafts offered, tokens emitted) per (decoding slot, target step) pair (0
    when nothing decoded)."""
    return count / decode_steps if decode_steps else 0.0


@dataclass(frozen=True)
class SweepRow:
    """One batch size of ``demo --batch-sizes``: ``plain`` and ``spec`` are the two runs'
    engine metrics, ``identical`` whether their token ids agree."""

    batch: int
    plain: Metrics
    spec: Metrics
    identical: bool

    @property
    def ratio(self) -> float | None:
        base = self.plain.tokens_per_second
        return self.spec.tokens_per_second / base if base else None

    @property
    def drafts_per_slot_round(self) -> float:
        return per_step(float(self.spec.proposed.sum()), self.spec.decode_item_steps)

    def cells(self) -> list[str]:
        offered = {name: n for name, (n, _) in method_drafts(self.spec).items()}
        return [
            str(self.batch),
            f"{self.plain.tokens_per_second:.1f}",
            f"{self.spec.tokens_per_second:.1f}",
            "-" if self.ratio is None else f"{self.ratio:.2f}x",
            f"{self.drafts_per_slot_round:.2f}",
            f"{self.spec.mean_accepted_length:.2f}",
            mix_text(offered),
            "yes" if self.identical else "NO",
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch,
            "tokens_per_second_plain": round(self.plain.tokens_per_second, 2),
            "tokens_per_second_spec": round(self.spec.tokens_per_second, 2),
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "drafts_per_slot_round": round(self.drafts_per_slot_round, 4),
            "mean_accepted_length": round(self.spec.mean_accepted_length, 4),
            "method_drafts": method_drafts(self.spec),
            "generated_tokens_plain": self.plain.generated_tokens,
            "generated_tokens_spec": self.spec.generated_tokens,
            "outputs_identical": self.identical,
        }


def sweep_table(rows: list[SweepRow]) -> str:
    """The batch-size table: a header, one line per row."""
    return table([["batch", *SWEEP_COLUMNS, "outputs identical"], *(r.cells() for r in rows)])


def run_sweep(
    args: argparse.Namespace, spec: SpeculativeConfig, sampling: SamplingParams, model: str
) -> list[SweepRow]:
    """For each of ``args.batch_sizes``: that many requests (the demo prompts, cycled) with
    as many batch slots, without speculation and with ``spec``, every request generating
    exactly ``args.max_tokens`` tokens (``ignore_eos``). One short unreported run of each
    first, so that neither side of the first row pays the process's one-time costs. Progress
    on stderr."""
    full_length = SamplingParams.from_dict({**sampling.to_dict(), "ignore_eos": True})
    plain = SpeculativeConfig(method=None)

    def both(prompts: list[str], max_tokens: int, label: str) -> list[Any]:
        return [
            run_prompts(
                prompts,
                max_tokens,
                s,
                len(prompts),
                f"{label}, {speculation_label(s)}",
                model,
                full_length,
                dtype=args.dtype,
                tokenizer=args.tokenizer,
            )
            for s in (plain, spec)
        ]

    both(DEMO_PROMPTS[:1], 2, "warm-up")
    rows = []
    for b in args.batch_sizes:
        print(f"batch {b}: {b} requests, {b} slots", file=sys.stderr, flush=True)
        prompts = [DEMO_PROMPTS[i % len(DEMO_PROMPTS)] for i in range(b)]
        (_, base_ids, base), (_, spec_ids, metrics) = both(prompts, args.max_tokens, f"batch {b}")
        rows.append(SweepRow(b, base, metrics, spec_ids == base_ids))
    return rows

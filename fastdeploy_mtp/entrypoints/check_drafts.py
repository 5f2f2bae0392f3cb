"""``fastdeploy-mtp check-drafts``: does MTP serve a model folder as well as the model allows?

Runs a handful of prompts (the folder's chat template applied) through the engine greedily,
and -- where torch and transformers are installed -- through transformers' own MTP generation
(K = 1) or MTP layers chained by the engine's stated rule (K > 1), then prints the per-position
acceptance of both side by side, the first round whose drafts differ and a verdict. Exit status
0: the drafts equal the reference's in every round (or no reference could run: said so, and
only the engine's figures are shown); 1: they differ; 2: a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..config import MAX_NUM_SPECULATIVE_TOKENS
from ..engine_args import UsageError, positive_int

if TYPE_CHECKING:  # the command imports Paddle and the models only when it runs
    from ..checks.reference import Round

#: The prompts (user turns) checked unless ``--prompt`` is given: code, prose, a list, a quote.
DEFAULT_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "for item in items:\n    if item.",
    "Summarise in one sentence: the quick brown fox jumps over the lazy dog.",
    "List three prime numbers greater than ten.",
    "Repeat after me: to be or not to be, that is the question.",
    'Complete the JSON: {"name": "Ada", "born": 1815, "field": "',
)


@dataclasses.dataclass
class EngineRun:
    """What :func:`engine_rounds` returns: per request (in prompt order) its rounds and the
    prompt's token ids as the engine tokenized it; ``stop_ids``: the ids that ended requests."""

    rounds: list[list[Round]]
    prompt_ids: list[list[int]]
    stop_ids: tuple[int, ...]


def engine_rounds(
    folder: str,
    prompts: Sequence[str | list[int]],
    max_tokens: int,
    k: int,
    *,
    prefill_chunk_size: int = 0,
    max_num_seqs: int = 4,
    dtype: str = "auto",
) -> EngineRun:
    """Greedy MTP rounds (``K = k`` drafts from ``k`` MTP substeps) of ``prompts`` (text, or
    token ids used as they are) through the engine ``generate`` runs."""
    from ..checks.reference import Round
    from ..config import SpeculativeConfig
    from .offline import run_requests

    spec = SpeculativeConfig(method="mtp", num_speculative_tokens=k, num_model_steps=k)
    trace: list[tuple] = []
    reqs, _, _ = run_requests(
        list(prompts), max_tokens, spec, max_num_seqs, f"engine K={k}", folder,
        dtype=dtype, trace=trace, prefill_chunk_size=prefill_chunk_size,
    )  # fmt: skip
    rounds: list[list[Round]] = []
    for req in reqs:
        mine = [t for t in trace if t[1] == req.request_id and t[3]]
        rounds.append(
            [
                Round(tuple(int(x) for x in t[3]), tuple(int(x) for x in t[4] if int(x) >= 0))
                for t in mine
            ]
        )
    stops = tuple(sorted({int(t) for r in reqs for t in r.sampling.stop_token_ids}))
    return EngineRun(rounds, [list(r.prompt_token_ids) for r in reqs], stops)


def register(sub: Any) -> None:
    """Add the ``check-drafts`` subcommand to ``sub`` (an ``add_subparsers`` result)."""
    p = sub.add_parser(
        "check-drafts",
        help="compare the engine's MTP drafts with transformers' on a model folder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model", required=True, metavar="DIR", help="HuggingFace model folder with MTP layers"
    )
    p.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=positive_int,
        default=1,
        help=f"drafts per round, 1..{MAX_NUM_SPECULATIVE_TOKENS} (default 1)",
    )
    p.add_argument(
        "--max-tokens", type=positive_int, default=32, help="new tokens per prompt (default 32)"
    )
    p.add_argument(
        "--prompt", action="append", default=None, help="a user turn to check (repeatable)"
    )
    p.add_argument("--no-chat-template", action="store_true", help="use the prompts as raw text")
    p.add_argument(
        "--no-reference", action="store_true", help="run the engine only (no torch/transformers)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=cmd_check_drafts)


def _prompts(args: argparse.Namespace) -> list[str]:
    from ..tokenization import load_tokenizer

    texts = list(args.prompt or DEFAULT_PROMPTS)
    if any(not t for t in texts):
        raise UsageError("--prompt must not be empty")
    if args.no_chat_template:
        return texts
    tok = load_tokenizer(args.model)
    if tok.chat_template is None:
        return texts
    return [tok.apply_chat_template([{"role": "user", "content": t}]) for t in texts]


def _fmt(values: list[float | None]) -> str:
    return " ".join("-" if v is None else f"{v:.2f}" for v in values) or "-"


def cmd_check_drafts(args: argparse.Namespace) -> int:
    from ..models.folder_inspection import inspect_model_folder

    if args.num_speculative_tokens > MAX_NUM_SPECULATIVE_TOKENS:
        raise UsageError(
            f"--num-speculative-tokens must be <= {MAX_NUM_SPECULATIVE_TOKENS}, got "
            f"{args.num_speculative_tokens}"
        )
    try:
        config = inspect_model_folder(args.model)
    except (ValueError, OSError) as exc:  # e.g. no such folder, no config.json
        raise UsageError(f"--model: {exc}") from None
    if config.num_nextn_predict_layers == 0:
        raise UsageError(
            f"--model {args.model}: the folder has no MTP layer (num_nextn_predict_layers 0)"
        )
    k = args.num_speculative_tokens
    prompts = _prompts(args)
    run = engine_rounds(args.model, prompts, args.max_tokens, k)
    reference, why = (None, "") if args.no_reference else _reference_rounds(args, run, k)
    pre = config.mtp_final_norm == "in_logits"
    report = _report(args, run, reference, why, k, "before" if pre else "after")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report, len(prompts), args.max_tokens)
    return 1 if report["verdict"] == DIFFER else 0


EQUAL = "drafts equal the reference in every round"
DIFFER = "drafts DIFFER from the reference"


def _reference_rounds(
    args: argparse.Namespace, run: EngineRun, k: int
) -> tuple[list[list[Round]] | None, str]:
    """The reference's rounds of the engine's prompts and where they came from, or ``None`` and
    why no reference could run."""
    from ..checks.reference import Reference, ReferenceUnavailable

    try:
        ref = Reference(args.model)
        if k == 1:
            rounds = [
                ref.generate_rounds(p, args.max_tokens, 1, run.stop_ids) for p in run.prompt_ids
            ]
            return rounds, "transformers generate(use_mtp=True)"
        rounds = [ref.chained_rounds(p, args.max_tokens, k, run.stop_ids) for p in run.prompt_ids]
        return rounds, f"transformers MTP layers chained ({ref.chain})"
    except ReferenceUnavailable as exc:
        return None, str(exc)


def _report(
    args: argparse.Namespace,
    run: EngineRun,
    reference: list[list[Round]] | None,
    why: str,
    k: int,
    where: str,
) -> dict[str, Any]:
    """The JSON report: both sides' acceptance, per request the first differing round, a verdict."""
    from ..checks.drafts import acceptance, compare, decode_rounds, mean_accepted_length

    ours = decode_rounds(run.rounds)
    report: dict[str, Any] = {
        "model": args.model,
        "num_speculative_tokens": k,
        "rule": f"substep 2 fed the MTP block's output {where} its final norm",
        "ours": {
            "mean_accepted_length": mean_accepted_length(ours),
            "acceptance": acceptance(ours, k),
        },
        "reference": None,
        "requests": [],
    }
    if reference is None:
        report["verdict"] = "engine only" if args.no_reference else f"no reference: {why}"
        return report
    theirs = decode_rounds(reference)
    report["reference"] = {
        "source": why,
        "mean_accepted_length": mean_accepted_length(theirs),
        "acceptance": acceptance(theirs, k),
    }
    differ = False
    for i, (o, t) in enumerate(zip(run.rounds, reference)):
        c = compare(o, t)
        entry: dict[str, Any] = {
            "prompt": i,
            "tokens_equal": c.tokens_equal,
            "first_diff_round": c.first_diff,
        }
        if c.first_diff is not None:
            entry["ours"] = (
                None if c.ours is None else {"tokens": c.ours.tokens, "drafts": c.ours.drafts}
            )
            entry["reference"] = (
                None if c.theirs is None else {"tokens": c.theirs.tokens, "drafts": c.theirs.drafts}
            )
            differ = True
        report["requests"].append(entry)
    report["verdict"] = DIFFER if differ else EQUAL
    return report


def _print(report: dict[str, Any], n_prompts: int, max_tokens: int) -> None:
    k = report["num_speculative_tokens"]
    print(
        f"{report['model']}: K = {k}, {n_prompts} prompts x {max_tokens} tokens, {report['rule']}"
    )
    print(f"  {'':<10} {'mean acc. len':>14}  acceptance per position")
    print(
        f"  {'engine':<10} {report['ours']['mean_accepted_length']:>14.2f}  "
        f"{_fmt(report['ours']['acceptance'])}"
    )
    r = report["reference"]
    if r is not None:
        print(
            f"  {'reference':<10} {r['mean_accepted_length']:>14.2f}  {_fmt(r['acceptance'])}   "
            f"({r['source']})"
        )
        for e in report["requests"]:
            if e["first_diff_round"] is not None:
                print(
                    f"  prompt {e['prompt']}: first differing round {e['first_diff_round']}: ours "
                    f"{e['ours']}, reference {e['reference']}"
                )
    print(f"verdict: {report['verdict']}")

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
import json
import sys
from typing import Any

from ..engine_args import UsageError, positive_int

#: The prompts (user turns) checked unless ``--prompt`` is given: code, prose, a list, a quote.
DEFAULT_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "for item in items:\n    if item.",
    "Summarise in one sentence: the quick brown fox jumps over the lazy dog.",
    "List three prime numbers greater than ten.",
    "Repeat after me: to be or not to be, that is the question.",
    'Complete the JSON: {"name": "Ada", "born": 1815, "field": "',
)


def register(sub: Any) -> None:
    """Add the ``check-drafts`` subcommand to ``sub`` (an ``add_subparsers`` result)."""
    p = sub.add_parser(
        "check-drafts",
        help="compare the engine's MTP drafts with transformers' on a model folder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, metavar="DIR", help="HuggingFace model folder with MTP layers")
    p.add_argument("-k", "--num-speculative-tokens", type=positive_int, default=1, help="drafts per round (default 1)")
    p.add_argument("--max-tokens", type=positive_int, default=32, help="new tokens per prompt (default 32)")
    p.add_argument("--prompt", action="append", default=None, help="a user turn to check (repeatable)")
    p.add_argument("--no-chat-template", action="store_true", help="use the prompts as raw text")
    p.add_argument("--no-reference", action="store_true", help="run the engine only (no torch/transformers)")
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
    from ..checks.drafts import acceptance, compare, decode_rounds, engine_rounds, mean_accepted_length
    from ..checks.reference import Reference, ReferenceUnavailable
    from ..models.model_folder import inspect_model_folder

    config = inspect_model_folder(args.model)
    if config.num_nextn_predict_layers == 0:
        raise UsageError(f"--model {args.model}: the folder has no MTP layer (num_nextn_predict_layers 0)")
    k = args.num_speculative_tokens
    prompts = _prompts(args)
    run = engine_rounds(args.model, prompts, args.max_tokens, k)
    reference, why = None, ""
    if not args.no_reference:
        try:
            ref = Reference(args.model)
            use_generate = k == 1
            reference = [
                ref.generate_rounds(p, args.max_tokens, 1, run.stop_ids)
                if use_generate
                else ref.chained_rounds(p, args.max_tokens, k, run.stop_ids)
                for p in run.prompt_ids
            ]
            why = (
                "transformers generate(use_mtp=True)"
                if use_generate
                else f"transformers MTP layers chained ({ref.chain})"
            )
        except ReferenceUnavailable as exc:
            why = str(exc)
    ours = decode_rounds(run.rounds)
    report: dict[str, Any] = {
        "model": args.model,
        "num_speculative_tokens": k,
        "rule": "substep 2 fed the MTP block's output "
        + ("before its final norm" if config.mtp_final_norm == "in_logits" else "after its final norm"),
        "ours": {"mean_accepted_length": mean_accepted_length(ours), "acceptance": acceptance(ours, k)},
        "reference": None,
        "requests": [],
    }  # fmt: skip
    verdict = 0
    if reference is not None:
        theirs = decode_rounds(reference)
        report["reference"] = {
            "source": why,
            "mean_accepted_length": mean_accepted_length(theirs),
            "acceptance": acceptance(theirs, k),
        }
        for i, (o, t) in enumerate(zip(run.rounds, reference)):
            c = compare(o, t)
            entry: dict[str, Any] = {"prompt": i, "tokens_equal": c.tokens_equal, "first_diff_round": c.first_diff}
            if c.first_diff is not None:
                entry["ours"] = None if c.ours is None else {"tokens": c.ours.tokens, "drafts": c.ours.drafts}
                entry["reference"] = (
                    None if c.theirs is None else {"tokens": c.theirs.tokens, "drafts": c.theirs.drafts}
                )
                verdict = 1
            report["requests"].append(entry)
    report["verdict"] = (
        "no reference: " + why
        if reference is None and not args.no_reference
        else "engine only"
        if reference is None
        else "drafts equal the reference in every round"
        if verdict == 0
        else "drafts DIFFER from the reference"
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return verdict
    print(f"{args.model}: K = {k}, {len(prompts)} prompts x {args.max_tokens} tokens, {report['rule']}")
    print(f"  {'':<10} {'mean acc. len':>14}  acceptance per position")
    print(f"  {'engine':<10} {report['ours']['mean_accepted_length']:>14.2f}  {_fmt(report['ours']['acceptance'])}")
    if report["reference"] is not None:
        r = report["reference"]
        print(f"  {'reference':<10} {r['mean_accepted_length']:>14.2f}  {_fmt(r['acceptance'])}   ({why})")
        for e in report["requests"]:
            if e["first_diff_round"] is not None:
                print(
                    f"  prompt {e['prompt']}: first differing round {e['first_diff_round']}: "
                    f"ours {e['ours']}, reference {e['reference']}"
                )
    print(f"verdict: {report['verdict']}", file=sys.stderr if verdict else sys.stdout)
    return verdict

"""``fastdeploy-mtp generate``: continue one prompt with the reference engine in this process."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from ..engine_args import UsageError, add_sampling_args, speculation_label
from .offline import (
    METRICS_LEGEND,
    add_offline_args,
    emit_json,
    per_position_text,
    resolve_offline_args,
    run_requests,
)

if TYPE_CHECKING:
    from ..runtime.request import Request


def register(sub: Any) -> None:
    """Add the ``generate`` subcommand to ``sub`` (an ``add_subparsers`` result)."""
    gen = sub.add_parser("generate", help="continue one prompt")
    add_offline_args(gen)
    gen.add_argument("--prompt", required=True)
    add_sampling_args(gen)
    gen.set_defaults(func=cmd_generate)


def _logprobs_json(req: Request, model: str) -> list[dict[str, Any]]:
    """One ``{"token_id", "token", "logprob", "top": [{"token_id", "token", "logprob"}]}`` per
    output token (``token``: the token decoded alone by ``model``'s tokenizer, U+FFFD for part
    of a character, ``""`` for a padding id)."""
    from ..tokenization import load_tokenizer

    token = load_tokenizer(model).token_string

    return [
        {
            "token_id": lp.token_id,
            "token": token(lp.token_id),
            "logprob": lp.logprob,
            "top": [{"token_id": t, "token": token(t), "logprob": v} for t, v in lp.top],
        }
        for lp in req.output_logprobs
    ]


def cmd_generate(args: argparse.Namespace) -> int:
    if not args.prompt:
        raise UsageError("--prompt must not be empty")
    spec, sampling, model = resolve_offline_args(args)
    reqs, texts, metrics = run_requests(
        [args.prompt],
        args.max_tokens,
        spec,
        1,
        speculation_label(spec),
        model,
        sampling,
        dtype=args.dtype,
        tokenizer=args.tokenizer,
    )
    req = reqs[0]
    if args.json:
        from ..serving.engine_client.engine_loop import (
            finish_reason_of,  # the server's rule, so both say the same
        )

        out: dict[str, Any] = {
            "prompt": args.prompt,
            "text": texts[0],
            "token_ids": list(req.output_token_ids),
            "finish_reason": finish_reason_of(req),
            "speculative_config": dataclasses.asdict(spec),
            "sampling": sampling.to_dict(),
            "metrics": metrics.as_dict(),
        }
        if sampling.logprobs is not None:
            out["logprobs"] = _logprobs_json(req, args.tokenizer or model)
        emit_json(out)
        return 0
    print(args.prompt + texts[0])
    if sampling.logprobs is not None:
        for entry in _logprobs_json(req, args.tokenizer or model):
            top = "  ".join(f"{a['token']!r} {a['logprob']:.3f}" for a in entry["top"])
            print(
                f"  {entry['token']!r:>8} {entry['logprob']:8.3f}"
                + (f"   top: {top}" if top else "")
            )
    if spec.enabled:
        print(
            f"[{speculation_label(spec)}: mean accepted len {metrics.mean_accepted_length:.2f}, "
            f"acceptance per position {per_position_text(metrics)}, "
            f"{metrics.tokens_per_second:.1f} tokens/s]",
            file=sys.stderr,
        )
        print(METRICS_LEGEND, file=sys.stderr)
    return 0

"""What ``generate`` and ``demo`` share: their common options, a run of the reference engine
in this process, and how they print its metrics."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..engine_args import (
    UsageError,
    add_model_arg,
    add_speculative_args,
    build_config,
    model_arg,
    positive_int,
    resolve_model,
    resolve_sampling,
    resolve_speculative_config,
)
from ..runtime.sampling_params import SamplingParams

if TYPE_CHECKING:  # Paddle-backed modules are imported only when a command runs
    from ..config import SpeculativeConfig
    from ..runtime.engine_metrics import Metrics
    from ..runtime.request import Request

#: What the printed metrics mean (shown under the demo table and the ``generate`` summary).
METRICS_LEGEND = (
    "  mean accepted len: tokens emitted per decoding slot per target forward "
    "(1.00 = no gain, at most K+1)\n"
    "  acceptance per position i: accepted / offered drafts at draft position i over the "
    "decoding steps;\n"
    "    greedy verification stops at the first mismatch, so a draft counts as accepted only if "
    "the drafts\n"
    "    before it in its round were too (cumulative, not conditional on draft i-1); "
    "'-' = none offered\n"
    "  tokens/s: generated tokens / wall time of the generation loop (model loading excluded)"
)


class CommandError(RuntimeError):
    """A command that cannot run as asked, e.g. ``--plot`` without matplotlib (exit status 1)."""


def add_offline_args(parser: argparse.ArgumentParser) -> None:
    """The options of a command that runs the engine in this process: the speculation
    options, ``--model`` (``--checkpoint``: its deprecated spelling), ``--max-tokens``,
    ``--json``."""
    add_speculative_args(parser)
    parser.add_argument(
        "--max-tokens", type=positive_int, default=64, help="new tokens per prompt (default 64)"
    )
    add_model_arg(parser, deprecated=("--checkpoint",))
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout (progress on stderr)"
    )


def resolve_offline_args(args: argparse.Namespace) -> tuple[SpeculativeConfig, SamplingParams, str]:
    """The speculation, the sampling (checked against the speculation) and the model folder
    that ``generate``'s or ``demo``'s arguments ask for. Sampling flags left out take the
    folder's ``generation_config.json`` values (as vLLM applies them), else greedy.

    Raises:
        UsageError, SpeculativeConfigError: a bad value, or a folder that cannot be served as
            asked (exit status 2).
        ValueError: more drafts than any command serves.
    """
    from ..tokenization import load_generation_config

    spec = resolve_speculative_config(args)
    model = resolve_model(model_arg(args), args.dtype, spec)
    defaults = load_generation_config(model).sampling_overrides()
    return spec, resolve_sampling(args, spec, defaults), model


def _progress(label: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        end = "\n" if done == total else ""
        print(f"\r  {label}: {done}/{total} requests done", end=end, file=sys.stderr, flush=True)

    return report


def run_requests(
    prompts: Sequence[str | list[int]],
    max_tokens: int,
    spec: SpeculativeConfig,
    max_num_seqs: int,
    label: str,
    model: str | None = None,
    sampling: SamplingParams | None = None,
    *,
    dtype: str = "auto",
    tokenizer: str | None = None,
    trace: list[tuple] | None = None,
    prefill_chunk_size: int = 0,
) -> tuple[list[Request], list[str], Metrics]:
    """Generate for ``prompts`` (request ids ``p0, p1, ...``) with the shipped checkpoint (or
    the model folder ``model``, loaded in ``dtype``, its tokenizer from ``tokenizer`` when
    given), speculation ``spec`` and ``sampling`` (default
    greedy; each request gets its own copy), reporting progress on stderr under ``label``;
    returns (the finished requests, with their ``output_token_ids``, ``finish_reason`` and
    ``output_logprobs``; their texts; metrics). Prompts are tokenized by the folder's
    ``tokenizer.json`` (special tokens added as its post-processor says); the model's EOS ids
    (tokenizer, ``generation_config.json``, ``config.json``) end a request, as stop token ids.
    A prompt given as a list of token ids is used as it is. ``trace``: the engine's per-step
    record (:attr:`~fastdeploy_mtp.runtime.engine.Engine.trace`) is appended to it.
    ``prefill_chunk_size``: prefill prompts in chunks of this many tokens (0: whole)."""
    from ..serving.processes.start_up import import_paddle

    import_paddle()  # first, so a Ctrl-C during the import comes after it (one quiet line)
    from ..assembly import build_engine
    from ..models import ASSETS_DIR, load_model
    from ..runtime.request import Request
    from ..tokenization import load_generation_config, load_tokenizer

    folder = model or ASSETS_DIR
    target, mtp, arch = load_model(folder, dtype=dtype)
    if spec.uses_mtp and mtp is None:
        raise ValueError(
            f"model folder {folder} has no MTP layer (num_nextn_predict_layers 0): run it without "
            "MTP"
        )
    tok = load_tokenizer(folder, tokenizer)
    eos = [*tok.eos_token_ids, *load_generation_config(folder).eos_token_ids, *arch.eos_token_ids]
    base = sampling or SamplingParams()

    def own_params() -> SamplingParams:  # each request gets its own copy
        params = base.to_dict()
        params["stop_token_ids"] = list(dict.fromkeys([*params["stop_token_ids"], *eos]))
        return SamplingParams.from_dict(params)

    reqs = [
        Request(
            f"p{i}",
            tok.encode(p) if isinstance(p, str) else [int(t) for t in p],
            max_tokens=max_tokens,
            sampling=own_params(),
        )
        for i, p in enumerate(prompts)
    ]
    k = spec.num_speculative_tokens if spec.enabled else 0
    _check_room(reqs, max_tokens, k, arch.max_position_embeddings)
    longest = max(len(r.prompt_token_ids) for r in reqs) + max_tokens + 2 * k + 8
    # more slots than requests would only take memory (--max-num-seqs 100000 is not refused)
    cfg = build_config(arch, spec, min(max_num_seqs, len(reqs)), longest)
    cfg.model_config.model = folder  # the grammar of a constrained request runs on its tokenizer

    # tok.decode leaves out padding ids and special tokens
    draft_model = mtp if spec.uses_mtp else None
    record, chunk = trace is not None, prefill_chunk_size
    with build_engine(
        cfg, target, draft_model, chunk, record_trace=record, detokenize=tok.decode
    ) as engine:
        engine.generate(reqs, progress=_progress(label))
        if trace is not None:
            trace.extend(engine.trace or [])
    return reqs, [tok.decode(r.output_token_ids) for r in reqs], engine.metrics


def _check_room(reqs: Sequence[Request], max_tokens: int, k: int, positions: int) -> None:
    """A usage error naming ``--max-tokens`` (or ``--prompt``) unless the longest prompt, the
    new tokens and a round's ``k`` drafts + 1 fit the model's ``positions`` (the engine's own
    check, stated in the command's terms)."""
    prompt = max(len(r.prompt_token_ids) for r in reqs)
    room = positions - prompt - k - 1
    if room < 1:
        raise UsageError(
            f"--prompt: {prompt} tokens leave no room for new tokens in the model's "
            f"{positions} positions (max_position_embeddings)"
        )
    if max_tokens > room:
        raise UsageError(
            f"--max-tokens: {max_tokens} exceeds the model's positions after the prompt: "
            f"max_position_embeddings ({positions}) - prompt tokens ({prompt}) - (K + 1) "
            f"({k + 1}) = {room}"
        )


def run_prompts(*args: Any, **kwargs: Any) -> tuple[list[str], list[list[int]], Metrics]:
    """:func:`run_requests` (the same arguments), returning (texts, token ids, metrics)."""
    reqs, texts, metrics = run_requests(*args, **kwargs)
    return texts, [list(r.output_token_ids) for r in reqs], metrics


def per_position_text(metrics: Metrics) -> str:
    """The acceptance per draft position as ``"0.87 0.38 -"`` (``-``: no draft offered there)."""
    return (
        " ".join("-" if a is None else f"{a:.2f}" for a in metrics.acceptance_per_position) or "-"
    )


def emit_json(obj: dict[str, Any]) -> None:
    """``--json``: the one object on stdout."""
    print(json.dumps(obj, indent=2))

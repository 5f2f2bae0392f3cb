"""``fastdeploy-mtp``: run the shipped tiny checkpoint with and without MTP speculation.

  fastdeploy-mtp demo [SPECULATION] [--max-tokens N] [--max-num-seqs N] [--temperature T --seed S]
                      [--json] [--plot FILE]
  fastdeploy-mtp generate --prompt TEXT [SPECULATION] [--max-tokens N] [SAMPLING] [--json]
  fastdeploy-mtp serve [SPECULATION] [--port P] [--splitwise-role mixed|prefill|decode] ...
  fastdeploy-mtp router --prefill URL --decode URL [--port P] ...
  fastdeploy-mtp --version

SPECULATION is --speculative-config JSON with FastDeploy's keys, e.g.
  '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 1, "mtp_strategy": "with_ngram"}'
or the shorthand flags --num-speculative-tokens K, --num-model-steps S, --hybrid-ngram. Keys
the JSON leaves out take the flags' values (or their defaults); a flag that contradicts the
JSON is an error.

SAMPLING (default greedy): --temperature, --top-p, --top-k, --min-p, --seed,
--repetition-penalty, --frequency-penalty, --presence-penalty, --stop TEXT (repeatable),
--logprobs K. A seeded request samples the same tokens with and without speculation
(verify_strategy "target_match", the default).

Errors are one line on stderr, exit status 2 for a bad argument, 1 for a failure while
running, 130 on Ctrl-C; FDMTP_DEBUG=1 shows the traceback instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .config import (
    CacheConfig,
    FDConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    SpeculativeConfigError,
    load_speculative_json,
)
from .runtime.request import GenerationError
from .runtime.sampling_params import MAX_LOGPROBS, SamplingParams

if TYPE_CHECKING:  # the CLI imports Paddle-backed modules only when a command runs
    from .models.model_config import ModelConfig as ArchConfig
    from .runtime.engine import Metrics
    from .runtime.request import Request

#: K when neither ``--num-speculative-tokens`` nor the JSON gives it.
DEFAULT_NUM_SPECULATIVE_TOKENS = 3
#: What ``serve``, ``demo`` and ``generate`` run when given no speculation flag and no JSON:
#: one MTP substep, n-gram matches for the other two draft slots, adaptive draft length. On the
#: shipped checkpoint this is the fastest configuration at batch 1 (``scripts/bench_e2e.py``):
#: the MTP layer's first draft is the one worth a forward, and n-gram drafts cost no forward.
DEFAULT_SPECULATIVE_CONFIG = {
    "method": "mtp",
    "num_speculative_tokens": DEFAULT_NUM_SPECULATIVE_TOKENS,
    "num_model_steps": 1,
    "mtp_strategy": "with_ngram",
    "adaptive_draft_length": True,
}


def default_speculative_config() -> SpeculativeConfig:
    """:data:`DEFAULT_SPECULATIVE_CONFIG` as a config."""
    return SpeculativeConfig.from_dict(DEFAULT_SPECULATIVE_CONFIG)


#: ``demo``'s batch slots by default: one prompt at a time, where speculation pays most on a
#: CPU (see :func:`batch_note`).
DEMO_MAX_NUM_SEQS = 1


def batch_note(max_num_seqs: int) -> str:
    """One line, printed under the demo table, on how the batch size changes the gain on a CPU:
    a target forward over a round's K + 1 tokens costs little more than over one token at
    batch 1, but at batch 8 the forward over K + 1 tokens per slot costs clearly more than over
    one per slot (the MTP substep grows too), so the same speculation gains much less."""
    where = (
        "try --max-num-seqs 8 to see it"
        if max_num_seqs == 1
        else f"as here at batch {max_num_seqs}; --max-num-seqs {DEMO_MAX_NUM_SEQS} is the default"
    )
    return (
        "note: on a CPU speculation pays most at batch 1, where verifying K+1 tokens costs little more than "
        f"1 token; in a larger batch verification costs more and the gain shrinks ({where})"
    )


#: What the printed metrics mean (shown under the demo table and the ``generate`` summary).
METRICS_LEGEND = """\
  mean accepted len: tokens emitted per decoding slot per target forward (1.00 = no gain, at most K+1)
  acceptance per position i: accepted / offered drafts at draft position i over the decoding steps;
    greedy verification stops at the first mismatch, so a draft counts as accepted only if the drafts
    before it in its round were too (cumulative, not conditional on draft i-1); '-' = none offered
  tokens/s: generated tokens / wall time of the generation loop (model loading excluded)"""


class UsageError(ValueError):
    """A bad command-line argument (exit status 2)."""


class CommandError(RuntimeError):
    """A command that cannot run as asked, e.g. ``--plot`` without matplotlib (exit status 1)."""


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are :class:`UsageError` (``main`` prints them as
    one line) instead of a usage dump and ``SystemExit``."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def package_version() -> str:
    """The installed distribution's version, or ``fastdeploy_mtp.__version__`` when the
    package runs from a source tree that was not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fastdeploy_mtp")
    except PackageNotFoundError:
        from . import __version__

        return __version__


# ---- speculation arguments ----------------------------------------------------------------
def add_speculative_args(parser: argparse.ArgumentParser, k_default: int = DEFAULT_NUM_SPECULATIVE_TOKENS) -> None:
    """Add ``--speculative-config JSON`` and the shorthand flags ``--num-speculative-tokens``,
    ``--num-model-steps``, ``--hybrid-ngram`` to ``parser`` (as one argument group);
    :func:`resolve_speculative_config` turns the parsed values into a
    :class:`~fastdeploy_mtp.config.SpeculativeConfig`. ``k_default``: K when neither the flag
    nor the JSON gives it (0 = no speculation)."""
    group = parser.add_argument_group(
        "speculation",
        "--speculative-config, or the shorthand flags; keys the JSON leaves out take the flags' "
        "values (or defaults), and a flag that contradicts the JSON is an error",
    )
    group.add_argument(
        "--speculative-config",
        metavar="JSON",
        default=None,
        help='FastDeploy\'s speculative_config as a JSON object (keys: method ("mtp", or null / "none" for '
        'no speculation), num_speculative_tokens, num_model_steps, mtp_strategy ("default" | "with_ngram"), '
        'max_ngram_size, min_ngram_size, verify_strategy ("target_match" | "rejection" | "topp" | "greedy"), '
        'mtp_layer_schedule ("cycle" | "repeat_last" | "first"), adaptive_draft_length (true | false), '
        "acceptance_window, acceptance_rate_threshold, adaptive_probe_interval, model)",
    )
    group.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        metavar="K",
        help=f"draft tokens per round (0 = no speculation; default {k_default})",
    )
    group.add_argument(
        "--num-model-steps",
        type=int,
        default=None,
        metavar="S",
        help="MTP substeps per round, 1..K (default K, or 1 with --hybrid-ngram)",
    )
    group.add_argument(
        "--hybrid-ngram",
        action="store_true",
        help='fill the draft slots past the MTP steps by n-gram matching (mtp_strategy "with_ngram")',
    )
    parser.set_defaults(speculative_k_default=k_default)


def speculative_config(k: int, steps: int | None = None, hybrid: bool = False) -> SpeculativeConfig:
    """The config the shorthand flags describe: ``k = 0`` is no speculation; ``steps``
    defaults to ``k`` (1 with ``hybrid``).

    Raises:
        UsageError: ``k < 0``, ``steps`` outside ``1..k``, or ``steps`` / ``hybrid`` with
            ``k = 0``.
    """
    if k < 0:
        raise UsageError(f"--num-speculative-tokens must be >= 0, got {k}")
    if k == 0:
        if steps is not None or hybrid:
            flag = "--num-model-steps" if steps is not None else "--hybrid-ngram"
            raise UsageError(f"{flag} needs speculation, but --num-speculative-tokens is 0")
        return SpeculativeConfig(method=None)
    if steps is not None and not 1 <= steps <= k:
        raise UsageError(f"--num-model-steps must be in 1..K = 1..{k}, got {steps}")
    values: dict[str, Any] = {"method": "mtp", "num_speculative_tokens": k}
    if steps is not None:
        values["num_model_steps"] = steps
    if hybrid:
        values["mtp_strategy"] = "with_ngram"
    return SpeculativeConfig.from_dict(values)


def resolve_speculative_config(args: argparse.Namespace) -> SpeculativeConfig:
    """The :class:`~fastdeploy_mtp.config.SpeculativeConfig` of arguments added by
    :func:`add_speculative_args`.

    Without ``--speculative-config`` the shorthand flags decide (:func:`speculative_config`).
    With it, a key the JSON leaves out takes the value of its flag, or the flag's default
    (``--num-speculative-tokens 0`` or a default K of 0 means ``"method": null``); a flag
    given explicitly must agree with the JSON: ``--num-speculative-tokens`` with
    ``num_speculative_tokens`` (0 with ``"method": null``), ``--num-model-steps`` with
    ``num_model_steps``, ``--hybrid-ngram`` with ``"mtp_strategy": "with_ngram"``. No
    speculation is always returned as ``SpeculativeConfig(method=None)``.

    Raises:
        UsageError: a flag that contradicts the JSON, or an invalid flag value.
        SpeculativeConfigError: invalid JSON, an unknown key, a wrong type or value.
    """
    k_flag: int | None = args.num_speculative_tokens
    s_flag: int | None = args.num_model_steps
    hybrid: bool = bool(args.hybrid_ngram)
    k_default: int = getattr(args, "speculative_k_default", DEFAULT_NUM_SPECULATIVE_TOKENS)
    if k_flag is not None and k_flag < 0:
        raise UsageError(f"--num-speculative-tokens must be >= 0, got {k_flag}")
    if s_flag is not None and s_flag < 1:
        raise UsageError(f"--num-model-steps must be >= 1, got {s_flag}")
    if args.speculative_config is None:
        if k_flag is None and s_flag is None and not hybrid and k_default == DEFAULT_NUM_SPECULATIVE_TOKENS:
            return default_speculative_config()
        spec = speculative_config(k_default if k_flag is None else k_flag, s_flag, hybrid)
    else:
        values = load_speculative_json(args.speculative_config)
        k = k_default if k_flag is None else k_flag
        if "method" not in values and "num_speculative_tokens" not in values and k == 0:
            values["method"] = None
        if k > 0:
            values.setdefault("num_speculative_tokens", k)
        if s_flag is not None:
            values.setdefault("num_model_steps", s_flag)
        if hybrid:
            values.setdefault("mtp_strategy", "with_ngram")
        spec = SpeculativeConfig.from_dict(values)
        _check_flags_agree(spec, k_flag, s_flag, hybrid)
        if not spec.enabled:
            spec = SpeculativeConfig(method=None)  # one value for "no speculation", whatever else the JSON says
    return spec


def _check_flags_agree(spec: SpeculativeConfig, k_flag: int | None, s_flag: int | None, hybrid: bool) -> None:
    def conflict(flag: str, json_says: str) -> NoReturn:
        raise UsageError(
            f"{flag} conflicts with --speculative-config, which has {json_says}; give the value in one place"
        )

    if k_flag is not None:
        k = spec.num_speculative_tokens if spec.enabled else 0
        if k != k_flag:
            conflict(
                f"--num-speculative-tokens {k_flag}",
                f'"num_speculative_tokens": {k}' if spec.enabled else '"method": null (no speculation)',
            )
    if s_flag is not None:
        if not spec.enabled:
            conflict(f"--num-model-steps {s_flag}", '"method": null (no speculation)')
        if spec.num_model_steps != s_flag:
            conflict(f"--num-model-steps {s_flag}", f'"num_model_steps": {spec.num_model_steps}')
    if hybrid and (not spec.enabled or spec.mtp_strategy != "with_ngram"):
        conflict(
            "--hybrid-ngram",
            f'"mtp_strategy": "{spec.mtp_strategy}"' if spec.enabled else '"method": null (no speculation)',
        )


# ---- sampling arguments ---------------------------------------------------------------------
#: ``SamplingParams`` field -> its flag (``add_sampling_args``).
SAMPLING_FLAGS = {
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "min_p": "--min-p",
    "seed": "--seed",
    "repetition_penalty": "--repetition-penalty",
    "frequency_penalty": "--frequency-penalty",
    "presence_penalty": "--presence-penalty",
    "stop": "--stop",
    "logprobs": "--logprobs",
}


def add_sampling_args(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    """Add the sampling flags (:data:`SAMPLING_FLAGS`; ``only``: just these fields) as one
    argument group; :func:`resolve_sampling` turns them into a
    :class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams`."""
    group = parser.add_argument_group(
        "sampling", "default greedy; a seeded request samples the same tokens with and without speculation"
    )
    specs: dict[str, tuple[Any, str]] = {
        "temperature": (float, "0 = greedy (default); > 0 samples from softmax(logits / T)"),
        "top_p": (float, "nucleus sampling: keep the most likely tokens up to this probability (default 1 = off)"),
        "top_k": (int, "keep the K most likely tokens (default 0 = off)"),
        "min_p": (float, "drop tokens below this fraction of the top probability (default 0 = off)"),
        "seed": (int, "the request's random seed (default: derived from the request id, so runs repeat)"),
        "repetition_penalty": (float, "> 1 discourages tokens generated before (default 1 = off)"),
        "frequency_penalty": (float, "subtracted per earlier occurrence of a token, in [-2, 2] (default 0)"),
        "presence_penalty": (float, "subtracted once per token generated before, in [-2, 2] (default 0)"),
        "logprobs": (int, f"print each token's log-probability and the K most likely, K in 0..{MAX_LOGPROBS}"),
    }
    for name, flag in SAMPLING_FLAGS.items():
        if only is not None and name not in only:
            continue
        if name == "stop":
            group.add_argument(
                flag,
                action="append",
                default=None,
                metavar="TEXT",
                help="end the output before this text (repeatable; the text is not printed)",
            )
            continue
        kind, help_text = specs[name]
        group.add_argument(flag, type=kind, default=None, metavar=name.split("_")[-1].upper(), help=help_text)


def resolve_sampling(args: argparse.Namespace) -> SamplingParams:
    """The :class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams` of the flags
    :func:`add_sampling_args` added (absent flags keep the defaults: greedy).

    Raises:
        UsageError: an invalid value, naming its flag.
    """
    values = {name: getattr(args, name) for name in SAMPLING_FLAGS if getattr(args, name, None) is not None}
    params = SamplingParams(**values)
    problem = params.check()
    if problem is not None:
        name, why = problem.split(":", 1)
        raise UsageError(f"{SAMPLING_FLAGS.get(name, name)}:{why}")
    return params


def check_sampling_fits(params: SamplingParams, spec: SpeculativeConfig) -> None:
    """Refuse (``UsageError``) sampling that ``spec``'s verify strategy cannot serve."""
    if spec.enabled and spec.verify_strategy == "greedy" and not params.greedy:
        raise UsageError(
            f"--temperature {params.temperature}: the speculative config's verify_strategy is 'greedy', which only "
            'decodes greedily; use "target_match" (the default) or "rejection" to sample'
        )


def speculation_label(spec: SpeculativeConfig) -> str:
    """A short name of the mode, e.g. ``"MTP K=3 S=1 +ngram adaptive"`` or ``"no speculation"``."""
    if not spec.enabled:
        return "no speculation"
    k, s = spec.num_speculative_tokens, spec.num_model_steps
    return (
        f"MTP K={k} S={s}"
        + (" +ngram" if spec.mtp_strategy == "with_ngram" and k > s else "")
        + (" adaptive" if spec.adaptive_draft_length else "")
    )


# ---- running the engine ---------------------------------------------------------------------
def build_config(arch: ArchConfig, spec: SpeculativeConfig, max_num_seqs: int, max_model_len: int) -> FDConfig:
    """FDConfig for the tiny checkpoint's architecture ``arch`` with speculation ``spec``
    (``SpeculativeConfig(method=None)`` for plain decoding). The byte model has no end-of-text
    token: a padded vocabulary id (never generated) stands in, so requests end at
    ``max_tokens``."""
    w = (spec.num_speculative_tokens if spec.enabled else 0) + 1
    return FDConfig(
        model_config=ModelConfig(
            max_model_len=max_model_len,
            vocab_size=arch.vocab_size,
            ori_vocab_size=arch.ori_vocab_size,
            hidden_size=arch.hidden_size,
            num_hidden_layers=arch.num_hidden_layers,
            eos_token_id=[arch.vocab_size - 1],
        ),
        speculative_config=spec,
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max(256, max_num_seqs * w + 64)
        ),
        cache_config=CacheConfig(
            block_size=arch.block_size, total_block_num=max_num_seqs * (-(-max_model_len // arch.block_size) + 3)
        ),
    )


def _progress(label: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        end = "\n" if done == total else ""
        print(f"\r  {label}: {done}/{total} requests done", end=end, file=sys.stderr, flush=True)

    return report


def run_requests(
    prompts: Sequence[str],
    max_tokens: int,
    spec: SpeculativeConfig,
    max_num_seqs: int,
    label: str,
    checkpoint: str | None = None,
    sampling: SamplingParams | None = None,
) -> tuple[list[Request], list[str], Metrics]:
    """Generate for ``prompts`` (request ids ``p0, p1, ...``) with the shipped checkpoint (or
    the tiny checkpoint folder ``checkpoint``), speculation ``spec`` and ``sampling`` (default
    greedy; each request gets its own copy), reporting progress on stderr under ``label``;
    returns (the finished requests, with their ``output_token_ids``, ``finish_reason`` and
    ``output_logprobs``; their texts; metrics)."""
    from .models import ByteTokenizer, load_tiny
    from .runtime.engine import Engine
    from .runtime.request import Request

    target, mtp, arch = load_tiny(checkpoint)
    tok = ByteTokenizer()
    params = sampling or SamplingParams()
    reqs = [
        Request(f"p{i}", tok.encode(p), max_tokens=max_tokens, sampling=SamplingParams.from_dict(params.to_dict()))
        for i, p in enumerate(prompts)
    ]
    k = spec.num_speculative_tokens if spec.enabled else 0
    longest = max(len(r.prompt_token_ids) for r in reqs) + max_tokens + 2 * k + 8
    cfg = build_config(arch, spec, max_num_seqs, longest)

    def text(ids: list[int]) -> str:  # padding ids (the stand-in EOS) have no text
        return tok.decode([t for t in ids if t < arch.ori_vocab_size])

    with Engine(cfg, target, mtp if spec.enabled else None, detokenize=text) as engine:
        engine.generate(reqs, progress=_progress(label))
    return reqs, [text(r.output_token_ids) for r in reqs], engine.metrics


def run_prompts(
    prompts: Sequence[str],
    max_tokens: int,
    spec: SpeculativeConfig,
    max_num_seqs: int,
    label: str,
    checkpoint: str | None = None,
    sampling: SamplingParams | None = None,
) -> tuple[list[str], list[list[int]], Metrics]:
    """:func:`run_requests`, returning (texts, token ids, metrics)."""
    reqs, texts, metrics = run_requests(prompts, max_tokens, spec, max_num_seqs, label, checkpoint, sampling)
    return texts, [list(r.output_token_ids) for r in reqs], metrics


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def per_position_text(metrics: Metrics) -> str:
    """The acceptance per draft position as ``"0.87 0.38 -"`` (``-``: no draft offered there)."""
    return " ".join("-" if a is None else f"{a:.2f}" for a in metrics.acceptance_per_position) or "-"


def _emit_json(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, indent=2))


# ---- --plot ---------------------------------------------------------------------------------
def _check_plot_path(path: str) -> None:
    """Refuse an unwritable ``--plot`` path before the (slow) run."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UsageError(f"--plot {path}: is a directory, give a file name (e.g. acceptance.png)")
    if not parent.is_dir():
        raise UsageError(f"--plot {path}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"--plot {path}: not writable")


def _import_agg() -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        raise CommandError(f"--plot needs matplotlib (pip install matplotlib): {exc}") from None
    return FigureCanvasAgg


def plot_acceptance(path: str, metrics: Metrics, label: str) -> None:
    """Write a bar chart of ``metrics.acceptance_per_position`` (draft positions 1..K, 'n/a'
    where no draft was offered) to ``path`` (PNG unless the suffix names another format
    matplotlib knows), with the mean accepted length in the title. Uses matplotlib's Agg
    canvas (no display, no pyplot state).

    Raises:
        CommandError: matplotlib is not installed. OSError: ``path`` cannot be written.
    """
    canvas_cls = _import_agg()
    from matplotlib.figure import Figure

    acceptance = metrics.acceptance_per_position
    positions = list(range(1, len(acceptance) + 1))
    fig = Figure(figsize=(5.5, 3.5), dpi=100)
    canvas_cls(fig)
    ax = fig.add_subplot()
    ax.bar(positions, [0.0 if a is None else a for a in acceptance], color="tab:blue")
    for x, a in zip(positions, acceptance):
        ax.text(x, (a or 0.0) + 0.02, "n/a" if a is None else f"{a:.2f}", ha="center", va="bottom")
    ax.set_xticks(positions)
    ax.set_ylim(0.0, 1.1)
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / offered")
    ax.set_title(f"{label}: mean accepted length {metrics.mean_accepted_length:.2f}")
    fig.tight_layout()
    fig.savefig(path)


# ---- commands -------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from .runtime.demo_prompts import DEMO_PROMPTS

    spec = resolve_speculative_config(args)
    if not spec.enabled:
        raise UsageError("demo compares decoding with and without MTP: it needs speculation (K > 0)")
    sampling = resolve_sampling(args)
    check_sampling_fits(sampling, spec)
    if args.plot is not None:
        _check_plot_path(args.plot)
        _import_agg()  # fail before the run, not after it
    source = args.checkpoint or "the shipped tiny checkpoint"
    print(
        f"fastdeploy-mtp demo: {source}, {len(DEMO_PROMPTS)} prompts, "
        f"{args.max_tokens} new tokens each, batch {args.max_num_seqs}",
        file=sys.stderr,
    )
    plain = SpeculativeConfig(method=None)
    _, base_ids, base = run_prompts(
        DEMO_PROMPTS, args.max_tokens, plain, args.max_num_seqs, speculation_label(plain), args.checkpoint, sampling
    )
    mode = speculation_label(spec)
    spec_texts, spec_ids, metrics = run_prompts(
        DEMO_PROMPTS, args.max_tokens, spec, args.max_num_seqs, mode, args.checkpoint, sampling
    )
    identical = spec_ids == base_ids
    speedup = metrics.tokens_per_second / base.tokens_per_second if base.tokens_per_second else None
    if args.plot is not None:
        plot_acceptance(args.plot, metrics, mode)
        print(f"acceptance per position plotted to {args.plot}", file=sys.stderr)
    if args.json:
        _emit_json(
            {
                "checkpoint": args.checkpoint,
                "num_prompts": len(DEMO_PROMPTS),
                "max_tokens": args.max_tokens,
                "max_num_seqs": args.max_num_seqs,
                "speculative_config": dataclasses.asdict(spec),
                "sampling": sampling.to_dict(),
                "rows": [
                    {"mode": speculation_label(plain), "speedup": 1.0, "metrics": base.as_dict()},
                    {
                        "mode": mode,
                        "speedup": None if speedup is None else round(speedup, 3),
                        "metrics": metrics.as_dict(),
                    },
                ],
                "outputs_identical": identical,
                "sample": {"prompt": DEMO_PROMPTS[0], "text": spec_texts[0]},
                "note": batch_note(args.max_num_seqs),
            }
        )
        return 0 if identical else 1
    rows = [
        ["mode", "tokens/s", "target forwards", "mean accepted len", "acceptance per position", "speedup"],
        [
            speculation_label(plain),
            f"{base.tokens_per_second:.1f}",
            str(base.target_forwards),
            f"{base.mean_accepted_length:.2f}",
            "-",
            "1.00x",
        ],
        [
            mode,
            f"{metrics.tokens_per_second:.1f}",
            str(metrics.target_forwards),
            f"{metrics.mean_accepted_length:.2f}",
            per_position_text(metrics),
            "-" if speedup is None else f"{speedup:.2f}x",
        ],
    ]
    print(_table(rows))
    print(batch_note(args.max_num_seqs))
    print(METRICS_LEGEND)
    print(f"\nsample ({DEMO_PROMPTS[0]!r} ->):\n{spec_texts[0]}")
    print(f"\noutputs with and without MTP identical: {'yes' if identical else 'NO'}")
    return 0 if identical else 1


def _logprobs_json(req: Request) -> list[dict[str, Any]]:
    """One ``{"token_id", "token", "logprob", "top": [{"token_id", "token", "logprob"}]}`` per
    output token (``token``: the byte decoded alone, U+FFFD for part of a character)."""

    def token(t: int) -> str:
        return bytes([t]).decode("utf-8", errors="replace") if 0 <= t < 256 else ""

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
    spec = resolve_speculative_config(args)
    if not args.prompt:
        raise UsageError("--prompt must not be empty")
    sampling = resolve_sampling(args)
    check_sampling_fits(sampling, spec)
    reqs, texts, metrics = run_requests(
        [args.prompt], args.max_tokens, spec, 1, speculation_label(spec), args.checkpoint, sampling
    )
    req = reqs[0]
    if args.json:
        from .serving.engine_client import finish_reason_of  # the server's rule, so both say the same

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
            out["logprobs"] = _logprobs_json(req)
        _emit_json(out)
        return 0
    print(args.prompt + texts[0])
    if sampling.logprobs is not None:
        for entry in _logprobs_json(req):
            top = "  ".join(f"{a['token']!r} {a['logprob']:.3f}" for a in entry["top"])
            print(f"  {entry['token']!r:>8} {entry['logprob']:8.3f}" + (f"   top: {top}" if top else ""))
    if spec.enabled:
        print(
            f"[{speculation_label(spec)}: mean accepted len {metrics.mean_accepted_length:.2f}, "
            f"acceptance per position {per_position_text(metrics)}, {metrics.tokens_per_second:.1f} tokens/s]",
            file=sys.stderr,
        )
        print(METRICS_LEGEND, file=sys.stderr)
    return 0


# ---- entry point ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The ``fastdeploy-mtp`` argument parser (its errors raise :class:`UsageError`)."""
    ap = _Parser(prog="fastdeploy-mtp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"fastdeploy-mtp {package_version()}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        add_speculative_args(p, DEFAULT_NUM_SPECULATIVE_TOKENS)
        p.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default 64)")
        p.add_argument("--checkpoint", default=None, help="tiny checkpoint folder (default: the shipped one)")
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress on stderr)")

    demo = sub.add_parser("demo", help="bundled prompts with and without MTP; a comparison table")
    common(demo)
    demo.add_argument(
        "--max-num-seqs",
        type=int,
        default=DEMO_MAX_NUM_SEQS,
        help=f"batch slots (default {DEMO_MAX_NUM_SEQS}: where speculation pays most on a CPU)",
    )
    demo.add_argument("--plot", metavar="FILE", default=None, help="bar chart of acceptance per draft position (PNG)")
    add_sampling_args(demo, only=("temperature", "top_p", "seed"))
    demo.set_defaults(func=cmd_demo)
    gen = sub.add_parser("generate", help="continue one prompt")
    common(gen)
    gen.add_argument("--prompt", required=True)
    add_sampling_args(gen)
    gen.set_defaults(func=cmd_generate)
    srv = sub.add_parser("serve", help="OpenAI-compatible server (cache manager + one worker process per TP rank)")
    add_speculative_args(srv, DEFAULT_NUM_SPECULATIVE_TOKENS)
    from .serving.server import add_serve_args

    add_serve_args(srv)
    srv.set_defaults(func=cmd_serve, max_tokens=1)
    rtr = sub.add_parser(
        "router", help="splitwise router: each request to a prefill instance, then a decode instance (OpenAI API)"
    )
    from .serving.router import add_router_args

    add_router_args(rtr)
    rtr.set_defaults(func=cmd_router, max_tokens=1)
    return ap


def cmd_serve(args: argparse.Namespace) -> int:
    """``fastdeploy-mtp serve``: see :mod:`fastdeploy_mtp.serving.server`."""
    from .serving.server import ServeOptions, default_model, serve

    spec = resolve_speculative_config(args)
    device_ids = None
    if args.device_ids:
        try:
            device_ids = [int(d) for d in args.device_ids.split(",")]
        except ValueError:
            raise UsageError(f"--device-ids must be comma-separated integers, got {args.device_ids!r}") from None
    for name in ("port", "tensor_parallel_size", "max_model_len", "kv_transfer_timeout", "kv_hold_timeout"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.prefill_chunk_size < 0:
        raise UsageError(f"--prefill-chunk-size must be >= 0, got {args.prefill_chunk_size}")
    for name in ("splitwise_port", "max_waiting_requests"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.splitwise_role == "mixed" and args.splitwise_port is not None:
        raise UsageError("--splitwise-port is the KV port of a prefill instance: it needs --splitwise-role prefill")
    opts = ServeOptions(
        model=args.model or default_model(),
        speculative_config=spec,
        host=args.host,
        port=args.port,
        tensor_parallel_size=args.tensor_parallel_size,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        engine_worker_queue_port=args.engine_worker_queue_port,
        device_ids=device_ids,
        served_model_name=args.served_model_name,
        prefill_chunk_size=args.prefill_chunk_size,
        splitwise_role=args.splitwise_role,
        splitwise_port=args.splitwise_port,
        kv_transport=args.kv_transport,
        kv_transfer_timeout=args.kv_transfer_timeout,
        kv_hold_timeout=args.kv_hold_timeout,
        kv_advertise_host=args.kv_advertise_host,
        max_waiting_requests=args.max_waiting_requests,
    )
    return serve(opts)


def cmd_router(args: argparse.Namespace) -> int:
    """``fastdeploy-mtp router``: see :mod:`fastdeploy_mtp.serving.router`."""
    from .serving.router import RouterOptions, run_router
    from .serving.router_backend import check_instance_url

    urls: dict[str, list[str]] = {}
    for role in ("prefill", "decode"):
        try:
            urls[role] = [check_instance_url(u, f"--{role}") for u in getattr(args, role)]
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    for name in ("port", "queue_timeout", "start_timeout"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    opts = RouterOptions(
        prefill=urls["prefill"],
        decode=urls["decode"],
        host=args.host,
        port=args.port,
        queue_timeout=args.queue_timeout,
        served_model_name=args.served_model_name,
        start_timeout=args.start_timeout,
    )
    return run_router(opts)


def _debug() -> bool:
    return os.environ.get("FDMTP_DEBUG", "") not in ("", "0")


def _report(exc: BaseException) -> None:
    message = " ".join(str(exc).split()) or type(exc).__name__
    print(f"fastdeploy-mtp: error: {message}", file=sys.stderr)


def _run(argv: list[str] | None) -> int:
    # Paddle warns at import that ccache (a build cache for its JIT extensions) is missing;
    # nothing here builds extensions, so the line is noise in every command's output.
    warnings.filterwarnings("ignore", message="No ccache found")
    ap = build_parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    if args.max_tokens <= 0:
        raise UsageError(f"--max-tokens must be > 0, got {args.max_tokens}")
    if (getattr(args, "max_num_seqs", 1) or 1) <= 0:
        raise UsageError(f"--max-num-seqs must be > 0, got {args.max_num_seqs}")
    return int(args.func(args))


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 failure while running, 2 bad argument,
    130 interrupted). Expected errors are printed as one line, ``fastdeploy-mtp: error: ...``;
    set ``FDMTP_DEBUG=1`` to have them raised with their traceback."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        if _debug():
            raise
        return 130
    except (UsageError, SpeculativeConfigError) as exc:
        if _debug():
            raise
        _report(exc)
        return 2
    except (ValueError, OSError, CommandError, GenerationError) as exc:
        if _debug():
            raise
        _report(exc)
        return 1


__all__ = [
    "CommandError",
    "UsageError",
    "add_sampling_args",
    "add_speculative_args",
    "build_config",
    "build_parser",
    "main",
    "package_version",
    "plot_acceptance",
    "resolve_sampling",
    "resolve_speculative_config",
    "default_speculative_config",
    "DEFAULT_SPECULATIVE_CONFIG",
    "run_prompts",
    "run_requests",
    "speculation_label",
    "speculative_config",
]


if __name__ == "__main__":
    sys.exit(main())

"""Engine arguments: the options every engine command shares, checked once, and the
``FDConfig`` they build.

Every command (``serve``, ``generate``, ``demo``) adds its engine options with the functions
here (``--model``, the speculation options, the sampling options, ``--max-num-seqs``) and
turns them into configs with the resolvers here, so the same value gets the same refusal on
every command; the serving processes build their ``FDConfig`` with :func:`build_config`
too. Nothing here imports the entry points (``fastdeploy_mtp.entrypoints``), which are the
only users of the ``add_*`` functions.

SPECULATION is ``--speculative-config JSON`` with FastDeploy's keys, e.g.
``'{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 1, "mtp_strategy": "with_ngram"}'``,
or the shorthand flags ``--num-speculative-tokens K``, ``--num-model-steps S``,
``--hybrid-ngram``. Keys the JSON leaves out take the flags' values (or their defaults); a
flag that contradicts the JSON is an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from .capacity import build_config as build_config  # the commands' and workers' FDConfig
from .config import SpeculativeConfig, load_speculative_json
from .config.validators import parse_number
from .runtime.sampling_params import MAX_LOGPROBS, SamplingParams

_Options = TypeVar("_Options")

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


class UsageError(ValueError):
    """A bad command-line argument (exit status 2)."""


def default_speculative_config() -> SpeculativeConfig:
    """:data:`DEFAULT_SPECULATIVE_CONFIG` as a config."""
    return SpeculativeConfig.from_dict(DEFAULT_SPECULATIVE_CONFIG)


def options_from_args(cls: type[_Options], args: argparse.Namespace, **resolved: Any) -> _Options:
    """The options dataclass ``cls`` (e.g. ``ServeOptions``) of a command's parsed ``args``:
    each field from the argument of the same name, or from ``resolved`` (the values a
    resolver built from the raw arguments, e.g. ``speculative_config``); fields with neither
    keep their defaults."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    given = {name: value for name, value in vars(args).items() if name in names}
    return cls(**{**given, **resolved})


# ---- argparse value types -------------------------------------------------------------------
# One definition per kind of number, so a bad value reads the same on every command: argparse
# prefixes the flag ("argument --max-tokens: must be > 0, got 0").
def _number(text: str, kind: type[int] | type[float], least: float, strict: bool) -> Any:
    return parse_number(text, kind, least, strict, argparse.ArgumentTypeError)


def positive_int(text: str) -> int:
    """argparse ``type``: an integer > 0."""
    return int(_number(text, int, 0, strict=True))


def non_negative_int(text: str) -> int:
    """argparse ``type``: an integer >= 0."""
    return int(_number(text, int, 0, strict=False))


def positive_float(text: str) -> float:
    """argparse ``type``: a number > 0."""
    return float(_number(text, float, 0, strict=True))


# ---- --model --------------------------------------------------------------------------------
class _DeprecatedAlias(argparse.Action):
    """Store the value like the option it stands for, saying once on stderr which one that is."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option: str | None = None,
    ) -> None:
        print(f"fastdeploy-mtp: warning: {option} is deprecated; use --model", file=sys.stderr)
        setattr(namespace, self.dest, values)


#: ``--dtype`` choices: ``auto`` takes the folder's own (``config.json``'s ``torch_dtype`` or
#: ``dtype``; float32 when it names none).
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def add_model_arg(
    parser: argparse.ArgumentParser, deprecated: Sequence[str] = (), positional: bool = False
) -> None:
    """Add ``--model DIR`` (default: the shipped checkpoint), ``--tokenizer DIR`` and
    ``--dtype``; with ``positional``, also vLLM's ``serve DIR`` (an optional positional model
    folder); for each of ``deprecated``, an old spelling of ``--model`` that still works and
    prints a deprecation notice."""
    if positional:
        parser.add_argument(
            "model_dir",
            nargs="?",
            default=None,
            metavar="MODEL_DIR",
            help="model folder (the same as --model)",
        )
    parser.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="model folder (HuggingFace layout: config.json, safetensors, tokenizer; default: the shipped one)",
    )
    for flag in deprecated:
        parser.add_argument(
            flag,
            dest="model",
            action=_DeprecatedAlias,
            metavar="DIR",
            help="deprecated spelling of --model",
        )
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="folder with tokenizer.json and tokenizer_config.json (default: the model folder)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="weights, activations and KV caches (default auto: the folder's config.json)",
    )


def model_arg(args: argparse.Namespace) -> str | None:
    """The model folder the arguments name: ``--model`` or the positional ``MODEL_DIR``
    (both may be given only if they agree); ``None`` = the shipped one."""
    positional = getattr(args, "model_dir", None)
    if positional is not None and args.model is not None and positional != args.model:
        raise UsageError(
            f"the model folder is given twice: {positional!r} and --model {args.model!r}"
        )
    return positional if positional is not None else args.model


def default_model() -> str:
    """The shipped tiny checkpoint's directory."""
    from .models.folder_inspection import ASSETS_DIR

    return os.fspath(ASSETS_DIR)


def resolve_model(
    model: str | None, dtype: str = "auto", spec: SpeculativeConfig | None = None
) -> str:
    """The model folder (the shipped one when ``model`` is None), checked before anything
    loads or any process starts: its config and the headers of its weight files are read and
    every tensor the model needs must be there with its shape; with ``spec``, MTP speculation
    needs a folder with MTP layers.

    Raises:
        UsageError: no such folder, or a folder that cannot be served (one line naming what is
            missing or unsupported).
    """
    from .models.folder_inspection import inspect_folder
    from .models.hf_config import UnsupportedModelError

    path = model or default_model()
    if not os.path.isdir(path):
        raise UsageError(f"--model {path}: no such directory")
    try:
        plan = inspect_folder(path, dtype)
    except UnsupportedModelError as exc:
        raise UsageError(str(exc)) from None
    if plan.note:
        print(f"fastdeploy-mtp: note: {plan.note}", file=sys.stderr)
    if spec is not None and spec.uses_mtp and plan.config.num_nextn_predict_layers == 0:
        raise UsageError(
            f"model folder {path} has no MTP layer (config.json `num_nextn_predict_layers` is 0 or absent): "
            'run it without MTP (--speculative-config \'{"method": "none"}\', or a model-free method: '
            '"ngram", "suffix", "naive")'
        )
    return path


def add_max_num_seqs_arg(
    parser: argparse.ArgumentParser, default: int | None, help_text: str
) -> None:
    """Add ``--max-num-seqs N`` (batch slots, > 0)."""
    parser.add_argument(
        "--max-num-seqs", type=positive_int, default=default, metavar="N", help=help_text
    )


# ---- speculation ----------------------------------------------------------------------------
def add_speculative_args(
    parser: argparse.ArgumentParser, k_default: int = DEFAULT_NUM_SPECULATIVE_TOKENS
) -> None:
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
        help='FastDeploy\'s speculative_config as a JSON object (keys: method ("mtp": the MTP layer; '
        '"ngram": n-gram matches in the prompt and output; "suffix": suffix decoding; "naive": no drafts '
        'through the speculative step; null / "none": no speculation), num_speculative_tokens, '
        'num_model_steps, mtp_strategy ("default" | "with_ngram"), max_ngram_size (alias prompt_lookup_max), '
        "min_ngram_size (alias prompt_lookup_min), suffix_decoding_max_tree_depth, "
        "suffix_decoding_max_cached_requests, suffix_decoding_max_spec_factor, suffix_decoding_min_token_prob, "
        'verify_strategy ("target_match" | "rejection" | "topp" | "greedy"), '
        'mtp_layer_schedule ("cycle" | "repeat_last" | "first"), adaptive_draft_length (true | false, "mtp" only), '
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
    :func:`add_speculative_args`, checked by :func:`check_speculative_config`.

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
        ValueError: more drafts than a step's token message carries.
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
        if (
            k_flag is None
            and s_flag is None
            and not hybrid
            and k_default == DEFAULT_NUM_SPECULATIVE_TOKENS
        ):
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
            spec = SpeculativeConfig(
                method=None
            )  # one value for "no speculation", whatever else the JSON says
    check_speculative_config(spec)
    return spec


def _check_flags_agree(
    spec: SpeculativeConfig, k_flag: int | None, s_flag: int | None, hybrid: bool
) -> None:
    def conflict(flag: str, json_says: str) -> NoReturn:
        raise UsageError(
            f"{flag} conflicts with --speculative-config, which has {json_says}; give the value in one place"
        )

    if k_flag is not None:
        k = spec.num_speculative_tokens if spec.enabled else 0
        if k != k_flag:
            conflict(
                f"--num-speculative-tokens {k_flag}",
                f'"num_speculative_tokens": {k}'
                if spec.enabled
                else '"method": null (no speculation)',
            )
    if s_flag is not None:
        if not spec.enabled:
            conflict(f"--num-model-steps {s_flag}", '"method": null (no speculation)')
        if spec.num_model_steps != s_flag:
            conflict(f"--num-model-steps {s_flag}", f'"num_model_steps": {spec.num_model_steps}')
    if hybrid and (not spec.enabled or spec.mtp_strategy != "with_ngram"):
        conflict(
            "--hybrid-ngram",
            f'"mtp_strategy": "{spec.mtp_strategy}"'
            if spec.enabled
            else '"method": null (no speculation)',
        )


def check_speculative_config(spec: SpeculativeConfig, splitwise_role: str = "mixed") -> None:
    """Refuse a config no engine command can serve: each step's token message (FastDeploy's
    SysV layout, :mod:`fastdeploy_mtp.ops.messaging`) carries at most ``MAX_DRAFT_TOKENS``
    tokens per request, the K drafts' K + 1 accepted tokens at most. ``generate`` and ``demo``
    run without that message, but refuse what ``serve`` would, so a config that works on one
    command works on every one.

    Raises:
        UsageError: ``num_speculative_tokens + 1 > MAX_DRAFT_TOKENS``, or a model-free method
            on a splitwise instance (:func:`~fastdeploy_mtp.config.check_splitwise_method`).
    """
    from .config import check_splitwise_method
    from .ops.messaging import MAX_DRAFT_TOKENS

    try:
        check_splitwise_method(spec.method, splitwise_role)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    if spec.enabled and spec.num_speculative_tokens + 1 > MAX_DRAFT_TOKENS:
        raise UsageError(
            f"num_speculative_tokens {spec.num_speculative_tokens}: the token message carries at most "
            f"{MAX_DRAFT_TOKENS} tokens per request and step, so at most {MAX_DRAFT_TOKENS - 1} drafts"
        )


def speculation_label(spec: SpeculativeConfig) -> str:
    """A short name of the mode, e.g. ``"MTP K=3 S=1 +ngram adaptive"``, ``"ngram K=3"`` or
    ``"no speculation"``."""
    if not spec.enabled:
        return "no speculation"
    k, s = spec.num_speculative_tokens, spec.num_model_steps
    if not spec.uses_mtp:
        return f"{spec.method} K={k}"
    return (
        f"MTP K={k} S={s}"
        + (" +ngram" if spec.mtp_strategy == "with_ngram" and k > s else "")
        + (" adaptive" if spec.adaptive_draft_length else "")
    )


# ---- sampling -------------------------------------------------------------------------------
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

#: ``SamplingParams`` field -> (its flag's type, help); ``stop`` is added apart (repeatable).
_SAMPLING_SPECS: dict[str, tuple[Any, str]] = {
    "temperature": (float, "0 = greedy (default); > 0 samples from softmax(logits / T)"),
    "top_p": (
        float,
        "nucleus sampling: keep the most likely tokens up to this probability (default 1 = off)",
    ),
    "top_k": (int, "keep the K most likely tokens (default 0 = off)"),
    "min_p": (float, "drop tokens below this fraction of the top probability (default 0 = off)"),
    "seed": (
        int,
        "the request's random seed (default: derived from the request id, so runs repeat)",
    ),
    "repetition_penalty": (float, "> 1 discourages tokens generated before (default 1 = off)"),
    "frequency_penalty": (
        float,
        "subtracted per earlier occurrence of a token, in [-2, 2] (default 0)",
    ),
    "presence_penalty": (
        float,
        "subtracted once per token generated before, in [-2, 2] (default 0)",
    ),
    "logprobs": (
        int,
        f"print each token's log-probability and the K most likely, K in 0..{MAX_LOGPROBS}",
    ),
}


def add_sampling_args(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    """Add the sampling flags (:data:`SAMPLING_FLAGS`; ``only``: just these fields) as one
    argument group; :func:`resolve_sampling` turns them into a
    :class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams`."""
    group = parser.add_argument_group(
        "sampling",
        "default greedy; a seeded request samples the same tokens with and without speculation",
    )
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
        kind, help_text = _SAMPLING_SPECS[name]
        group.add_argument(
            flag, type=kind, default=None, metavar=name.split("_")[-1].upper(), help=help_text
        )


def resolve_sampling(
    args: argparse.Namespace, spec: SpeculativeConfig, defaults: Mapping[str, Any] | None = None
) -> SamplingParams:
    """The :class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams` of the flags
    :func:`add_sampling_args` added (absent flags take ``defaults``, e.g. a model folder's
    ``generation_config.json``, else the dataclass defaults: greedy), checked against
    ``spec`` (:func:`check_sampling_fits`).

    Raises:
        UsageError: an invalid value, naming its flag.
    """
    values = dict(defaults or {})
    values.update(
        {
            name: getattr(args, name)
            for name in SAMPLING_FLAGS
            if getattr(args, name, None) is not None
        }
    )
    params = SamplingParams(**values)
    problem = params.check()
    if problem is not None:
        name, why = problem.split(":", 1)
        raise UsageError(f"{SAMPLING_FLAGS.get(name, name)}:{why}")
    check_sampling_fits(params, spec)
    return params


def check_sampling_fits(params: SamplingParams, spec: SpeculativeConfig) -> None:
    """Refuse (``UsageError``) sampling that ``spec``'s verify strategy cannot serve."""
    if spec.enabled and spec.verify_strategy == "greedy" and not params.greedy:
        raise UsageError(
            f"--temperature {params.temperature}: the speculative config's verify_strategy is 'greedy', which only "
            'decodes greedily; use "target_match" (the default) or "rejection" to sample'
        )

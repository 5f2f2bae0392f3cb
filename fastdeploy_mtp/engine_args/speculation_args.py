"""SPECULATION: ``--speculative-config JSON`` with FastDeploy's keys, e.g.
``'{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 1,
"mtp_strategy": "with_ngram"}'``, or the shorthand flags ``--num-speculative-tokens K``,
``--num-model-steps S``, ``--hybrid-ngram``. Keys the JSON leaves out take the flags' values
(or their defaults); a flag that contradicts the JSON is an error. Every command resolves and
checks them here, so the same value gets the same refusal everywhere."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from ..config import MAX_NUM_SPECULATIVE_TOKENS, SpeculativeConfig, load_speculative_json
from .values import UsageError

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
        help='FastDeploy\'s speculative_config as a JSON object (keys: method ("mtp": the MTP '
        'layer; "ngram": n-gram matches in the prompt and output; "suffix": suffix decoding; '
        '"naive": no drafts through the speculative step; null / "none": no speculation), '
        'num_speculative_tokens, num_model_steps, mtp_strategy ("default" | "with_ngram"), '
        "max_ngram_size (alias prompt_lookup_max), min_ngram_size (alias prompt_lookup_min), "
        "suffix_decoding_max_tree_depth, suffix_decoding_max_cached_requests, "
        "suffix_decoding_max_spec_factor, suffix_decoding_min_token_prob, verify_strategy "
        '("target_match" | "rejection" | "topp" | "greedy"), mtp_layer_schedule ("cycle" | '
        '"repeat_last" | "first"), adaptive_draft_length (true | false, "mtp" only), '
        "acceptance_window, adaptive_probe_interval, model)",
    )
    group.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        metavar="K",
        help=f"draft tokens per round, 0..{MAX_NUM_SPECULATIVE_TOKENS} (0 = no speculation; "
        f"default {k_default}; serve --token-channel sysv: at most 5)",
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
        help="fill the draft slots past the MTP steps by n-gram matching (mtp_strategy "
        '"with_ngram")',
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
    :func:`add_speculative_args` (every command refuses the same values alike; ``serve``
    also applies :func:`check_speculative_config` and its token channel's bound).

    Without ``--speculative-config`` the shorthand flags decide (:func:`speculative_config`).
    With it, a key the JSON leaves out takes the value of its flag, or the flag's default
    (``--num-speculative-tokens 0`` or a default K of 0 means ``"method": null``); a flag
    given explicitly must agree with the JSON: ``--num-speculative-tokens`` with
    ``num_speculative_tokens`` (0 with ``"method": null``), ``--num-model-steps`` with
    ``num_model_steps``, ``--hybrid-ngram`` with ``"mtp_strategy": "with_ngram"``. No
    speculation is always returned as ``SpeculativeConfig(method=None)``.

    Raises:
        UsageError: a flag that contradicts the JSON, or an invalid flag value.
        SpeculativeConfigError: invalid JSON, an unknown key, a wrong type or value (such
            as ``num_speculative_tokens`` above
            :data:`~fastdeploy_mtp.config.MAX_NUM_SPECULATIVE_TOKENS`).
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
    return spec


def _check_flags_agree(
    spec: SpeculativeConfig, k_flag: int | None, s_flag: int | None, hybrid: bool
) -> None:
    def conflict(flag: str, json_says: str) -> NoReturn:
        raise UsageError(
            f"{flag} conflicts with --speculative-config, which has {json_says}; give the value in "
            "one place"
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


def check_speculative_config(spec: SpeculativeConfig, splitwise_role: str) -> None:
    """Refuse a config no instance of ``splitwise_role`` can serve: a model-free method on a
    splitwise instance. (The bound on ``num_speculative_tokens`` is the config's own; ``serve
    --token-channel sysv`` checks its smaller one itself.)

    Raises:
        UsageError: a model-free method on a splitwise instance
            (:func:`~fastdeploy_mtp.config.check_splitwise_method`).
    """
    from ..config import check_splitwise_method

    try:
        check_splitwise_method(spec.method, splitwise_role)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


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

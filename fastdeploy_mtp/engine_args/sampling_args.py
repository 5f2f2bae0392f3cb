"""SAMPLING: the ``--temperature``, ``--top-p``, ... flags of ``generate`` and ``demo``,
resolved into :class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams` over a model
folder's defaults and checked against the speculative config's verify strategy."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from ..config import SpeculativeConfig
from ..runtime.sampling_params import MAX_LOGPROBS, SamplingParams
from .values import UsageError

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
            f"--temperature {params.temperature}: the speculative config's verify_strategy is "
            "'greedy', which only decodes greedily; use \"target_match\" (the default) or "
            '"rejection" to sample'
        )

"""``fd_config.speculative_config``: how drafts are made and verified (FastDeploy's keys,
vLLM's aliases), read from a dict or JSON text with every key type-checked, and the rule
that keeps model-free methods off splitwise instances."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .key_types import typed_keys
from .validators import fraction_fields, one_of, positive_fields

#: ``speculative_config.method`` values this package implements.
SPECULATIVE_METHODS = (None, "mtp", "ngram", "suffix", "naive")
#: Methods that draft without a model (no MTP layer, no draft KV caches).
MODEL_FREE_METHODS = ("ngram", "suffix", "naive")
#: vLLM's key names accepted by :meth:`SpeculativeConfig.from_dict`, and the field each one sets.
KEY_ALIASES = {"prompt_lookup_max": "max_ngram_size", "prompt_lookup_min": "min_ngram_size"}
#: ``speculative_config.mtp_strategy`` values.
MTP_STRATEGIES = ("default", "with_ngram")
#: ``speculative_config.verify_strategy`` values (``ops.VerifyStrategy`` by lower-case name).
VERIFY_STRATEGIES = ("greedy", "topp", "target_match", "rejection")
#: Values of ``SpeculativeConfig.mtp_layer_schedule``.
MTP_LAYER_SCHEDULES = ("cycle", "repeat_last", "first")
#: The most drafts per request and round (``num_speculative_tokens``) any command accepts: 8,
#: the longest draft vLLM runs MTP with. Acceptance of a draft at position ``i`` needs every
#: draft before it accepted, so positions past 8 almost never pay for their verify rows, while
#: each one widens every slot's draft row, verify rows and KV reservation. ``serve
#: --token-channel sysv`` allows fewer: FastDeploy's SysV token message carries
#: ``ops.MAX_DRAFT_TOKENS`` (6) tokens per request and step.
MAX_NUM_SPECULATIVE_TOKENS = 8


class SpeculativeConfigError(ValueError):
    """A speculative config (JSON text or dict) that cannot be used; the one-line message
    names the offending key."""


@dataclass
class SpeculativeConfig:
    """``fd_config.speculative_config``.

    Attributes:
        method: how drafts are made: ``"mtp"`` (the model's MTP layer), ``"ngram"`` (the
            ``ngram_match`` op: the continuation of the newest n-gram's leftmost earlier
            occurrence in the prompt or the output), ``"suffix"`` (suffix decoding: the most
            frequent continuation of the longest matching suffix, from the request's own
            tokens and optionally from finished requests' outputs), ``"naive"`` (no drafts:
            one token per step through the speculative step), or ``None`` for no
            speculation.
        num_speculative_tokens: ``K``, draft tokens per round (``draft_tokens`` is ``K + 1``
            wide), ``1 <= K <=`` :data:`MAX_NUM_SPECULATIVE_TOKENS` (8).
        num_model_steps: ``S``, MTP substeps per round, ``1 <= S <= K``. With
            ``mtp_strategy == "with_ngram"`` and ``K > S`` the remaining slots are filled by
            n-gram matching (``hybrid_mtp_ngram``).
        mtp_strategy: ``"default"`` or ``"with_ngram"``.
        max_ngram_size / min_ngram_size: n-gram lengths tried by the hybrid mode (both) and
            by ``method == "ngram"`` (``max_ngram_size`` only: FastDeploy's ``ngram_match`` op
            tries every ``n`` from ``max_ngram_size`` down to 1, so ``min_ngram_size`` is
            validated but does not bound it). vLLM's ``prompt_lookup_max`` /
            ``prompt_lookup_min`` are accepted as the same keys.
        model: path of the MTP checkpoint (informational).
        verify_strategy: how the target checks drafts of requests that sample
            (``temperature > 0``; greedy requests are verified by argmax under every strategy):
            ``"target_match"`` (default, as FastDeploy since April 2026: accept a draft iff it
            equals the target's own seeded sample, so output equals non-speculative output),
            ``"rejection"`` (rejection sampling: lossless in distribution), ``"topp"``
            (upstream's lossy top-p candidate test) or ``"greedy"`` (every request must be
            greedy).
        mtp_layer_schedule: which of a checkpoint's ``num_nextn_predict_layers`` distinct MTP
            layers substep ``s`` runs: ``"cycle"`` (default: layer ``s % L``), ``"repeat_last"``
            (layer ``min(s, L - 1)``) or ``"first"`` (always layer 0, as FastDeploy and vLLM
            do). One layer: always layer 0.
        adaptive_draft_length: the draft planner (see
            :mod:`fastdeploy_mtp.runtime.draft_planner`): each round, from measured step costs
            and each request's measured acceptance, how many drafts every request gets (0
            included; when no request drafts with the MTP layer it is skipped for the round) and,
            with ``verify_strategy`` ``"target_match"`` or ``"greedy"``, which method makes them:
            the MTP layer as configured, n-gram matching or suffix decoding
            (:attr:`per_request_methods`).
        acceptance_window: rounds the per-position acceptance estimate averages over (an
            exponential moving average with weight ``2 / (window + 1)``), as TensorRT-LLM's
            ``acceptance_window``.
        adaptive_probe_interval: every this many rounds the draft planner re-measures the
            step cost of the best MTP substep count other than the one in force (two rounds at
            it, 0 substeps included); the interval doubles after each probe that does not change
            the choice (up to 16 times this value).
        suffix_decoding_max_tree_depth: ``method == "suffix"``: the longest token sequence
            suffix decoding counts (vLLM's key); a match is at most this minus one tokens long
            and the match plus its drafts at most this long.
        suffix_decoding_max_cached_requests: ``method == "suffix"``: finished requests whose
            outputs stay in the shared cache that every request also drafts from (oldest
            dropped first); 0 = each request drafts only from its own prompt and output.
        suffix_decoding_max_spec_factor: ``method == "suffix"``: a match of ``m`` tokens drafts
            at most ``int(factor * m)`` tokens (and at most ``num_speculative_tokens``).
        suffix_decoding_min_token_prob: ``method == "suffix"``: drafting stops before a token
            whose estimated probability (the product of the continuation frequencies along
            the drafted path) is below this.
    """

    method: str | None = "mtp"
    num_speculative_tokens: int = 1
    num_model_steps: int = 1
    mtp_strategy: str = "default"
    max_ngram_size: int = 5
    min_ngram_size: int = 2
    model: str = ""
    verify_strategy: str = "target_match"
    mtp_layer_schedule: str = "cycle"
    adaptive_draft_length: bool = False
    acceptance_window: int = 8
    adaptive_probe_interval: int = 16
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 128
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1

    @property
    def per_request_methods(self) -> bool:
        """Whether the draft planner may give each request n-gram or suffix drafts instead of
        the MTP layer's: ``adaptive_draft_length`` with a strategy that verifies any drafts
        exactly (``"target_match"`` or ``"greedy"``; rejection sampling needs the MTP layer's
        draft probabilities)."""
        return (
            self.method == "mtp"
            and self.adaptive_draft_length
            and self.verify_strategy in ("target_match", "greedy")
        )

    def __post_init__(self) -> None:
        for name, allowed in (
            ("method", SPECULATIVE_METHODS),
            ("mtp_strategy", MTP_STRATEGIES),
            ("verify_strategy", VERIFY_STRATEGIES),
            ("mtp_layer_schedule", MTP_LAYER_SCHEDULES),
        ):
            one_of(getattr(self, name), allowed, f"SpeculativeConfig.{name}")
        if self.method is None:
            return
        positive_fields(
            self, "num_speculative_tokens", "num_model_steps", "min_ngram_size", "acceptance_window"
        )
        positive_fields(self, "adaptive_probe_interval")
        if self.num_speculative_tokens > MAX_NUM_SPECULATIVE_TOKENS:
            raise ValueError(
                f"SpeculativeConfig.num_speculative_tokens must be <= "
                f"{MAX_NUM_SPECULATIVE_TOKENS}, got {self.num_speculative_tokens}"
            )
        if self.num_model_steps > self.num_speculative_tokens:
            raise ValueError(
                f"SpeculativeConfig.num_model_steps ({self.num_model_steps}) must be <= "
                f"num_speculative_tokens ({self.num_speculative_tokens})"
            )
        if self.max_ngram_size < self.min_ngram_size:
            raise ValueError(
                f"SpeculativeConfig.max_ngram_size ({self.max_ngram_size}) must be >= "
                f"min_ngram_size ({self.min_ngram_size})"
            )
        self._check_suffix_decoding()
        if self.method in MODEL_FREE_METHODS:
            if self.adaptive_draft_length:
                raise ValueError(
                    "SpeculativeConfig.adaptive_draft_length needs method 'mtp' (it sizes MTP "
                    f"substeps), got method {self.method!r}"
                )
            if self.mtp_strategy != "default":
                raise ValueError(
                    f"SpeculativeConfig.mtp_strategy {self.mtp_strategy!r} needs method 'mtp', got "
                    f"method {self.method!r}"
                )

    def _check_suffix_decoding(self) -> None:
        positive_fields(self, "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor")
        if not math.isfinite(self.suffix_decoding_max_spec_factor):
            raise ValueError(
                "SpeculativeConfig.suffix_decoding_max_spec_factor must be a finite number, got "
                f"{self.suffix_decoding_max_spec_factor}"
            )
        positive_fields(self, "suffix_decoding_max_cached_requests", allow_zero=True)
        fraction_fields(self, "suffix_decoding_min_token_prob")

    @property
    def enabled(self) -> bool:
        return self.method is not None

    @property
    def uses_mtp(self) -> bool:
        """Whether the method runs the model's MTP layer (which then needs its KV caches)."""
        return self.method == "mtp"

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SpeculativeConfig:
        """A config from FastDeploy's ``speculative_config`` keys (the attributes above).

        ``method`` may be ``None`` or ``"none"`` (no speculation; the other keys are then
        not checked), ``"mtp"``, ``"ngram"``, ``"suffix"`` or ``"naive"``; it defaults to
        ``"mtp"``. Keys left out take the defaults above, except ``num_model_steps``, which
        defaults to ``num_speculative_tokens`` (or 1 with ``mtp_strategy == "with_ngram"``, so
        n-gram matching fills the other slots). vLLM's ``prompt_lookup_max`` and
        ``prompt_lookup_min`` set ``max_ngram_size`` and ``min_ngram_size``.

        Raises:
            SpeculativeConfigError: an unknown key (the message lists the known ones), a value
                of the wrong type (integers for the sizes, strings for the others; ``true``
                is not an integer), a key given under both of its names with different
                values, or a value the config refuses (see ``__post_init__``).
        """
        if not isinstance(values, Mapping):
            raise SpeculativeConfigError(
                f"speculative config must be a JSON object (a dict), got {type(values).__name__}"
            )
        values = _resolve_aliases(values)
        kwargs = typed_keys(SpeculativeConfig, values, "speculative config", SpeculativeConfigError)
        if kwargs.get("method") == "none":
            kwargs["method"] = None
        if "num_model_steps" not in kwargs:
            k = kwargs.get("num_speculative_tokens", cls.num_speculative_tokens)
            kwargs["num_model_steps"] = 1 if kwargs.get("mtp_strategy") == "with_ngram" else k
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise SpeculativeConfigError(f"speculative config: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        """:meth:`from_dict` of a JSON object, e.g.
        ``'{"method": "mtp", "num_speculative_tokens": 3, "mtp_strategy": "with_ngram"}'``.

        Raises:
            SpeculativeConfigError: text that is not JSON (the message gives the line and
                column), JSON that is not an object, or anything :meth:`from_dict` refuses.
        """
        return cls.from_dict(load_speculative_json(text))

    def to_json(self) -> str:
        """The JSON object :meth:`from_json` reads back into an equal config."""
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)})


def _resolve_aliases(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each :data:`KEY_ALIASES` key renamed to its field.

    Raises:
        SpeculativeConfigError: an alias whose value is not an integer (both aliased fields
            are integers; named as given, not as the field), or an alias and its field both
            given, with different values.
    """
    out = dict(values)
    for alias, name in KEY_ALIASES.items():
        if alias not in out:
            continue
        value = out.pop(alias)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpeculativeConfigError(
                f"speculative config: {alias!r} must be an integer, got "
                f"{json.dumps(value, default=repr)}"
            )
        if name in out and out[name] != value:
            raise SpeculativeConfigError(
                f"speculative config: {alias!r} ({json.dumps(value, default=repr)}) and {name!r} "
                f"({json.dumps(out[name], default=repr)}) name the same setting; give one of them"
            )
        out[name] = value
    return out


def load_speculative_json(text: str) -> dict[str, Any]:
    """The JSON object ``text`` as a dict (keys not checked yet; see
    :meth:`SpeculativeConfig.from_dict`).

    Raises:
        SpeculativeConfigError: ``text`` is not valid JSON, or not a JSON object.
    """
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpeculativeConfigError(f"speculative config is not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise SpeculativeConfigError(
            f"speculative config must be a JSON object ({{...}}), got {type(values).__name__}: "
            f"{text.strip()!r}"
        )
    return values


def check_splitwise_method(method: str | None, splitwise_role: str) -> None:
    """Refuse a model-free drafting method on a splitwise (prefill or decode) instance: the
    slot hand-over carries the MTP proposer's draft state, not the suffix sequences, and the
    model-free methods are not tested across it.

    Raises:
        ValueError: ``method`` in :data:`MODEL_FREE_METHODS` and ``splitwise_role != "mixed"``.
    """
    if method in MODEL_FREE_METHODS and splitwise_role != "mixed":
        raise ValueError(
            f"speculative_config.method {method!r} is not supported with splitwise_role "
            f"{splitwise_role!r}: use method 'mtp' or null (no speculation) on prefill and decode "
            "instances"
        )

"""Serving configuration with FastDeploy's attribute names (duck-type compatible).

``MTPProposer`` and the reference engine read ``fd_config.<section>.<attribute>`` exactly as
FastDeploy's proposer does, so an engine that already has a FastDeploy ``FDConfig`` can pass
it unchanged; these dataclasses are the minimal set the package needs, with defaults and
validation that names the offending field.
"""

from __future__ import annotations

import functools
import json
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if (
    TYPE_CHECKING
):  # imported when a speculative config is first read: workers that never read one skip it
    import pydantic

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
#: ``scheduler_config.splitwise_role`` values.
SPLITWISE_ROLES = ("mixed", "prefill", "decode")


class SpeculativeConfigError(ValueError):
    """A speculative config (JSON text or dict) that cannot be used; the one-line message
    names the offending key."""


def _positive(obj: object, *names: str, allow_zero: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        if value < 0 or (value == 0 and not allow_zero):
            kind = ">= 0" if allow_zero else "> 0"
            raise ValueError(f"{type(obj).__name__}.{name} must be {kind}, got {value}")


@dataclass
class ModelConfig:
    """``fd_config.model_config``.

    Attributes:
        model: path of the target checkpoint (informational).
        architectures: e.g. ``["TinyForCausalLM"]``; the proposer derives the MTP layer's
            architecture name by replacing ``"Moe"`` with ``"MTP"`` as FastDeploy does.
        max_model_len: ``L``, the longest sequence (prompt + generated) a slot holds.
        vocab_size / ori_vocab_size: padded and real vocabulary.
        hidden_size: ``H``.
        num_hidden_layers: target decoder layers.
        eos_token_id: ids that end a request.
    """

    model: str = ""
    architectures: list[str] = field(default_factory=lambda: ["TinyForCausalLM"])
    max_model_len: int = 2048
    vocab_size: int = 272
    ori_vocab_size: int = 256
    hidden_size: int = 128
    num_hidden_layers: int = 2
    eos_token_id: list[int] = field(default_factory=lambda: [256])

    def __post_init__(self) -> None:
        _positive(self, "max_model_len", "vocab_size", "ori_vocab_size", "hidden_size")
        if not self.eos_token_id:
            raise ValueError("ModelConfig.eos_token_id must name at least one id")


@dataclass
class SpeculativeConfig:
    """``fd_config.speculative_config``.

    Attributes:
        method: how drafts are made: ``"mtp"`` (the model's MTP layer), ``"ngram"`` (the
            ``ngram_match`` op: the continuation of the newest n-gram's leftmost earlier
            occurrence in the prompt or the output), ``"suffix"`` (suffix decoding: the most
            frequent continuation of the longest matching suffix, from a per-request suffix
            trie and optionally one over finished requests' outputs), ``"naive"`` (no drafts:
            one token per step through the speculative step), or ``None`` for no
            speculation.
        num_speculative_tokens: ``K``, draft tokens per round (``draft_tokens`` is ``K + 1``
            wide).
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
        adaptive_draft_length: per request, draft only as many tokens as its observed
            acceptance pays for (see :mod:`fastdeploy_mtp.runtime.adaptive_draft`): from
            ``num_speculative_tokens`` down to 0 (plain decoding; when every running request
            is at 0 the MTP layer is skipped for the round) and back.
        acceptance_window: rounds the per-position acceptance estimate averages over (an
            exponential moving average with weight ``2 / (window + 1)``), as TensorRT-LLM's
            ``acceptance_window``.
        acceptance_rate_threshold: a request drafts position ``i`` while its estimated
            probability that drafts ``1..i`` are all accepted is at least this (TensorRT-LLM's
            ``acceptance_rate_threshold`` names the same knob for its whole-batch switch).
        adaptive_probe_interval: every this many rounds the adaptive controller re-measures
            the best budget other than the one in force (two rounds at it), or, with no slot
            wanting drafts, drafts one token per slot to re-measure acceptance; the interval
            doubles after each probe that does not change the choice (up to 16 times this value).
        suffix_decoding_max_tree_depth: ``method == "suffix"``: the longest token sequence
            the suffix tries count (vLLM's key); a match is at most this minus one tokens long
            and the match plus its drafts at most this long.
        suffix_decoding_max_cached_requests: ``method == "suffix"``: finished requests whose
            outputs stay in the shared trie that every request also drafts from (oldest
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
    acceptance_rate_threshold: float = 0.3
    adaptive_probe_interval: int = 16
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 128
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"SpeculativeConfig.method must be one of {SPECULATIVE_METHODS}, got {self.method!r}"
            )
        if self.mtp_strategy not in MTP_STRATEGIES:
            raise ValueError(
                f"SpeculativeConfig.mtp_strategy must be one of {MTP_STRATEGIES}, got {self.mtp_strategy!r}"
            )
        if self.verify_strategy not in VERIFY_STRATEGIES:
            raise ValueError(
                f"SpeculativeConfig.verify_strategy must be one of {VERIFY_STRATEGIES}, got {self.verify_strategy!r}"
            )
        if self.mtp_layer_schedule not in MTP_LAYER_SCHEDULES:
            raise ValueError(
                f"SpeculativeConfig.mtp_layer_schedule must be one of {MTP_LAYER_SCHEDULES}, "
                f"got {self.mtp_layer_schedule!r}"
            )
        if self.method is None:
            return
        _positive(
            self, "num_speculative_tokens", "num_model_steps", "min_ngram_size", "acceptance_window"
        )
        _positive(self, "adaptive_probe_interval")
        if not 0.0 <= self.acceptance_rate_threshold <= 1.0:
            raise ValueError(
                f"SpeculativeConfig.acceptance_rate_threshold must be in [0, 1], got {self.acceptance_rate_threshold}"
            )
        if self.num_model_steps > self.num_speculative_tokens:
            raise ValueError(
                f"SpeculativeConfig.num_model_steps ({self.num_model_steps}) must be "
                f"<= num_speculative_tokens ({self.num_speculative_tokens})"
            )
        if self.max_ngram_size < self.min_ngram_size:
            raise ValueError(
                f"SpeculativeConfig.max_ngram_size ({self.max_ngram_size}) must be "
                f">= min_ngram_size ({self.min_ngram_size})"
            )
        _positive(self, "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor")
        if not math.isfinite(self.suffix_decoding_max_spec_factor):
            raise ValueError(
                "SpeculativeConfig.suffix_decoding_max_spec_factor must be a finite number, "
                f"got {self.suffix_decoding_max_spec_factor}"
            )
        _positive(self, "suffix_decoding_max_cached_requests", allow_zero=True)
        if not 0.0 <= self.suffix_decoding_min_token_prob <= 1.0:
            raise ValueError(
                "SpeculativeConfig.suffix_decoding_min_token_prob must be in [0, 1], "
                f"got {self.suffix_decoding_min_token_prob}"
            )
        if self.method in MODEL_FREE_METHODS:
            if self.adaptive_draft_length:
                raise ValueError(
                    f"SpeculativeConfig.adaptive_draft_length needs method 'mtp' (it sizes MTP substeps), "
                    f"got method {self.method!r}"
                )
            if self.mtp_strategy != "default":
                raise ValueError(
                    f"SpeculativeConfig.mtp_strategy {self.mtp_strategy!r} needs method 'mtp', "
                    f"got method {self.method!r}"
                )

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
                f"speculative config: {alias!r} must be an integer, got {json.dumps(value, default=repr)}"
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
            f"speculative config must be a JSON object ({{...}}), got {type(values).__name__}: {text.strip()!r}"
        )
    return values


#: How a pydantic type error reads in a config message, by error type.
_TYPE_WORDS = {
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "true or false",
    "float_type": "a number",
}


@functools.cache
def _keys_model(cls: type) -> type[pydantic.BaseModel]:
    """A pydantic model of dataclass ``cls``'s keys, typed as its fields, strict (no ``"3"``
    for 3, no ``true`` for an integer; an integer is taken for a number) and refusing unknown
    keys. Defaults are never validated: :func:`typed_keys` keeps only the keys given
    (``model_fields_set``) and lets the dataclass fill the rest."""
    import pydantic

    hints = typing.get_type_hints(cls)
    keys: dict[str, Any] = {f.name: (hints[f.name], None) for f in fields(cls)}
    return pydantic.create_model(
        f"{cls.__name__}Keys", __config__=pydantic.ConfigDict(strict=True, extra="forbid"), **keys
    )


def typed_keys(
    cls: type, values: Mapping[str, Any], what: str, error: type[ValueError] = ValueError
) -> dict[str, Any]:
    """The keys given in ``values`` for dataclass ``cls``, type-checked against its field
    types; the first problem is a one-line ``error`` naming the key, under ``what`` (e.g.
    ``"speculative config"``). The dataclass's own ``__post_init__`` checks ranges after."""
    import pydantic

    try:
        checked = _keys_model(cls).model_validate(dict(values))
    except pydantic.ValidationError as exc:
        problem = exc.errors()[0]
        key, value = str(problem["loc"][0]), problem["input"]
        if problem["type"] == "extra_forbidden":
            known = ", ".join(f.name for f in fields(cls))
            raise error(f"{what}: unknown key {key!r}; known keys: {known}") from None
        nullable = type(None) in typing.get_args(typing.get_type_hints(cls)[key])
        want = _TYPE_WORDS.get(problem["type"], problem["msg"]) + (" or null" if nullable else "")
        raise error(
            f"{what}: {key!r} must be {want}, got {json.dumps(value, default=repr)}"
        ) from None
    return {name: getattr(checked, name) for name in checked.model_fields_set}


def check_splitwise_method(method: str | None, splitwise_role: str) -> None:
    """Refuse a model-free drafting method on a splitwise (prefill or decode) instance: the
    slot hand-over carries the MTP proposer's draft state, not the suffix tries, and the
    model-free methods are not tested across it.

    Raises:
        ValueError: ``method`` in :data:`MODEL_FREE_METHODS` and ``splitwise_role != "mixed"``.
    """
    if method in MODEL_FREE_METHODS and splitwise_role != "mixed":
        raise ValueError(
            f"speculative_config.method {method!r} is not supported with splitwise_role {splitwise_role!r}: "
            "use method 'mtp' or null (no speculation) on prefill and decode instances"
        )


@dataclass
class SchedulerConfig:
    """``fd_config.scheduler_config``.

    Attributes:
        max_num_seqs: ``N``, batch slots.
        max_num_batched_tokens: token budget of one target forward (chunked prefill splits
            prompts to fit it).
        splitwise_role: ``"mixed"``, ``"prefill"`` or ``"decode"``.
        enable_overlap_schedule: FastDeploy's switch for sizing the proposer's substeps by an
            upper bound instead of a host read. Accepted for compatibility; this proposer always
            sizes them by host-known bounds (the target's token count, then the slots in use),
            so no round reads a length back.
    """

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    splitwise_role: str = "mixed"
    enable_overlap_schedule: bool = False

    def __post_init__(self) -> None:
        _positive(self, "max_num_seqs", "max_num_batched_tokens")
        if self.splitwise_role not in SPLITWISE_ROLES:
            raise ValueError(
                f"SchedulerConfig.splitwise_role must be one of {SPLITWISE_ROLES}, got {self.splitwise_role!r}"
            )


@dataclass
class CacheConfig:
    """``fd_config.cache_config``.

    Attributes:
        block_size: tokens per KV block.
        total_block_num: KV blocks of the target (and of the MTP layer, which mirrors the
            target's block table).
        kv_cache_ratio: share of blocks for prompts in the v0 scheduler (the draft's free
            list is the rest, as FastDeploy lays it out).
        enc_dec_block_num: extra block-table columns per slot.
        num_cpu_blocks / kvcache_storage_backend: host swap blocks / an external KV store.
            As in FastDeploy, with either of them (or a splitwise role other than
            ``"mixed"``) a cache-manager process creates every KV cache, the MTP layer's
            included, and the worker attaches them by name.
        cache_manager: ``True``: a cache-manager process creates every KV cache (the
            target's and the MTP layer's) and publishes it by name; the target runner and the
            proposer attach them and never create any (``fastdeploy-mtp serve`` sets it).
            ``False``: this process creates its caches, whatever the rule below says (e.g. a
            single-process splitwise engine in tests). ``None`` (default): FastDeploy's rule.
        share_mtp_cache: when the proposer creates the MTP layer's caches itself, also
            publish them by name (``set_data_ipc``) for another process to attach. FastDeploy
            always publishes; the single-process engine has no such process (default off).
        cache_ready_timeout: seconds an attaching worker waits for ``cache_ready_signal``.
        enable_prefix_caching: share the KV blocks (every layer's, MTP included) of identical
            prompt prefixes between requests (:mod:`fastdeploy_mtp.runtime.block_pool`).
    """

    block_size: int = 16
    total_block_num: int = 256
    kv_cache_ratio: float = 0.75
    enc_dec_block_num: int = 2
    num_cpu_blocks: int = 0
    kvcache_storage_backend: str | None = None
    cache_manager: bool | None = None
    share_mtp_cache: bool = False
    cache_ready_timeout: float = 60.0
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        _positive(self, "block_size", "total_block_num")
        _positive(self, "enc_dec_block_num", allow_zero=True)
        if not 0.0 <= self.kv_cache_ratio <= 1.0:
            raise ValueError(
                f"CacheConfig.kv_cache_ratio must be in [0, 1], got {self.kv_cache_ratio}"
            )


@dataclass
class ParallelConfig:
    """``fd_config.parallel_config``: tensor parallelism and the names of shared resources.

    Attributes:
        tensor_parallel_size / tensor_parallel_rank: TP layout; with a size above 1 each
            worker runs its shard of the model (``load_tiny(tensor_parallel_size=...)``) in
            the group of :func:`fastdeploy_mtp.distributed.init_tensor_parallel`, and rank
            0's sampled tokens are broadcast.
        local_rank / device_id: this worker's rank and device.
        engine_worker_queue_port: suffix of the IPC names (``cache_ready_signal.<port>``,
            ``key_caches_{layer}_rank{r}.device{d}``).
    """

    tensor_parallel_size: int = 1
    tensor_parallel_rank: int = 0
    local_rank: int = 0
    device_id: int = 0
    engine_worker_queue_port: int = 8002

    def __post_init__(self) -> None:
        _positive(self, "tensor_parallel_size")
        if not 0 <= self.tensor_parallel_rank < self.tensor_parallel_size:
            raise ValueError(
                f"ParallelConfig.tensor_parallel_rank must be in "
                f"[0, {self.tensor_parallel_size}), got {self.tensor_parallel_rank}"
            )


@dataclass
class FDConfig:
    """``fd_config``: the sections above under FastDeploy's names."""

    model_config: ModelConfig = field(default_factory=ModelConfig)
    speculative_config: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        check_splitwise_method(self.speculative_config.method, self.scheduler_config.splitwise_role)

    @property
    def max_blocks_per_seq(self) -> int:
        """``B``: block-table columns per slot, ``ceil(L / block_size) + enc_dec_block_num``."""
        bs = self.cache_config.block_size
        return -(-self.model_config.max_model_len // bs) + self.cache_config.enc_dec_block_num

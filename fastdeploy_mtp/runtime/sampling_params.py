"""Per-request sampling parameters and the engine's token sampler.

:class:`SamplingParams` is what a request asks for (the OpenAI/vLLM names);
:class:`TokenLogprob` what it gets back per emitted token when it asks for logprobs.

Sampling at ``temperature > 0`` is **reproducible per request and position**: the uniform that
picks the token generated at position ``g`` (0 = the first generated token) of a request is
``position_uniforms(seed, g, column)`` (Philox-4x32-10, :mod:`fastdeploy_mtp.ops.sampling`),
whatever the batch, the slot, the step or the speculation. With ``verify_strategy =
"target_match"`` the target's sample at a verify row is that same function of the row's
logits, so a seeded request generates exactly the tokens it generates without speculation
(drafts only decide how many positions one forward settles).

What the sampler does to a row's logits (``[V]`` float32), in order — the same for the
speculative verify rows and the non-speculative row, because row ``j`` of a decode item is
penalised with the committed history **plus** the drafts ``d1..dj`` it follows:

1. penalties (``speculate_get_token_penalty_multi_scores``): repetition (``logit / a`` if
   positive, ``* a`` if negative, for every id generated before), then ``- count * frequency -
   presence``; EOS ids (and, after the op, ``stop_token_ids``) masked while fewer than
   ``min_tokens`` were generated; then divided by ``temperature`` (not at ``temperature = 0``);
2. ``logprobs`` are ``log_softmax`` of these processed logits;
3. filtering: ``top_k`` (keep the k largest), ``top_p`` (the smallest prefix of the sorted
   probabilities reaching ``top_p``), ``min_p`` (drop tokens below ``min_p`` times the top
   probability);
4. the token: at ``temperature = 0`` the argmax of step 1's logits; otherwise the first token
   (in vocabulary order) whose cumulative filtered probability exceeds ``u``, the uniform of
   ``(seed, g, 0)``.
"""

from __future__ import annotations

import math
import numbers
import zlib
from dataclasses import dataclass, field
from typing import Any

from .grammar import guided_problem

#: Largest top-logprobs count a request may ask for (OpenAI's limit for completions).
MAX_LOGPROBS = 20
#: Values of :attr:`SamplingParams.speculative_method` (a request's own drafting method).
SPECULATIVE_METHOD_PINS = ("mtp", "ngram", "suffix", "none")
#: A temperature below this samples greedily (as vLLM's sampling epsilon).
GREEDY_BELOW = 1e-5


@dataclass
class SamplingParams:
    """How one request picks its tokens.

    Attributes:
        temperature: 0 = greedy (the argmax; so is anything below 1e-5); otherwise samples from
            ``softmax(logits / temperature)``.
        top_p: keep the smallest set of most likely tokens whose probability reaches it (1 = off).
        top_k: keep the ``top_k`` most likely tokens (0 = off).
        min_p: drop tokens less likely than ``min_p`` times the most likely one (0 = off).
        seed: the request's random seed (``None``: derived from its ``request_id``, so a rerun of
            the same id reproduces it).
        repetition_penalty: > 0; 1 = off (> 1 discourages tokens generated before).
        frequency_penalty / presence_penalty: subtracted per occurrence / once per token
            generated before (0 = off; OpenAI's range [-2, 2]).
        min_tokens: neither the EOS ids nor ``stop_token_ids`` (a served model's EOS ids among
            them) can be generated before this many tokens (vLLM's meaning).
        ignore_eos: the model's EOS ids do not end this request: they are masked (``-inf``)
            at every position, as ``min_tokens`` masks them, so it runs to ``max_tokens`` or a
            stop string/id. (The engine stops a slot at an EOS id in the ops themselves, for
            every slot alike, so an EOS token cannot be emitted and stepped over; vLLM's
            ``ignore_eos`` lets EOS tokens through into the output instead.)
        stop: strings that end the output (the string itself is not returned).
        stop_token_ids: token ids that end the output (the id is returned, as EOS is).
        logprobs: ``None`` = none; ``k >= 0``: the log-probability of each emitted token plus
            the ``k`` most likely alternatives at its position (at most :data:`MAX_LOGPROBS`).
        include_draft_logprobs: also report, per step, the MTP drafts the target verified
            and the MTP layer's log-probability of each (:class:`StepDrafts`; FastDeploy's
            request flag). Needs ``logprobs``. Without speculation the list stays empty.
        guided: ``None``, or a constraint on the output: ``{"kind": k, "spec": s}`` with ``k``
            one of :data:`~fastdeploy_mtp.runtime.grammar.GUIDED_KINDS` (``"json"``: ``s`` a
            JSON schema dict; ``"json_object"``: ``s`` None; ``"regex"``: a regular expression
            the whole output matches; ``"choice"``: a list of strings; ``"grammar"``: a Lark
            grammar). Applied to the logits first (a token the constraint does not allow at a
            position gets ``-inf``), so tokens and logprobs come from the masked distribution; see
            :mod:`~fastdeploy_mtp.runtime.guided`.
        speculative_method: ``None`` (the engine's draft planner chooses per round), or the
            one drafting method this request uses: ``"mtp"`` (the MTP layer as configured),
            ``"ngram"``, ``"suffix"``, or ``"none"`` (no drafts). Only with the planner and a
            method the deployment offers (:data:`SPECULATIVE_METHOD_PINS`); otherwise the
            request is refused. It changes how many tokens a step settles, not which.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None
    include_draft_logprobs: bool = False
    guided: dict[str, Any] | None = None
    speculative_method: str | None = None

    @property
    def greedy(self) -> bool:
        """``temperature`` below :data:`GREEDY_BELOW` (the argmax: dividing by so small a
        temperature would only overflow float32)."""
        return self.temperature < GREEDY_BELOW

    def check(self) -> str | None:
        """``None`` if valid, else the name of the first bad field and why, as
        ``"field: message"``."""
        floats = {
            "temperature": (0.0, math.inf),
            "top_p": (0.0, 1.0),
            "min_p": (0.0, 1.0),
            "repetition_penalty": (0.0, math.inf),
            "frequency_penalty": (-2.0, 2.0),
            "presence_penalty": (-2.0, 2.0),
        }
        for name, (lo, hi) in floats.items():
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, numbers.Real)
                or not math.isfinite(float(v))
            ):
                return f"{name}: must be a finite number, got {v!r}"
            if not lo <= float(v) <= hi:
                return f"{name}: must be in [{lo:g}, {hi:g}], got {v!r}"
        if self.top_p <= 0.0:
            return f"top_p: must be > 0, got {self.top_p!r}"
        if self.repetition_penalty <= 0.0:
            return f"repetition_penalty: must be > 0, got {self.repetition_penalty!r}"
        for name in ("top_k", "min_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                return f"{name}: must be an integer >= 0, got {v!r}"
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, numbers.Integral)
            or not 0 <= self.seed < 2**63
        ):
            return f"seed: must be an integer in [0, 2**63), got {self.seed!r}"
        if self.logprobs is not None and (
            isinstance(self.logprobs, bool)
            or not isinstance(self.logprobs, numbers.Integral)
            or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            return f"logprobs: must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}"
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            return f"stop: must be a list of non-empty strings, got {self.stop!r}"
        if not isinstance(self.stop_token_ids, list) or not all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0
            for t in self.stop_token_ids
        ):
            return f"stop_token_ids: must be a list of token ids, got {self.stop_token_ids!r}"
        if not isinstance(self.ignore_eos, bool):
            return f"ignore_eos: must be true or false, got {self.ignore_eos!r}"
        if not isinstance(self.include_draft_logprobs, bool):
            return (
                "include_draft_logprobs: must be true or false, got "
                f"{self.include_draft_logprobs!r}"
            )
        if self.include_draft_logprobs and self.logprobs is None:
            return (
                "include_draft_logprobs: needs logprobs (the draft logprobs come with the "
                "tokens' logprobs)"
            )
        problem = guided_problem(self.guided)
        if problem is not None:
            return f"guided: {problem}"
        if self.speculative_method is not None and (
            self.speculative_method not in SPECULATIVE_METHOD_PINS
        ):
            return (
                f"speculative_method: must be one of {', '.join(SPECULATIVE_METHOD_PINS)}, got "
                f"{self.speculative_method!r}"
            )
        return None

    def eos_ban_len(self, max_tokens: int) -> int:
        """The slot's ``min_dec_len`` for a request of ``max_tokens``: the EOS ids are masked
        while fewer tokens than this were generated -- ``min_tokens``, or with ``ignore_eos``
        ``max_tokens`` (every position the request can reach)."""
        return int(max_tokens) if self.ignore_eos else int(self.min_tokens)

    @property
    def penalised(self) -> bool:
        """Whether the penalty op runs on this request's rows (a penalty, or EOS ids masked)."""
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.min_tokens > 0
            or self.ignore_eos
        )

    def seed_for(self, request_id: str) -> int:
        """The seed the sampler uses: :attr:`seed`, or a stable hash of ``request_id``."""
        if self.seed is not None:
            return int(self.seed)
        raw = request_id.encode()
        return (zlib.crc32(raw) | (zlib.adler32(raw) << 32)) & (2**63 - 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "seed": self.seed,
            "repetition_penalty": self.repetition_penalty,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "min_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos,
            "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids),
            "logprobs": self.logprobs,
            "include_draft_logprobs": self.include_draft_logprobs,
            "guided": None if self.guided is None else dict(self.guided),
            "speculative_method": self.speculative_method,
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SamplingParams:
        return cls(**values)


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice ``index`` of a request that asks for several choices (OpenAI's
    ``n``/``best_of``) with the seed ``seed``: ``(seed + index) mod 2**63``. Choice 0 keeps
    ``seed``, so asking for more choices never changes the first; choice ``i`` is what a
    one-choice request with seed ``seed + i`` generates."""
    return (int(seed) + int(index)) % 2**63


@dataclass
class TokenLogprob:
    """One emitted token's log-probability (``log_softmax`` of the processed logits at its
    position) and the ``k`` most likely tokens there, most likely first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class StepDrafts:
    """The MTP drafts one step verified for a request (``include_draft_logprobs``).

    Attributes:
        position: index in the output of the first token the step emitted; draft ``j``
            (0-based) proposed the token at ``position + j`` (it was accepted when that output
            token equals it and every draft before it was accepted).
        drafts: one :class:`TokenLogprob` per draft the MTP layer proposed, in order: the draft
            token and its log-probability under the MTP layer (``log_softmax`` of the layer's
            logits at that draft's position, the distribution the draft was picked from; no
            alternatives). Drafts filled in by n-gram matching (``mtp_strategy:
            "with_ngram"``) have no such distribution and are not listed.
    """

    position: int
    drafts: list[TokenLogprob] = field(default_factory=list)

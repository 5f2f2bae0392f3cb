"""The reference engine's speculation statistics, and how one step's output counts in them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..constants import PLACEHOLDER_TOKEN_ID
from .draft_methods import METHOD_LABELS
from .target_runner import StepOutput


@dataclass
class Metrics:
    """Speculation statistics of one run.

    Attributes:
        target_forwards: target forward passes (engine steps that ran the model).
        decode_item_steps: (slot, step) pairs that decoded.
        emitted_tokens: tokens emitted by those decode steps.
        generated_tokens: all generated tokens (prefill's first tokens included).
        proposed: ``[K]`` int64, drafts offered at draft position ``i + 1``.
        accepted: ``[K]`` int64, drafts accepted at draft position ``i + 1``.
        wall_seconds: wall time of the loop.
        glue_seconds: time of the target steps outside model forwards and logits (0 when
            the runner does not time its steps, e.g. one driving worker processes).
        handed_off: splitwise prefill: requests handed to a decode instance.
        handoff_drafts_proposed / handoff_drafts_accepted: splitwise decode: drafts a
            prefill instance made that the first verify round here offered / accepted.
        method: the drafting method (``speculative_config.method``: ``"mtp"``, ``"ngram"``,
            ``"suffix"``, ``"naive"``, or ``"none"`` without speculation), the ``method``
            label of the ``/metrics`` speculation series.
        guided_drafts_checked: drafts of grammar-constrained requests checked against their
            grammar before verification.
        guided_drafts_cut: of those, drafts cut before verification (past the longest
            grammar-valid prefix; never offered to the target, not in ``proposed``).
        guided_seconds: host time in grammar work (draft checks, token masks, advancing the
            matchers, the MTP substeps' draft masks; see :mod:`~fastdeploy_mtp.runtime.guided`).
        guided_rounds: target steps that did grammar work (a constrained request ran).
        method_drafts: per drafting method that made verified drafts (``"mtp"``, ``"ngram"``,
            ``"suffix"``; with the draft planner each request's method of each round; a
            round's drafts that only the grammar forced: ``"grammar"``): ``[offered,
            accepted]``.
        forced_drafts_proposed / forced_drafts_accepted: drafts a constrained request's
            grammar forced (:mod:`~fastdeploy_mtp.runtime.guided_forced`) that the target
            verified / accepted; they are also counted in ``proposed`` / ``accepted``, as every
            verified draft is.
    """

    target_forwards: int = 0
    decode_item_steps: int = 0
    emitted_tokens: int = 0
    generated_tokens: int = 0
    proposed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    wall_seconds: float = 0.0
    glue_seconds: float = 0.0
    handed_off: int = 0
    handoff_drafts_proposed: int = 0
    handoff_drafts_accepted: int = 0
    method: str = "none"
    guided_drafts_checked: int = 0
    guided_drafts_cut: int = 0
    guided_seconds: float = 0.0
    guided_rounds: int = 0
    method_drafts: dict[str, list[int]] = field(default_factory=dict)
    forced_drafts_proposed: int = 0
    forced_drafts_accepted: int = 0

    @classmethod
    def for_drafts(cls, k: int, method: str | None = None) -> Metrics:
        """Empty statistics of an engine that proposes up to ``k`` drafts per round with
        ``method`` (``None``: no speculation)."""
        return cls(
            proposed=np.zeros(k, np.int64), accepted=np.zeros(k, np.int64), method=method or "none"
        )

    @property
    def glue_ms_per_round(self) -> float:
        """Milliseconds per engine step outside model forwards and logits: the ops, Python and
        host copies of the target step and the proposer's round (0 when the runner does not
        time its steps, e.g. one driving worker processes)."""
        if not self.target_forwards:
            return 0.0
        return 1000.0 * self.glue_seconds / self.target_forwards

    @property
    def guided_ms_per_round(self) -> float:
        """Milliseconds of grammar work per target step that had a constrained request."""
        return 1000.0 * self.guided_seconds / self.guided_rounds if self.guided_rounds else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per decoding item per target forward (1.0 = no speculation gain)."""
        return self.emitted_tokens / self.decode_item_steps if self.decode_item_steps else 0.0

    @property
    def acceptance_per_position(self) -> list[float | None]:
        """Share of offered drafts accepted, per draft position 1..K (``None`` where no draft
        was ever offered, e.g. positions past ``num_model_steps`` without the n-gram hybrid).
        Greedy verification stops at the first mismatch, so a draft at position i is accepted
        only if the drafts before it in its round were: the rate is cumulative, not
        conditional on draft i - 1 having been accepted."""
        return [float(a / p) if p else None for a, p in zip(self.accepted, self.proposed)]

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.wall_seconds if self.wall_seconds else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "target_forwards": self.target_forwards,
            "generated_tokens": self.generated_tokens,
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "acceptance_per_position": [
                None if a is None else round(a, 4) for a in self.acceptance_per_position
            ],
            "tokens_per_second": round(self.tokens_per_second, 2),
            "wall_seconds": round(self.wall_seconds, 3),
            "glue_ms_per_round": round(self.glue_ms_per_round, 4),
            "method_drafts": {k: list(v) for k, v in sorted(self.method_drafts.items())},
        }

    def count_forward(self, out: StepOutput) -> None:
        """Count one target step that ran (its forward and its timing)."""
        self.target_forwards += 1
        self.glue_seconds += out.step_seconds - out.model_seconds
        self.guided_drafts_checked += out.guided.checked
        self.guided_drafts_cut += out.guided.cut
        self.forced_drafts_proposed += out.guided.forced
        self.forced_drafts_accepted += out.guided.forced_accepted
        if out.guided.seconds > 0.0:
            self.guided_seconds += out.guided.seconds
            self.guided_rounds += 1

    def count_decode(self, out: StepOutput, idx: int, imported: bool) -> None:
        """Count slot ``idx``'s decode step of ``out``: its emitted tokens and, per draft
        position, the drafts offered and accepted (``imported``: the slot's first round after
        a splitwise hand-over, whose drafts the prefill instance made)."""
        emitted = int(out.accept_num[idx])
        self.decode_item_steps += 1
        self.emitted_tokens += emitted
        drafts = out.drafts[idx]
        proposed = accepted = 0
        for i in range(drafts.shape[0]):
            if drafts[i] == PLACEHOLDER_TOKEN_ID:
                continue
            self.proposed[i] += 1
            proposed += 1
            # verification (every strategy) emits the accepted drafts, then a token of the
            # target's that differs from the draft it rejected (TARGET_MATCH: its sample is
            # not the draft; REJECTION and TOPP: the replacement excludes it): draft i + 1
            # counts as accepted iff emitted token i equals it
            if i < emitted and int(out.accept_tokens[idx, i]) == int(drafts[i]):
                self.accepted[i] += 1
                accepted += 1
        if proposed and idx < out.draft_methods.shape[0] and out.draft_methods[idx] >= 0:
            label = METHOD_LABELS[int(out.draft_methods[idx])]
            counts = self.method_drafts.setdefault(label, [0, 0])
            counts[0] += proposed
            counts[1] += accepted
        if imported:
            self.handoff_drafts_proposed += proposed
            self.handoff_drafts_accepted += accepted

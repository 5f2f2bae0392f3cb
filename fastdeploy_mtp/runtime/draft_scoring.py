"""When the draft planner has the model-free candidates computed, and for which slots
(:class:`ScoringCadence`). Candidates serve two ends: the drafts of the slots that use a
model-free method this round, and the acceptance estimates of every method (each is scored
against what the target emits). The second is what costs host time for nothing in a large
batch that decodes plainly, so it is sampled."""

from __future__ import annotations

import numpy as np

#: The most running slots (besides those drafting with suffix decoding) a round computes
#: suffix candidates of, to keep the method's acceptance estimates current.
SUFFIX_SAMPLE = 4
#: While plain decoding holds and drafting would not pay even with candidates for every
#: slot, the candidates may take at most this share of the step time.
SCORING_SHARE = 0.01


class ScoringCadence:
    """Which slots get suffix candidates next round, or no candidates at all.

    Attributes:
        hopeless: the last decision chose plain decoding, and model-free drafts would have
            lost even with candidates as often as the slots recently had them (the planner
            sets it).
        seconds: host time of a round's candidates, an average over recent rounds.
        available: per method code, the share of the running slots that had a candidate in
            recent rounds that computed them (1 before any).
    """

    def __init__(self) -> None:
        self.hopeless = False
        self.seconds = 0.0
        self.available: dict[int, float] = {}
        self._plain_rounds = 0  # plain rounds in a row
        self._sample_from = 0  # where the next round's sample of slots starts

    def wants(
        self, active: np.ndarray, used: np.ndarray, plain: bool, step: float | None
    ) -> np.ndarray | None:
        """``[N]`` bool: the slots ``used`` (``[N]``: drafting with or pinned to suffix
        decoding) and a rotating sample of the ``active`` ones (an eighth, at most
        :data:`SUFFIX_SAMPLE`; one in a ``plain`` round, whose verify tests only a
        candidate's first token); None: no candidates this round, which happens in plain
        rounds when :attr:`hopeless`, so that they cost at most :data:`SCORING_SHARE` of the
        ``step`` time (seconds of a plain step, None: unknown)."""
        self._plain_rounds = self._plain_rounds + 1 if plain else 0
        if plain and step and self.hopeless:
            every = int(np.clip(np.ceil(self.seconds / (SCORING_SHARE * step)), 1, 16))
            if self._plain_rounds % every:
                return None
        want = used.copy()
        running = np.nonzero(active)[0]
        if running.size:
            width = 1 if plain else min(-(-running.size // 8), SUFFIX_SAMPLE)
            start = self._sample_from % running.size
            want[running[(start + np.arange(width)) % running.size]] = True
            self._sample_from = start + width
        return want

    def note(self, seconds: float) -> None:
        """The host time the last round's candidates took."""
        self.seconds += 0.25 * (seconds - self.seconds)

    def note_available(self, candidates: dict[int, np.ndarray], running: np.ndarray) -> None:
        """A round's candidates (``[N, K]`` by method code, -1 = none) of the ``running``
        (``[N]`` bool) slots: how many had one."""
        if not running.any():
            return
        for code, rows in candidates.items():
            share = float((rows[running, 0] >= 0).mean())
            old = self.available.get(code, 1.0)
            self.available[code] = old + 0.25 * (share - old)

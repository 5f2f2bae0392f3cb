"""Draft fidelity: the engine's greedy rounds of a model folder beside the reference's.

The engine's rounds come from ``fastdeploy_mtp.entrypoints.check_drafts.engine_rounds`` (the
engine ``generate`` runs); :func:`compare` puts them beside a reference's rounds
(:mod:`fastdeploy_mtp.checks.reference`): the first round whose drafts differ, and the
acceptance per draft position of both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .reference import Round


def decode_rounds(runs: Sequence[Sequence[Round]]) -> list[Round]:
    """Every request's rounds after its first (the prefill's), joined."""
    return [r for rounds in runs for r in rounds[1:]]


def acceptance(rounds: Sequence[Round], k: int) -> list[float | None]:
    """Per draft position ``j`` (0-based): the share of the decode ``rounds`` that offered a
    draft at ``j`` in which drafts ``0..j`` were all accepted; ``None`` where none offered one."""
    offered = [0] * k
    accepted = [0] * k
    for r in rounds:
        took = len(r.tokens) - 1
        for j in range(min(len(r.drafts), k)):
            offered[j] += 1
            accepted[j] += int(j < took)
    return [a / o if o else None for a, o in zip(accepted, offered)]


def mean_accepted_length(rounds: Sequence[Round]) -> float:
    """Tokens emitted per decode round (``rounds``: decode rounds only); 0 with none."""
    return sum(len(r.tokens) for r in rounds) / len(rounds) if rounds else 0.0


@dataclasses.dataclass
class Comparison:
    """One request's rounds beside the reference's.

    Attributes:
        tokens_equal: the emitted tokens (all rounds joined) are the same.
        first_diff: index of the first round whose emitted tokens or drafts differ (``None``:
            every round equal).
        ours, theirs: the rounds at ``first_diff`` (``None`` when either side has no such round).
    """

    tokens_equal: bool
    first_diff: int | None
    ours: Round | None
    theirs: Round | None


def compare(ours: Sequence[Round], theirs: Sequence[Round]) -> Comparison:
    """Round by round: emitted tokens and the drafts verified."""
    joined = [t for r in ours for t in r.tokens] == [t for r in theirs for t in r.tokens]
    for i in range(max(len(ours), len(theirs))):
        a = ours[i] if i < len(ours) else None
        b = theirs[i] if i < len(theirs) else None
        if a != b:
            return Comparison(joined, i, a, b)
    return Comparison(joined, None, None, None)

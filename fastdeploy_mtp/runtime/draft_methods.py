"""The drafting methods a request can be given (their codes and ``/metrics`` labels), and
which method made the drafts a step verified."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Planned(Protocol):
    """What :func:`verified_methods` reads of the draft planner: each slot's method code of
    the last round."""

    last_method: np.ndarray


#: Drafting methods a request can be given, by code (the index); ``NO_METHOD`` = no drafts.
METHODS = ("mtp", "ngram", "suffix")
NO_METHOD = -1
#: The code of drafts a round made from the grammar alone (structured output's forced tokens,
#: no method's), and the names of every code.
GRAMMAR = len(METHODS)
METHOD_LABELS = (*METHODS, "grammar")


def method_code(name: str | None) -> int | None:
    """The code of a pinned method name (``"none"`` -> :data:`NO_METHOD`; ``None`` -> None)."""
    if name is None:
        return None
    return NO_METHOD if name == "none" else METHODS.index(name)


def verified_methods(planner: Planned | None, method: str | None, drafts: np.ndarray) -> np.ndarray:
    """``[N]`` the method code of the drafts ``drafts [N, K]`` a step verified: the planner's
    choice of the round that made them, or without a planner the configured ``method``'s;
    :data:`GRAMMAR` where the drafts have no method (only the grammar's forced tokens), -1 for
    a slot without drafts."""
    has = (np.asarray(drafts) >= 0).any(axis=1)
    if planner is not None:
        code = planner.last_method[: has.shape[0]]
    else:
        code = np.full(has.shape[0], METHODS.index(method) if method in METHODS else NO_METHOD)
    return np.where(has, np.where(code == NO_METHOD, GRAMMAR, code), NO_METHOD).astype(np.int64)

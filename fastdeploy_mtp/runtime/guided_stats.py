"""The structured-output work of one engine step (:class:`GuidedStats`), which the runner
reports with the step's output."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GuidedStats:
    """Grammar work of one step.

    Attributes:
        checked: drafts checked against a grammar (drafts of constrained slots).
        cut: of those, drafts cut before verification (past the grammar-valid prefix).
        seconds: host time in grammar work (draft checks, masks, their application, advancing,
            the MTP substeps' draft masks, the forced drafts).
        forced: of the drafts verified, those the grammar forced
            (:mod:`~fastdeploy_mtp.runtime.guided_forced`; they are also in ``checked``).
        forced_accepted: of those, the drafts the target accepted.
    """

    checked: int = 0
    cut: int = 0
    seconds: float = 0.0
    forced: int = 0
    forced_accepted: int = 0

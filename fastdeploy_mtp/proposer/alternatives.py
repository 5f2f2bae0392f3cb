"""The model-free methods beside the MTP layer: with the draft planner on, every round the
n-gram and suffix candidates of every running slot are computed from the target's buffers,
so the planner can give each request whichever method pays for it (and score the methods it
did not use against what the target emitted)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..config import FDConfig
from ..runtime.draft_methods import METHODS
from ..runtime.input_batch import InputBatch
from ..runtime.request import Request
from .model_free import NgramProposer
from .suffix import SuffixProposer


class ModelFreeAlternatives:
    """N-gram and suffix drafting kept up to date beside the MTP proposer (which forwards
    its slot set-up to :meth:`insert_tasks_v1` and :meth:`forget_slot`).

    Args:
        fd_config: serving config (the n-gram and suffix keys of ``speculative_config``).
        target_model_inputs: the target runner's ``share_inputs`` (read, never written).
    """

    def __init__(self, fd_config: FDConfig, target_model_inputs: InputBatch):
        self.ngram = NgramProposer(fd_config, target_model_inputs)
        self.suffix = SuffixProposer(fd_config, target_model_inputs)
        #: the method codes it drafts for (``draft_methods.METHODS``)
        self.codes: tuple[int, ...] = (METHODS.index("ngram"), METHODS.index("suffix"))

    def insert_tasks_v1(self, req_dicts: Sequence[Request], num_running_requests: int = 0) -> None:
        """Start the suffix sequences of the slots whose final prompt chunk was loaded."""
        self.suffix.insert_tasks_v1(req_dicts, num_running_requests)

    def forget_slot(self, idx: int) -> None:
        """The slot's request finished (its output joins the shared suffix cache)."""
        self.suffix.forget_slot(idx)

    def candidates(self, wanted: np.ndarray | None) -> dict[int, np.ndarray]:
        """This round's candidates ``[N, K]`` int64 (-1 = none) by method code: n-gram for
        every slot, suffix for the slots ``wanted`` ``[N]`` bool selects; ``wanted`` None:
        none this round (the suffix sequences still take the emitted tokens). Call once per
        round, after the target's step."""
        if wanted is None:
            self.suffix.take_emitted()
            return {}
        suffix = self.suffix.candidate_rows(wanted)
        return {self.codes[0]: self.ngram.candidate_rows(), self.codes[1]: suffix}

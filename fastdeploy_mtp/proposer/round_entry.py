"""FastDeploy's ``run`` entry of a proposer round, written once for every drafting method:
its compatibility arguments are accepted and the round itself is the method's
:meth:`RoundEntry.propose`."""

from __future__ import annotations

from abc import ABC, abstractmethod

import paddle


class RoundEntry(ABC):
    """The base of every proposer: :meth:`run` (FastDeploy's signature, without gradients)
    runs :meth:`propose`."""

    @paddle.no_grad()
    def run(
        self,
        full_hidden_states: paddle.Tensor,
        step_use_cudagraph: bool = False,
        is_dummy_run: bool = False,
        real_bsz: int = 0,
        num_steps: int | None = None,
    ) -> None:
        """One round after the target's verify and status update: the next step's drafts into
        the target's ``draft_tokens[:, 1:]`` and each slot's token count into its
        ``seq_lens_this_time``.

        Args:
            full_hidden_states: ``[T_target, H]`` the target's hidden rows of this step (as
                its forward returned them, in batch order).
            step_use_cudagraph: accepted for FastDeploy compatibility (no graphs here).
            is_dummy_run: accepted for FastDeploy compatibility (the round runs as usual).
            real_bsz: number of leading slots in use (0, or more than ``max_num_seqs``, =
                all).
            num_steps: draft-model substeps this round (default all; see
                :meth:`~fastdeploy_mtp.proposer.MTPProposer.propose`).
        """
        self.propose(full_hidden_states, real_bsz, num_steps)

    @abstractmethod
    def propose(
        self, full_hidden_states: paddle.Tensor, real_bsz: int, num_steps: int | None
    ) -> None:
        """The method's round (arguments as :meth:`run`)."""

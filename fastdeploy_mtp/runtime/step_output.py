"""What one target step and proposer round produced, on the host (:class:`StepOutput`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .guided_stats import GuidedStats
from .sampling_params import TokenLogprob


@dataclass
class StepOutput:
    """What one target step produced, on the host.

    Attributes:
        accept_tokens: ``[N, K+1]`` tokens emitted per slot (first ``accept_num[b]`` valid).
        accept_num: ``[N]`` tokens emitted per slot this step.
        stop_flags: ``[N]`` slots stopped after this step.
        drafts: ``[N, K]`` the drafts the target verified this step
            (:data:`~fastdeploy_mtp.constants.PLACEHOLDER_TOKEN_ID` = none).
        decode_mask: ``[N]`` slots that decoded this step (not prefill).
        num_tokens: tokens in the target forward.
        logprobs: per slot whose request asked for logprobs, one
            :class:`~fastdeploy_mtp.runtime.sampling_params.TokenLogprob` per emitted token.
        exports: splitwise prefill: the slot state
            (:meth:`~fastdeploy_mtp.runtime.collaborators.SlotHandover.export_slot`) of each
            slot named in :meth:`Runner.set_exports`, read after the proposer's round.
        step_seconds: wall time of the whole step (target, verification, proposer round).
        model_seconds: the part of it spent in model forwards and logits (target and MTP);
            the rest is the round's glue (ops, Python, host copies).
        draft_logprobs: per slot whose request asked (``include_draft_logprobs``), the MTP
            drafts of :attr:`drafts` with their log-probabilities under the MTP layer
            (:meth:`~fastdeploy_mtp.proposer.sampler.MTPSampler.verified`; empty without
            speculation).
        guided: the step's structured-output work
            (:class:`~fastdeploy_mtp.runtime.guided_stats.GuidedStats`).
        draft_methods: ``[N]`` int64, which method made each slot's verified drafts (an index
            of :data:`~fastdeploy_mtp.runtime.draft_methods.METHODS`, -1 = none or unknown).
        mtp_unseen: ``[N]`` bool, the slots whose rows the MTP layer never takes (requests the
            draft planner admitted without it; empty: none). Their prompt blocks hold no MTP
            KV, so they must not enter the prefix cache.
    """

    accept_tokens: np.ndarray
    accept_num: np.ndarray
    stop_flags: np.ndarray
    drafts: np.ndarray
    decode_mask: np.ndarray
    num_tokens: int
    exports: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    step_seconds: float = 0.0
    model_seconds: float = 0.0
    draft_logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    guided: GuidedStats = field(default_factory=GuidedStats)
    draft_methods: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    mtp_unseen: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

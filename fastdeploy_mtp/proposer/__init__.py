"""Proposers: draft tokens for the target to verify, by ``speculative_config.method``: the
model's MTP layer (:class:`MTPProposer`), n-gram matching (:class:`NgramProposer`), suffix
decoding (:class:`SuffixProposer`) or none (:class:`NaiveProposer`), behind the interface
the runtime defines (:class:`~fastdeploy_mtp.runtime.collaborators.Proposer`), built by
:func:`make_proposer`."""

from ..runtime.collaborators import Proposer
from .factory import make_proposer
from .model_free import ModelFreeProposer, NaiveProposer, NgramProposer
from .mtp import MTPProposer
from .proposer_inputs import CLONED_FROM_TARGET, SHARED_WITH_TARGET, ProposerInputBatch
from .round_entry import RoundEntry
from .sampler import MTPSampler
from .suffix import SuffixProposer

__all__ = [
    "CLONED_FROM_TARGET",
    "MTPProposer",
    "MTPSampler",
    "ModelFreeProposer",
    "NaiveProposer",
    "NgramProposer",
    "Proposer",
    "ProposerInputBatch",
    "RoundEntry",
    "SHARED_WITH_TARGET",
    "SuffixProposer",
    "make_proposer",
]

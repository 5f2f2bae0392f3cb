"""MTP proposer: drafts tokens with a model's MTP layer beside the target model."""

from .mtp import MTPProposer
from .proposer_inputs import CLONED_FROM_TARGET, SHARED_WITH_TARGET, ProposerInputBatch
from .sampler import MTPSampler

__all__ = ["CLONED_FROM_TARGET", "MTPProposer", "MTPSampler", "ProposerInputBatch", "SHARED_WITH_TARGET"]

"""The one factory that picks the proposer of ``speculative_config.method`` (a
:class:`~fastdeploy_mtp.runtime.collaborators.ProposerFactory`, the interface the target runner
builds its proposer through). Methods:

* ``"mtp"``: :class:`~fastdeploy_mtp.proposer.MTPProposer` (the MTP layer, with its own KV
  caches and draft state ``model_inputs``);
* ``"ngram"``, ``"suffix"``, ``"naive"``: the model-free proposers of
  :mod:`~fastdeploy_mtp.proposer.model_free` and :mod:`~fastdeploy_mtp.proposer.suffix`, which
  have no caches and no draft state of their own (``model_inputs is None``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import FDConfig
    from ..models.interfaces import MTPModel, TargetModel
    from ..runtime.collaborators import Proposer
    from ..runtime.guided import GuidedSlots
    from ..runtime.input_batch import InputBatch


def make_proposer(
    fd_config: FDConfig,
    main_model: TargetModel,
    target_model_inputs: InputBatch,
    num_blocks: int,
    mtp_model: MTPModel | None = None,
    guided: GuidedSlots | None = None,
) -> Proposer | None:
    """The proposer of ``fd_config.speculative_config.method`` over the target's
    ``share_inputs`` (``None`` without speculation). The MTP proposer gets ``mtp_model``, its
    KV caches of ``num_blocks`` blocks (created or attached) and the runner's grammar
    matchers ``guided`` (it drafts under each slot's grammar); the model-free proposers
    ignore them.

    Raises:
        ValueError: an unknown method, or ``"mtp"`` without ``mtp_model``.
    """
    method = fd_config.speculative_config.method
    if method is None:
        return None
    if method == "mtp":
        from .mtp import MTPProposer

        pc = fd_config.parallel_config
        proposer = MTPProposer(
            fd_config,
            main_model,
            pc.local_rank,
            pc.device_id,
            target_model_inputs,
            model=mtp_model,
            guided=guided,
        )
        proposer.initialize_kv_cache(num_blocks)
        if fd_config.speculative_config.per_request_methods:
            from .alternatives import ModelFreeAlternatives

            proposer.alternatives = ModelFreeAlternatives(fd_config, target_model_inputs)
        return proposer
    if method == "ngram":
        from .model_free import NgramProposer

        return NgramProposer(fd_config, target_model_inputs)
    if method == "suffix":
        from .suffix import SuffixProposer

        return SuffixProposer(fd_config, target_model_inputs)
    if method == "naive":
        from .model_free import NaiveProposer

        return NaiveProposer(fd_config, target_model_inputs)
    raise ValueError(f"speculative_config.method {method!r} has no proposer")

"""Builds the reference engine with its concrete collaborators: the runtime defines what it
needs (:mod:`fastdeploy_mtp.runtime.collaborators`), and this module, above it, picks the
implementations: the proposers of :func:`fastdeploy_mtp.proposer.make_proposer` and the
splitwise hand-over of :mod:`fastdeploy_mtp.splitwise.handoff`. The entry points, serving and
the tests build engines and runners here."""

from __future__ import annotations

from .config import FDConfig
from .models.interfaces import MTPModel, TargetModel
from .proposer.factory import make_proposer
from .runtime.collaborators import Runner
from .runtime.engine import Engine
from .runtime.stops import Detokenize
from .runtime.target_runner import TargetRunner
from .splitwise import handoff


def fewest_positions(*models: object) -> int | None:
    """The fewest positions any of ``models`` can encode (their
    ``config.max_position_embeddings``), ``None`` when none says."""
    limits = [getattr(getattr(m, "config", None), "max_position_embeddings", None) for m in models]
    known = [int(v) for v in limits if isinstance(v, int)]
    return min(known) if known else None


def build_runner(
    fd_config: FDConfig, model: TargetModel, mtp_model: MTPModel | None = None
) -> TargetRunner:
    """The in-process runner of ``model`` (and, for ``"mtp"``, its MTP layer ``mtp_model``)
    with the proposer of ``speculative_config.method`` and the splitwise hand-over."""
    return TargetRunner(fd_config, model, mtp_model, make_proposer=make_proposer, handover=handoff)


def build_engine(
    fd_config: FDConfig,
    model: TargetModel | None = None,
    mtp_model: MTPModel | None = None,
    prefill_chunk_size: int = 0,
    record_trace: bool = False,
    runner: Runner | None = None,
    max_positions: int | None = None,
    detokenize: Detokenize | None = None,
) -> Engine:
    """An :class:`~fastdeploy_mtp.runtime.engine.Engine` with the splitwise hand-over.

    Args:
        fd_config: serving config (``speculative_config.method = None`` for plain decoding).
        model: the target model; mtp_model: its MTP layer (when speculating). The engine
            then runs them in this process (:func:`build_runner`), and the positions they can
            encode bound a request.
        prefill_chunk_size, record_trace, detokenize: see the engine.
        runner: instead of ``model``: anything with the
            :class:`~fastdeploy_mtp.runtime.collaborators.Runner` surface, e.g. the serving
            engine's runner that drives worker processes.
        max_positions: with ``runner``: positions the model can encode (``None`` = only
            ``max_model_len``).
    """
    if runner is None:
        if model is None:
            raise ValueError("Engine needs the target `model` (or a `runner`)")
        runner = build_runner(fd_config, model, mtp_model)
        max_positions = fewest_positions(model, mtp_model)
    return Engine(
        fd_config,
        runner,
        handover=handoff,
        prefill_chunk_size=prefill_chunk_size,
        record_trace=record_trace,
        max_positions=max_positions,
        detokenize=detokenize,
    )

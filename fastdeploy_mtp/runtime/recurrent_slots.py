"""A hybrid model's linear-attention states on one rank
(:class:`~fastdeploy_mtp.models.linear_state.LinearStates`), acquired as the KV caches are:
attached by name when a cache-manager process created them (``serve``), else allocated here
(an in-process engine). ``None`` for a model without linear-attention layers."""

from __future__ import annotations

from typing import Any

from ..config import FDConfig
from ..ipc.kv_caches import acquire_caches, detach_caches
from ..models.linear_state import LinearStates, model_state_specs


def acquire_linear_states(model: Any, fd_config: FDConfig) -> tuple[LinearStates | None, list[str]]:
    """This rank's states of ``model`` (``model_state_specs``; raises ``ValueError`` under
    prefix caching) and the names they were attached under (empty when allocated here)."""
    specs = model_state_specs(model, fd_config)
    if not specs:
        return None, []
    tensors, names = acquire_caches(specs, fd_config)
    return LinearStates.from_tensors(specs, tensors), names


def release_linear_states(states: LinearStates | None, names: list[str]) -> None:
    """Detach attached states (allocated ones are freed with their tensors)."""
    if states is not None:
        detach_caches(states.tensors(), names)

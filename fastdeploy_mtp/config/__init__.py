"""Serving configuration with FastDeploy's attribute names (duck-type compatible).

``MTPProposer`` and the reference engine read ``fd_config.<section>.<attribute>`` exactly as
FastDeploy's proposer does, so an engine that already has a FastDeploy ``FDConfig`` can pass
it unchanged; these dataclasses are the minimal set the package needs, with defaults and
validation that names the offending field.

:mod:`.sections` holds ``FDConfig`` and its plain sections, :mod:`.speculative` the
speculative config, :mod:`.key_types` the type checks of a config's keys and
:mod:`.validators` the value checks every config reader of the package shares.
"""

from .key_types import typed_keys
from .sections import (
    SPLITWISE_ROLES,
    CacheConfig,
    FDConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
)
from .speculative import (
    KEY_ALIASES,
    MAX_NUM_SPECULATIVE_TOKENS,
    MODEL_FREE_METHODS,
    MTP_LAYER_SCHEDULES,
    MTP_STRATEGIES,
    SPECULATIVE_METHODS,
    VERIFY_STRATEGIES,
    SpeculativeConfig,
    SpeculativeConfigError,
    check_splitwise_method,
    load_speculative_json,
)

__all__ = [
    "CacheConfig",
    "FDConfig",
    "KEY_ALIASES",
    "MAX_NUM_SPECULATIVE_TOKENS",
    "MODEL_FREE_METHODS",
    "MTP_LAYER_SCHEDULES",
    "MTP_STRATEGIES",
    "ModelConfig",
    "ParallelConfig",
    "SPECULATIVE_METHODS",
    "SPLITWISE_ROLES",
    "SchedulerConfig",
    "SpeculativeConfig",
    "SpeculativeConfigError",
    "VERIFY_STRATEGIES",
    "check_splitwise_method",
    "load_speculative_json",
    "typed_keys",
]

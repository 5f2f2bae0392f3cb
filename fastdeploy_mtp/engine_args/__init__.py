"""Engine arguments: the options every engine command shares, checked once, and the
``FDConfig`` they build.

Every command (``serve``, ``generate``, ``demo``) adds its engine options with the functions
here (``--model``: :mod:`.model_args`; the speculation options: :mod:`.speculation_args`; the
sampling options: :mod:`.sampling_args`; ``--max-num-seqs``) and turns them into configs with
the resolvers here, so the same value gets the same refusal on every command; the serving
processes build their ``FDConfig`` with :func:`build_config` too. :mod:`.values` holds what
they share (:class:`UsageError`, the argparse number types). Nothing here imports the entry
points (``fastdeploy_mtp.entrypoints``), which are the only users of the ``add_*``
functions.
"""

from ..capacity import build_config as build_config  # the commands' and workers' FDConfig
from .model_args import (
    DTYPE_CHOICES,
    add_max_num_seqs_arg,
    add_model_arg,
    default_model,
    model_arg,
    resolve_model,
)
from .sampling_args import SAMPLING_FLAGS, add_sampling_args, check_sampling_fits, resolve_sampling
from .speculation_args import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    DEFAULT_SPECULATIVE_CONFIG,
    add_speculative_args,
    check_speculative_config,
    default_speculative_config,
    resolve_speculative_config,
    speculation_label,
    speculative_config,
)
from .values import (
    UsageError,
    non_negative_int,
    options_from_args,
    port_number,
    positive_float,
    positive_int,
)

__all__ = [
    "DEFAULT_NUM_SPECULATIVE_TOKENS",
    "DEFAULT_SPECULATIVE_CONFIG",
    "DTYPE_CHOICES",
    "SAMPLING_FLAGS",
    "UsageError",
    "add_max_num_seqs_arg",
    "add_model_arg",
    "add_sampling_args",
    "add_speculative_args",
    "build_config",
    "check_sampling_fits",
    "check_speculative_config",
    "default_model",
    "default_speculative_config",
    "model_arg",
    "non_negative_int",
    "options_from_args",
    "port_number",
    "positive_float",
    "positive_int",
    "resolve_model",
    "resolve_sampling",
    "resolve_speculative_config",
    "speculation_label",
    "speculative_config",
]

"""Sentinel values the Python side writes into the ops' buffers.

The ones the native ops test for (``PLACEHOLDER_TOKEN_ID``, ``NO_BLOCK_ID``, ``NO_BATCH_ID``)
are declared once, with their C++ names, in ``custom_ops/ops/constants.toml`` and generated
into both languages at build time; they are re-exported here and from ``fastdeploy_mtp.ops``.
The others are Python-side bookkeeping only.
"""

from __future__ import annotations

from typing import Final

from .ops._op_wrappers import NO_BATCH_ID, NO_BLOCK_ID, PLACEHOLDER_TOKEN_ID

#: ``last_seq_lens_this_time`` of a slot before any substep recorded its draft length.
UNSET_SEQ_LEN: Final = -1

#: ``Request.idx`` of a request the scheduler has not placed in a slot.
NO_SLOT: Final = -1

__all__ = ["NO_BATCH_ID", "NO_BLOCK_ID", "NO_SLOT", "PLACEHOLDER_TOKEN_ID", "UNSET_SEQ_LEN"]

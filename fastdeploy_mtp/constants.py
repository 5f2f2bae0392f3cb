"""Sentinel values the Python side writes into the ops' buffers.

Each one must equal the value the native ops test for; the comment names the C++ constant.
``PLACEHOLDER_TOKEN_ID`` is meant to be imported as ``from fastdeploy_mtp.ops import
PLACEHOLDER_TOKEN_ID`` once the op layer re-exports it; until then it lives here.
"""

from __future__ import annotations

from typing import Final

#: An empty token slot (draft slot with no draft, unused history / prompt / output position).
PLACEHOLDER_TOKEN_ID: Final = -1  # equals kPlaceholderToken in custom_ops/include/fdmtp/common.h

#: An empty block-table entry (no KV-cache block assigned to that column).
NO_BLOCK_ID: Final = -1  # equals kNoBlock in custom_ops/include/fdmtp/mtp_step_paddle.h

#: A ``batch_id_per_token_output`` row that belongs to no item (``speculate_pre_process``
#: writes the item index of every real output row; rows past them keep this value).
NO_BATCH_ID: Final = -1

#: ``last_seq_lens_this_time`` of a slot before any substep recorded its draft length.
UNSET_SEQ_LEN: Final = -1

#: ``Request.idx`` of a request the scheduler has not placed in a slot.
NO_SLOT: Final = -1

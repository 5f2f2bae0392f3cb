// eagle_get_self_hidden_states: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "eagle_get_self_hidden_states".
//
// Row layout and zero-filling: fdmtp/row_gather.h.
#pragma once

#include "fdmtp/row_gather.h"

namespace fdmtp {

struct EagleGetSelfHiddenStatesArgs {
  RowGatherArgs rows;                               // input [T, H] -> out [T, H]
  FDMTP_GM const int32_t* last_seq_lens_this_time;  // [bsz] int32, in: draft slt before the substep
  FDMTP_GM const int32_t* seq_lens_this_time;       // [bsz] int32, in: draft slt after it (0 or 1)
  FDMTP_GM const int32_t* seq_lens_encoder;         // [bsz] int32, in: > 0 right after prefill

  FDMTP_HOST_DEVICE ItemRows Counts(int64_t b) const {
    const int64_t last = NonNegative(last_seq_lens_this_time[b]);
    const bool prefill = seq_lens_encoder[b] > 0;
    if (seq_lens_this_time[b] > 0) return {prefill ? 1 : last, 1};
    return {prefill ? (last > 0 ? 1 : 0) : last, 0};
  }
  // The item's last input row (row 0 when it occupies one row; none when it has none).
  FDMTP_HOST_DEVICE int64_t Source(int64_t, int64_t, ItemRows c) const { return c.in - 1; }
};

}  // namespace fdmtp

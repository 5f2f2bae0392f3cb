// eagle_gather_hidden_states: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "eagle_gather_hidden_states".
//
// Row layout and zero-filling: fdmtp/row_gather.h.
#pragma once

#include "fdmtp/row_gather.h"

namespace fdmtp {

struct EagleGatherHiddenStatesArgs {
  RowGatherArgs rows;                          // input [T, H] -> out [bsz, H]
  FDMTP_GM const int32_t* seq_lens_this_time;  // [bsz] int32, in: tokens of each item in `input`

  FDMTP_HOST_DEVICE ItemRows Counts(int64_t b) const {
    const int64_t n = NonNegative(seq_lens_this_time[b]);
    return {n, n > 0 ? 1 : 0};
  }
  FDMTP_HOST_DEVICE int64_t Source(int64_t, int64_t, ItemRows c) const { return c.in - 1; }
};

}  // namespace fdmtp

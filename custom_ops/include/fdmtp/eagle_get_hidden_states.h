// eagle_get_hidden_states: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "eagle_get_hidden_states".
//
// Row layout and zero-filling: fdmtp/row_gather.h.
#pragma once

#include "fdmtp/row_gather.h"

namespace fdmtp {

struct EagleGetHiddenStatesArgs {
  RowGatherArgs rows;                          // input [T, H] -> out [T, H]
  FDMTP_GM const int32_t* seq_lens_this_time;  // [bsz] int32, in: draft tokens this round
  FDMTP_GM const int32_t* seq_lens_encoder;    // [bsz] int32, in: draft prefill length
  FDMTP_GM const int32_t* accept_nums;         // [bsz] int32, in: target accepted tokens
  FDMTP_GM const int32_t* base_model_seq_lens_this_time;  // [bsz] int32, in: target rows per item

  FDMTP_HOST_DEVICE ItemRows Counts(int64_t b) const {
    const int64_t enc = NonNegative(seq_lens_encoder[b]);
    if (enc > 0) return {enc, enc};
    const int64_t base = NonNegative(base_model_seq_lens_this_time[b]);
    if (seq_lens_this_time[b] <= 0) return {base, 0};
    return {base, NonNegative(accept_nums[b])};
  }
  // The j-th output row of an item is its j-th input row (prefill: all of them; decode:
  // the first accept_nums).
  FDMTP_HOST_DEVICE int64_t Source(int64_t, int64_t j, ItemRows) const { return j; }
};

}  // namespace fdmtp

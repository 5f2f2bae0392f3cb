// eagle_get_self_hidden_states: after a substep, keep one hidden row per still-active
// item (its last token) for the next substep.
//
// Per item b, with last = last_seq_lens_this_time[b] (the draft slt before the substep):
//   seq_lens_encoder > 0 and slt > 0: in = 1,    out = 1, copy its row 0;
//   slt > 0:                          in = last, out = 1, copy its row last - 1;
//   otherwise:                        in = (seq_lens_encoder > 0 ? min(last, 1) : last), out = 0.
// Output: as many rows as the input; rows past output_token_num are zero.
// Semantics: fastdeploy-ops.md §2.5 (develop GPU signature); reference: tests/reference/.
#pragma once

#include "fdmtp/row_gather.h"

namespace fdmtp {

struct EagleGetSelfHiddenStatesArgs {
  RowGatherArgs rows;                      // input [T, H] -> out [T, H]
  const int32_t* last_seq_lens_this_time;  // [bsz] int32, in: draft slt before the substep
  const int32_t* seq_lens_this_time;       // [bsz] int32, in: draft slt after it (0 or 1)
  const int32_t* seq_lens_encoder;         // [bsz] int32, in: > 0 right after prefill

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

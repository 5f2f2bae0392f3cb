// eagle_get_hidden_states: pick the target hidden rows the MTP layer consumes this round.
//
// Per item b (counts use the DRAFT's seq_lens_encoder, not the target's):
//   draft prefill (seq_lens_encoder > 0): in = out = seq_lens_encoder, rows copied 1:1;
//   draft slt == 0:                       in = base_model_seq_lens_this_time, out = 0;
//   otherwise (decode):                   in = base_model_seq_lens_this_time,
//                                         out = accept_nums, copying the item's FIRST
//                                         accept_nums target rows.
// Output rows are item-interleaved in batch order (GPU develop layout), and as many as
// the input has; rows past output_token_num are zero (upstream leaves them uninitialised),
// and so are decode rows with no target row behind them (base slt == 0, or
// accept_nums > base slt), where upstream leaves garbage or reads the next item's rows.
// Semantics: fastdeploy-ops.md §2.4 and §10 item 6; reference: tests/reference/.
#pragma once

#include "fdmtp/row_gather.h"

namespace fdmtp {

struct EagleGetHiddenStatesArgs {
  RowGatherArgs rows;                            // input [T, H] -> out [T, H]
  const int32_t* seq_lens_this_time;             // [bsz] int32, in: draft tokens this round
  const int32_t* seq_lens_encoder;               // [bsz] int32, in: draft prefill length
  const int32_t* accept_nums;                    // [bsz] int32, in: target accepted tokens
  const int32_t* base_model_seq_lens_this_time;  // [bsz] int32, in: target rows per item

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

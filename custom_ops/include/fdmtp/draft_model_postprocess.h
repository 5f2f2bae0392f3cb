// draft_model_postprocess: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "draft_model_postprocess".
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

// Every tensor but seq_lens_this_time may have more than bsz rows; the kernels touch rows
// 0..bsz-1 only.
struct DraftModelPostprocessArgs {
  FDMTP_GM const int64_t*
      draft_tokens;  // [>= bsz, width] int64, in: target draft tokens, -1 = empty slot
  FDMTP_GM int32_t* seq_lens_this_time;  // [bsz] int32, in/out: tokens of the next target forward
  FDMTP_GM const int32_t* seq_lens_encoder;  // [>= bsz] int32, in: != 0 means prefill
  FDMTP_GM const bool* stop_flags;  // [>= bsz] bool (or [>= bsz, 1]), in: the item has finished
  int64_t bsz;                      // number of items
  int64_t width;                    // draft slots per item (K + 1): draft_tokens' own row stride
};

// The whole per-item computation; the kernels only add the loop over b.
// The tokens of one draft row (`width` slots, in global memory or a local copy): the
// slots that are not kPlaceholderToken.
template <typename RowPtr>
FDMTP_HOST_DEVICE inline int32_t DraftModelPostprocessCount(RowPtr row, int64_t width) {
  int64_t count = 0;
  for (int64_t j = 0; j < width; ++j) {
    count += row[j] != kPlaceholderToken ? 1 : 0;
  }
  return SatInt32(count);
}

FDMTP_HOST_DEVICE inline void DraftModelPostprocessItem(const DraftModelPostprocessArgs& a,
                                                        int64_t b) {
  if (a.stop_flags[b]) {
    a.seq_lens_this_time[b] = 0;
    return;
  }
  if (a.seq_lens_encoder[b] != 0) {
    return;  // prefill: the target forward feeds the prompt chunk, not drafts
  }
  a.seq_lens_this_time[b] = DraftModelPostprocessCount(a.draft_tokens + b * a.width, a.width);
}

}  // namespace fdmtp

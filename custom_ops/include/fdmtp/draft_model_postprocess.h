// draft_model_postprocess: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "draft_model_postprocess".
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

struct DraftModelPostprocessArgs {
  const int64_t* draft_tokens;      // [bsz, width] int64, in: target draft tokens, -1 = empty slot
  int32_t* seq_lens_this_time;      // [bsz] int32, in/out: tokens of the next target forward
  const int32_t* seq_lens_encoder;  // [bsz] int32, in: > 0 means the item is in prefill
  const bool* stop_flags;           // [bsz] bool (stored [bsz, 1]), in: the item has finished
  int64_t bsz;                      // number of items
  int64_t width;                    // draft slots per item (K + 1)
};

// The whole per-item computation; the kernels only add the loop over b.
FDMTP_HOST_DEVICE inline void DraftModelPostprocessItem(const DraftModelPostprocessArgs& a,
                                                        int64_t b) {
  if (a.stop_flags[b]) {
    a.seq_lens_this_time[b] = 0;
    return;
  }
  if (a.seq_lens_encoder[b] != 0) {
    return;  // prefill: the target forward feeds the prompt chunk, not drafts
  }
  const int64_t* row = a.draft_tokens + b * a.width;
  int64_t count = 0;
  for (int64_t j = 0; j < a.width; ++j) {
    count += row[j] != kPlaceholderToken ? 1 : 0;
  }
  a.seq_lens_this_time[b] = SatInt32(count);
}

}  // namespace fdmtp

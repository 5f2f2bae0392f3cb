// draft_model_preprocess: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "draft_model_preprocess".
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

struct DraftModelPreprocessArgs {
  FDMTP_GM int64_t* draft_tokens;         // [bsz, W] int64, in/out: draft input tokens
  FDMTP_GM int64_t* input_ids;            // [bsz, C] int64, in/out: draft prompt (shifted)
  FDMTP_GM bool* stop_flags;              // [bsz] bool, out
  FDMTP_GM int32_t* seq_lens_this_time;   // [bsz] int32, out
  FDMTP_GM int32_t* seq_lens_encoder;     // [bsz] int32, in/out
  FDMTP_GM int32_t* seq_lens_decoder;     // [bsz] int32, in/out
  FDMTP_GM int64_t* step_idx;             // [bsz] int64, out
  FDMTP_GM bool* not_need_stop;           // [1] bool, out
  FDMTP_GM int64_t* pre_ids;              // [bsz, L] int64, in/out: draft history
  FDMTP_GM const int64_t* accept_tokens;  // [bsz, W] int64, in (target)
  FDMTP_GM const int32_t* accept_num;     // [bsz] int32, in (target)
  FDMTP_GM const int32_t* target_model_seq_lens_decoder;  // [bsz] int32, in
  FDMTP_GM const int64_t* target_model_step_idx;          // [bsz] int64, in
  FDMTP_GM const bool* target_model_stop_flags;           // [bsz] bool, in
  FDMTP_GM const int64_t* max_dec_len;                    // [bsz] int64, in
  FDMTP_GM int64_t* target_model_draft_tokens;  // [bsz, W] int64, out: slots 1.. set to -1
  int64_t bsz;
  int64_t draft_width;         // W of draft_tokens
  int64_t accept_width;        // W of accept_tokens
  int64_t target_draft_width;  // W of target_model_draft_tokens
  int64_t input_ids_len;       // C
  int64_t pre_ids_len;         // L
  int32_t num_model_step;
  bool is_splitwise_prefill;
};

// Returns whether the item was kept (counts towards not_need_stop). Every row tensor is
// read with its own width and only the columns the item needs are touched; a column a row
// does not have is skipped (never read or written). Values are clamped, never checked:
// accept_num to [0, accept_width] (the accepted tokens that exist), steps and lengths with
// saturating arithmetic (fdmtp/common.h).
FDMTP_HOST_DEVICE inline bool DraftModelPreprocessItem(const DraftModelPreprocessArgs& a,
                                                       int64_t b) {
  FDMTP_GM int64_t* target_draft = a.target_model_draft_tokens + b * a.target_draft_width;
  for (int64_t j = 1; j < a.target_draft_width; ++j) target_draft[j] = kPlaceholderToken;

  const int64_t target_step = a.target_model_step_idx[b];
  // target_step + num_model_step >= max_dec_len, without the sum (which could overflow)
  const bool skip =
      a.target_model_stop_flags[b] ||
      (!a.is_splitwise_prefill && target_step >= SatSub(a.max_dec_len[b], a.num_model_step));
  if (skip) {
    a.stop_flags[b] = true;
    a.seq_lens_this_time[b] = 0;
    a.seq_lens_decoder[b] = 0;
    a.seq_lens_encoder[b] = 0;
    a.step_idx[b] = 0;
    return false;
  }
  a.stop_flags[b] = false;
  FDMTP_GM const int64_t* accepted = a.accept_tokens + b * a.accept_width;
  FDMTP_GM int64_t* history = a.pre_ids + b * a.pre_ids_len;
  const int32_t enc = a.seq_lens_encoder[b];
  if (enc > 0) {
    if (a.accept_width > 0) {  // the first token exists
      if (a.pre_ids_len > 0) history[0] = accepted[0];
      if (enc - 1 < a.input_ids_len) a.input_ids[b * a.input_ids_len + enc - 1] = accepted[0];
    }
    a.seq_lens_this_time[b] = enc;
    a.step_idx[b] = SatSub(target_step, 1);
    return true;
  }
  const int64_t n =
      ClampTo(a.accept_num[b], 0, a.accept_width < INT32_MAX ? a.accept_width : INT32_MAX);
  a.seq_lens_decoder[b] = SatInt32(SatSub(a.target_model_seq_lens_decoder[b], n));
  a.step_idx[b] = SatSub(target_step, n);
  FDMTP_GM int64_t* draft = a.draft_tokens + b * a.draft_width;
  const int64_t copied = n < a.draft_width ? n : a.draft_width;
  for (int64_t i = 0; i < copied; ++i) draft[i] = accepted[i];
  // history[target_step - n + i] = accepted[i] where that position is inside the row
  for (int64_t i = 0; i < n; ++i) {
    const int64_t back = n - i;        // in [1, n]
    if (target_step < back) continue;  // position < 0 (and no subtraction can overflow)
    if (target_step - back < a.pre_ids_len) history[target_step - back] = accepted[i];
  }
  a.seq_lens_this_time[b] = static_cast<int32_t>(n);
  return true;
}

}  // namespace fdmtp

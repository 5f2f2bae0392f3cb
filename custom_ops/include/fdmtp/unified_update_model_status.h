// unified_update_model_status: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "unified_update_model_status".
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

struct UnifiedUpdateModelStatusArgs {
  FDMTP_GM int32_t* seq_lens_encoder;    // [max_bsz] int32, in/out
  FDMTP_GM int32_t* seq_lens_decoder;    // [max_bsz] int32, in/out
  FDMTP_GM bool* has_running_seqs;       // [1] bool, out: any slot still running
  FDMTP_GM int64_t* step_input_ids;      // [max_bsz, width] int64, in/out: column 0 only
  FDMTP_GM int64_t* step_output_ids;     // [max_bsz, width] int64, in/out: EOS replacement
  FDMTP_GM int32_t* step_output_len;     // [max_bsz] int32, in/out: emitted count, cut at a stop
  FDMTP_GM bool* stop_flags;             // [max_bsz] bool, in/out
  FDMTP_GM int32_t* seq_lens_this_time;  // [real_bsz] int32, in/out: 0 for stopped/paused
  FDMTP_GM const bool* is_paused;        // [max_bsz] bool, in (is_block_step)
  FDMTP_GM int64_t* token_ids_all;       // [max_bsz, max_model_len] int64, in/out: history
  FDMTP_GM const int64_t* prompt_lens;   // [max_bsz] int64, in
  FDMTP_GM int64_t* step_idx;            // [max_bsz] int64, in/out
  FDMTP_GM const int64_t* end_tokens;    // [num_end_tokens] int64, in
  FDMTP_GM const int64_t* max_dec_len;   // [max_bsz] int64, in
  int64_t max_bsz;
  int64_t real_bsz;
  int64_t width;          // K + 1
  int64_t max_model_len;  // L = token_ids_all.shape[1]
  int64_t num_end_tokens;
  bool keep_max_dec_len_token;  // false (upstream): the token reaching max_dec_len -> end_tokens[0]
};

// Updates slot b; returns true when it is still running afterwards (the kernels OR these
// into has_running_seqs).
FDMTP_HOST_DEVICE inline bool UnifiedUpdateModelStatusItem(const UnifiedUpdateModelStatusArgs& a,
                                                           int64_t b) {
  const bool running = !a.stop_flags[b] && !a.is_paused[b];  // not gated by real_bsz
  if (!running) {
    if (b < a.real_bsz) {
      a.stop_flags[b] = true;
      a.seq_lens_encoder[b] = 0;
      a.seq_lens_decoder[b] = 0;
      a.seq_lens_this_time[b] = 0;
      a.step_output_len[b] = 0;
    }
    return false;
  }
  FDMTP_GM int64_t* out = a.step_output_ids + b * a.width;
  // Values are never trusted and never rejected (a device kernel cannot check them without
  // a sync), so every backend clamps them the same way: the emitted count into [0, W] (the
  // scan never reads past the row; a stop condition still cuts it first, as upstream), the
  // step counter saturates at the int64 maximum, lengths at the int32 maximum.
  int64_t n = ClampTo(a.step_output_len[b], 0, a.width);
  const int64_t old_step = a.step_idx[b];
  int64_t step = old_step;
  bool stop = false;
  for (int64_t k = 0; k < n; ++k) {
    step = SatAdd(step, 1);
    const bool eos = IsEndToken(out[k], a.end_tokens, a.num_end_tokens);
    const bool hit = step >= a.max_dec_len[b];
    if (eos || hit) {
      if (!eos && !a.keep_max_dec_len_token) out[k] = a.end_tokens[0];
      n = k + 1;
      stop = true;
      break;
    }
  }
  if (a.seq_lens_encoder[b] > 0) {  // prefill: fold, even when nothing was emitted
    a.seq_lens_decoder[b] =
        SatInt32(static_cast<int64_t>(a.seq_lens_decoder[b]) + a.seq_lens_encoder[b]);
    a.seq_lens_encoder[b] = 0;
  } else if (a.seq_lens_decoder[b] > 0) {
    a.seq_lens_decoder[b] = SatInt32(static_cast<int64_t>(a.seq_lens_decoder[b]) + n);
  }
  if (stop) a.stop_flags[b] = true;
  a.step_output_len[b] = static_cast<int32_t>(n);
  a.step_idx[b] = step;
  if (n > 0) {
    // The step's tokens go right after the committed ones, to positions
    // prompt_len + old_step_idx + k, all or nothing: only when the first is >= 0 and
    // prompt_len + new_step_idx < L (upstream's bound). The sum saturates, and the bound is
    // compared as first < L - n, so no addition can wrap into the row.
    const int64_t first = SatAdd(a.prompt_lens[b], old_step);
    if (first >= 0 && first < a.max_model_len - n) {
      FDMTP_GM int64_t* history = a.token_ids_all + b * a.max_model_len + first;
      for (int64_t k = 0; k < n; ++k) history[k] = out[k];
    }
    a.step_input_ids[b * a.width] = out[n - 1];
  }
  return !stop;
}

}  // namespace fdmtp

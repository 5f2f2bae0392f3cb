// draft_model_update: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "draft_model_update".
//
// The caller passes each item's compacted index k, counted from the *input*
// seq_lens_this_time before any item is written (docs/compat.md, section 2), so the
// per-item function never depends on another item's output.
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

struct DraftModelUpdateArgs {
  FDMTP_GM const int64_t* inter_next_tokens;  // [num_tokens] int64, in: one per item with slt > 0
  FDMTP_GM int64_t* draft_tokens;             // [bsz, W] int64, in/out
  FDMTP_GM int64_t* pre_ids;                  // [bsz, L] int64, in/out
  FDMTP_GM int32_t* seq_lens_this_time;       // [bsz] int32, in/out
  FDMTP_GM int32_t* seq_lens_encoder;         // [bsz] int32, in/out
  FDMTP_GM int32_t* seq_lens_decoder;         // [bsz] int32, in/out
  FDMTP_GM int64_t* step_idx;                 // [bsz] int64, in/out
  FDMTP_GM bool* stop_flags;                  // [bsz] bool, in
  FDMTP_GM bool* not_need_stop;               // [1] bool, out
  FDMTP_GM const int64_t* max_dec_len;        // [bsz] int64, in
  FDMTP_GM int64_t* base_model_draft_tokens;  // [bsz, W_base] int64, in/out: slot substep+1 written
  int64_t bsz;
  int64_t num_tokens;  // length of inter_next_tokens
  int64_t draft_width;
  int64_t base_width;
  int64_t pre_ids_len;
  int32_t substep;
};

// `k` = number of items i < b whose input seq_lens_this_time > 0. Returns whether the item
// counts as "stopped" for not_need_stop (stopped with slt > 0). Every tensor is indexed with
// its own row width; a column a row does not have is not written (slot substep + 1 of
// base_model_draft_tokens always exists: the host checks the attr). Lengths are read with
// NonNegative and sums saturate (fdmtp/common.h): no value, however large or negative, wraps.
FDMTP_HOST_DEVICE inline bool DraftModelUpdateItem(const DraftModelUpdateArgs& a, int64_t b,
                                                   int64_t k) {
  const int32_t slt = a.seq_lens_this_time[b];
  if (slt <= 0) return false;
  const int64_t slot = static_cast<int64_t>(a.substep) + 1;
  FDMTP_GM int64_t* base_slot =
      slot < a.base_width ? a.base_model_draft_tokens + b * a.base_width + slot : nullptr;
  FDMTP_GM int64_t* draft = a.draft_width > 0 ? a.draft_tokens + b * a.draft_width : nullptr;
  FDMTP_GM int64_t* history = a.pre_ids + b * a.pre_ids_len;
  const int64_t tok = k >= 0 && k < a.num_tokens ? a.inter_next_tokens[k] : kPlaceholderToken;
  const bool stopped = a.stop_flags[b];
  const int64_t enc = NonNegative(a.seq_lens_encoder[b]);
  const int64_t dec = NonNegative(a.seq_lens_decoder[b]);
  if (stopped) {
    if (draft != nullptr) draft[0] = kPlaceholderToken;
    if (base_slot != nullptr) *base_slot = kPlaceholderToken;
  } else if (enc > 0) {
    a.seq_lens_decoder[b] = SatInt32(enc + dec);
    a.seq_lens_encoder[b] = 0;
    if (a.pre_ids_len > 1) history[1] = tok;
    a.step_idx[b] = SatAdd(a.step_idx[b], 1);
    if (draft != nullptr) draft[0] = tok;
    if (a.step_idx[b] < a.max_dec_len[b] && base_slot != nullptr) *base_slot = tok;
  } else if (dec > 0) {
    if (a.step_idx[b] >= SatSub(a.max_dec_len[b], 1)) {
      if (base_slot != nullptr) *base_slot = kPlaceholderToken;
    } else {
      a.seq_lens_decoder[b] = SatInt32(dec + slt);
      if (draft != nullptr) draft[0] = tok;
      if (base_slot != nullptr) *base_slot = tok;
      a.step_idx[b] = SatAdd(a.step_idx[b], slt);
      const int64_t pos = a.step_idx[b];
      if (pos >= 0 && pos < a.pre_ids_len) history[pos] = tok;
    }
  }
  a.seq_lens_this_time[b] = stopped ? 0 : 1;
  if (stopped) a.seq_lens_encoder[b] = 0;
  return stopped;
}

}  // namespace fdmtp

// draft_model_update: per-item logic shared by the CPU, CUDA and XPU kernels.
//
// After substep `substep` sampled one token per active draft item (compacted:
// inter_next_tokens[k] belongs to the k-th item with seq_lens_this_time > 0), advance the
// draft state and write the token into the target's draft row at slot substep + 1
// (FastDeploy develop, fastdeploy-ops.md §2.2 and §10 items 1, 4, 5). Only items with
// seq_lens_this_time > 0 at entry are touched:
//   stopped: draft_tokens[b,0] = -1 and base_draft[b, substep+1] = -1;
//   just prefilled (enc > 0): dec = enc + dec, enc = 0, pre_ids[b, 1] = tok (index 1 always,
//       as upstream), step_idx += 1, draft_tokens[b,0] = tok, and the base draft slot gets tok
//       if the incremented step_idx < max_dec_len;
//   decode (dec > 0): at step_idx >= max_dec_len - 1 the slot gets -1 and nothing advances;
//       otherwise dec += slt, step_idx += slt, pre_ids[b, step_idx] = tok,
//       draft_tokens[b,0] = tok and the base draft slot gets tok;
//   then seq_lens_this_time = stopped ? 0 : 1 (and enc = 0 when stopped).
// not_need_stop = (number of stopped items with slt > 0) < bsz.
//
// The compacted index k is computed from the *input* seq_lens_this_time (upstream's GPU
// kernel counts while other threads overwrite it; DESIGN.md §2 deviation 2). A missing
// inter_next_tokens entry (k beyond its length) reads as -1; history writes outside the
// pre_ids row are dropped.
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

struct DraftModelUpdateArgs {
  const int64_t* inter_next_tokens;   // [num_tokens] int64, in: one per item with slt > 0
  int64_t* draft_tokens;              // [bsz, W] int64, in/out
  int64_t* pre_ids;                   // [bsz, L] int64, in/out
  int32_t* seq_lens_this_time;        // [bsz] int32, in/out
  int32_t* seq_lens_encoder;          // [bsz] int32, in/out
  int32_t* seq_lens_decoder;          // [bsz] int32, in/out
  int64_t* step_idx;                  // [bsz] int64, in/out
  bool* stop_flags;                   // [bsz] bool, in
  bool* not_need_stop;                // [1] bool, out
  const int64_t* max_dec_len;         // [bsz] int64, in
  int64_t* base_model_draft_tokens;   // [bsz, W_base] int64, in/out: slot substep+1 written
  int64_t bsz;
  int64_t num_tokens;                 // length of inter_next_tokens
  int64_t draft_width;
  int64_t base_width;
  int64_t pre_ids_len;
  int32_t substep;
};

// `k` = number of items i < b whose input seq_lens_this_time > 0. Returns whether the item
// counts as "stopped" for not_need_stop (stopped with slt > 0).
FDMTP_HOST_DEVICE inline bool DraftModelUpdateItem(const DraftModelUpdateArgs& a, int64_t b,
                                                   int64_t k) {
  const int32_t slt = a.seq_lens_this_time[b];
  if (slt <= 0) return false;
  int64_t* base_slot = a.base_model_draft_tokens + b * a.base_width + a.substep + 1;
  int64_t* draft = a.draft_tokens + b * a.draft_width;
  int64_t* history = a.pre_ids + b * a.pre_ids_len;
  const int64_t tok = k < a.num_tokens ? a.inter_next_tokens[k] : kPlaceholderToken;
  const bool stopped = a.stop_flags[b];
  if (stopped) {
    draft[0] = kPlaceholderToken;
    *base_slot = kPlaceholderToken;
  } else if (a.seq_lens_encoder[b] > 0) {
    a.seq_lens_decoder[b] = a.seq_lens_encoder[b] + a.seq_lens_decoder[b];
    a.seq_lens_encoder[b] = 0;
    if (a.pre_ids_len > 1) history[1] = tok;
    a.step_idx[b] += 1;
    draft[0] = tok;
    if (a.step_idx[b] < a.max_dec_len[b]) *base_slot = tok;
  } else if (a.seq_lens_decoder[b] > 0) {
    if (a.step_idx[b] >= a.max_dec_len[b] - 1) {
      *base_slot = kPlaceholderToken;
    } else {
      a.seq_lens_decoder[b] += slt;
      draft[0] = tok;
      *base_slot = tok;
      a.step_idx[b] += slt;
      const int64_t pos = a.step_idx[b];
      if (pos >= 0 && pos < a.pre_ids_len) history[pos] = tok;
    }
  }
  a.seq_lens_this_time[b] = stopped ? 0 : 1;
  if (stopped) a.seq_lens_encoder[b] = 0;
  return stopped;
}

}  // namespace fdmtp

// update_attn_mask_offsets: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "update_attn_mask_offsets".
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

struct UpdateAttnMaskOffsetsArgs {
  FDMTP_GM int32_t* attn_mask_offsets;         // [2 * token_num] int32, out (zeroed by the kernel)
  FDMTP_GM int32_t* decode_states;             // [>= bsz, decode_width] int32, in/out
  FDMTP_GM const int32_t* seq_lens_this_time;  // [bsz] int32, in
  FDMTP_GM const int32_t* seq_lens_encoder;    // [bsz] int32, in
  FDMTP_GM const int32_t* seq_lens_decoder;    // [bsz] int32, in
  FDMTP_GM const int32_t* cu_seqlens_q;        // [>= bsz] int32, in: first token of each item
  FDMTP_GM const int32_t* attn_mask_offsets_full;  // [>= bsz, max_model_len] int32, in
  FDMTP_GM const bool* is_block_step;              // [bsz] bool, in: item skipped this step
  int64_t bsz;
  int64_t token_num;  // T = ids_remove_padding.shape[0]
  int64_t max_model_len;
  int64_t decode_width;  // K + 1
};

// Lengths and offsets are values, never rejected (a device kernel cannot check them
// without a sync), so every backend treats them the same way: token i of the item is served
// only when its slot q + i lies in [0, T) (and, for a prefill read of the full offsets,
// i < L), so the loops are bounded by the buffers, not by slt; offsets are computed in 64
// bits and saturate to the int32 range.
//
// Items are applied in batch order on every backend (when hostile `cu_seqlens_q` values make
// two items' slots overlap, the later item's value is the one left): the device kernels give
// each item's token loop to all lanes of one block (CUDA) or cluster (XPU) and synchronise
// between items; `lane` / `lanes` split the loops (the CPU passes 0 / 1).
FDMTP_HOST_DEVICE inline void UpdateAttnMaskOffsetsItem(const UpdateAttnMaskOffsetsArgs& a,
                                                        int64_t b, int64_t lane = 0,
                                                        int64_t lanes = 1) {
  if (a.is_block_step[b]) return;
  const int64_t enc = a.seq_lens_encoder[b];
  const int64_t dec = a.seq_lens_decoder[b];
  if (enc == 0 && dec == 0) return;
  const int64_t q = a.cu_seqlens_q[b];  // an int32 value: q + i below cannot overflow
  const int64_t slt = a.seq_lens_this_time[b];
  FDMTP_GM int32_t* states = a.decode_states + b * a.decode_width;
  const int64_t first = q < 0 ? -q : 0;                         // q + first >= 0
  int64_t end = a.token_num - q < slt ? a.token_num - q : slt;  // q + i < T, i < slt
  if (enc > 0) {
    const bool resume = a.decode_width > 0 && states[0] == 2 && dec > 0;
    FDMTP_GM const int32_t* full = a.attn_mask_offsets_full + b * a.max_model_len;
    if (!resume && a.max_model_len < end) end = a.max_model_len;
    for (int64_t i = first + lane; i < end; i += lanes) {
      a.attn_mask_offsets[2 * (q + i) + 1] =
          resume ? SatInt32(dec + slt) : SatInt32(static_cast<int64_t>(full[i]) + 1);
    }
  } else if (dec > 0) {
    for (int64_t i = first + lane; i < end; i += lanes) {
      a.attn_mask_offsets[2 * (q + i) + 1] = SatInt32(dec + 1 + i);
    }
    for (int64_t i = lane; i < a.decode_width; i += lanes) {
      states[i] = (i < slt && states[i] != 1) ? 0 : -1;
    }
  }
}

}  // namespace fdmtp

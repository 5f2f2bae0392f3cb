// speculate_pre_process: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "speculate_pre_process".
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

constexpr int64_t kPaddingTokenFill = 2;  // upstream's fill of ids_remove_padding

struct SpeculatePreProcessArgs {
  FDMTP_GM const int64_t* input_ids;            // [bsz, C] int64, in
  FDMTP_GM const int32_t* seq_lens_this_time;   // [bsz] int32, in
  FDMTP_GM const int64_t* draft_tokens;         // [bsz, W] int64, in
  FDMTP_GM const int32_t* seq_lens_encoder;     // [bsz] int32, in
  FDMTP_GM int64_t* ids_remove_padding;         // [T] int64, out
  FDMTP_GM int32_t* batch_id_per_token;         // [T] int32, out
  FDMTP_GM int32_t* cu_seqlens_q;               // [bsz + 1] int32, out
  FDMTP_GM int32_t* cu_seqlens_k;               // [bsz + 1] int32, out
  FDMTP_GM int32_t* cu_seq_lens_q_output;       // [bsz + 1] int32, out
  FDMTP_GM int32_t* batch_id_per_token_output;  // [bsz * W] int32, out
  FDMTP_GM int32_t* real_output_token_num;      // [1] int32, out
  int64_t bsz;
  int64_t input_ids_len;    // C
  int64_t draft_width;      // W
  int64_t token_num;        // T (the cpu_token_num attr)
  int64_t output_capacity;  // bsz * W
};

FDMTP_HOST_DEVICE inline int32_t SpeculateOutputRows(const SpeculatePreProcessArgs& a, int64_t b) {
  const int32_t n = a.seq_lens_this_time[b];
  if (n <= 0) return 0;
  if (n == 1 || a.seq_lens_encoder[b] != 0) return 1;
  return n;
}

FDMTP_HOST_DEVICE inline int32_t SpeculateInputTokens(const SpeculatePreProcessArgs& a, int64_t b) {
  const int32_t n = a.seq_lens_this_time[b];
  return n > 0 ? n : 0;
}

// The offsets are int32 prefix sums of the counts above, saturating at the int32 maximum
// (lengths are values, never rejected: 2**31 - 1 twice must not wrap into a valid offset).
// Saturating addition of non-negative counts is associative, so a sequential loop, a block
// scan with carries and a cluster scan all give the same offsets.
FDMTP_HOST_DEVICE inline int64_t SpeculateOffsetAdd(int64_t offset, int64_t count) {
  const int64_t sum = offset + count;  // both in [0, 2**62): no overflow
  return sum < kInt32Max ? sum : kInt32Max;
}

// The length of the span [begin, min(next, limit)) (0 when empty): an item's part of a
// buffer of `limit` entries, whatever its offsets say.
FDMTP_HOST_DEVICE inline int64_t SpeculateSpanInBounds(int64_t begin, int64_t next, int64_t limit) {
  const int64_t end = next < limit ? next : limit;
  return end > begin ? end - begin : 0;
}

// Tokens of item b that are written: positions cu_seqlens_q[b] .. min(cu_seqlens_q[b + 1],
// T) - 1 (offsets already written). Bounded by T, whatever the length values say.
// The *At variants take item b's offsets as values (begin = the offset array's [b], next =
// its [b + 1]), for kernels that keep the offsets elsewhere (XPU3: in shared memory).
FDMTP_HOST_DEVICE inline int64_t SpeculateTokensInBoundsAt(const SpeculatePreProcessArgs& a,
                                                           int64_t begin, int64_t next) {
  return SpeculateSpanInBounds(begin, next, a.token_num);
}
FDMTP_HOST_DEVICE inline int64_t SpeculateTokensInBounds(const SpeculatePreProcessArgs& a,
                                                         int64_t b) {
  return SpeculateSpanInBounds(a.cu_seqlens_q[b], a.cu_seqlens_q[b + 1], a.token_num);
}

// Output rows of item b that are written: cu_seq_lens_q_output[b] ..
// min(cu_seq_lens_q_output[b + 1], N * W) - 1.
FDMTP_HOST_DEVICE inline int64_t SpeculateRowsInBoundsAt(const SpeculatePreProcessArgs& a,
                                                         int64_t begin, int64_t next) {
  return SpeculateSpanInBounds(begin, next, a.output_capacity);
}
FDMTP_HOST_DEVICE inline int64_t SpeculateRowsInBounds(const SpeculatePreProcessArgs& a,
                                                       int64_t b) {
  return SpeculateSpanInBounds(a.cu_seq_lens_q_output[b], a.cu_seq_lens_q_output[b + 1],
                               a.output_capacity);
}

// Token i < SpeculateTokensInBounds(a, b) of item b (offsets already written).
FDMTP_HOST_DEVICE inline void SpeculatePreProcessTokenAt(const SpeculatePreProcessArgs& a,
                                                         int64_t b, int64_t i, int64_t begin) {
  const int64_t t = begin + i;
  if (t < 0 || t >= a.token_num) return;
  const bool from_draft = a.draft_width > 0 && a.seq_lens_encoder[b] <= 0;
  int64_t token = kPaddingTokenFill;
  if (from_draft) {
    if (i < a.draft_width) token = a.draft_tokens[b * a.draft_width + i];
  } else if (i < a.input_ids_len) {
    token = a.input_ids[b * a.input_ids_len + i];
  }
  a.ids_remove_padding[t] = token;
  a.batch_id_per_token[t] = static_cast<int32_t>(b);
}
FDMTP_HOST_DEVICE inline void SpeculatePreProcessToken(const SpeculatePreProcessArgs& a, int64_t b,
                                                       int64_t i) {
  SpeculatePreProcessTokenAt(a, b, i, a.cu_seqlens_q[b]);
}

// Output row j < SpeculateRowsInBounds(a, b) of item b (offsets already written).
FDMTP_HOST_DEVICE inline void SpeculatePreProcessOutputRowAt(const SpeculatePreProcessArgs& a,
                                                             int64_t b, int64_t j, int64_t begin) {
  const int64_t r = begin + j;
  if (r >= 0 && r < a.output_capacity) a.batch_id_per_token_output[r] = static_cast<int32_t>(b);
}
FDMTP_HOST_DEVICE inline void SpeculatePreProcessOutputRow(const SpeculatePreProcessArgs& a,
                                                           int64_t b, int64_t j) {
  SpeculatePreProcessOutputRowAt(a, b, j, a.cu_seq_lens_q_output[b]);
}

}  // namespace fdmtp

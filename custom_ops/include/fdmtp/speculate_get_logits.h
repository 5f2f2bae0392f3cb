// speculate_get_logits: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "speculate_get_logits".
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

struct SpeculateGetLogitsArgs {
  FDMTP_GM void* draft_logits;              // [draft_rows, vocab] float, in/out
  FDMTP_GM int32_t* next_token_num;         // [bsz] int32, out: rows of `logits` per item
  FDMTP_GM int32_t* batch_token_num;        // [bsz] int32, out: rows of `draft_logits` per item
  FDMTP_GM int32_t* cu_next_token_offset;   // [bsz + 1] int32, out: [1..bsz] inclusive sums
  FDMTP_GM int32_t* cu_batch_token_offset;  // [bsz + 1] int32, out: [1..bsz] inclusive sums
  FDMTP_GM const void* logits;              // [logit_rows, vocab] float, in: draft logits rows
  FDMTP_GM const void*
      first_token_logits;  // [bsz, vocab] float, in: target logits of the first token
  FDMTP_GM const int32_t* seq_lens_this_time;  // [bsz] int32, in
  FDMTP_GM const int32_t* seq_lens_encoder;    // [bsz] int32, in: > 0 for a prefill item
  int64_t bsz;
  int64_t vocab;
  int64_t draft_rows;
  int64_t logit_rows;
};

struct LogitsCounts {
  int32_t next;   // rows of `logits` the item asks for
  int32_t batch;  // rows of `draft_logits` the item asks for
};

// The counts an item asks for (upstream's): 1 and 2 in prefill, else seq_lens_this_time
// (negative counts as 0). What it gets is limited by the buffers: see SpeculateGetLogitsLimit.
FDMTP_HOST_DEVICE inline LogitsCounts SpeculateGetLogitsCounts(const SpeculateGetLogitsArgs& a,
                                                               int64_t b) {
  if (a.seq_lens_encoder[b] > 0) return {1, 2};
  const int32_t slt = a.seq_lens_this_time[b] > 0 ? a.seq_lens_this_time[b] : 0;
  return {slt, slt};
}

// The running offsets saturate at what the buffers hold (and at the int32 range of the
// offset outputs): cu_next_token_offset[b + 1] = min(sum of next counts of items <= b,
// rows of `logits`), cu_batch_token_offset[b + 1] likewise with the rows of `draft_logits`,
// and an item's written counts are the differences of consecutive offsets. Offsets are
// accumulated in 64 bits: min(min(s, L) + c, L) == min(s + c, L) for c >= 0, so a running
// sum may be saturated at every step.
FDMTP_HOST_DEVICE inline int64_t SpeculateGetLogitsLimit(int64_t rows) {
  return rows < INT32_MAX ? rows : INT32_MAX;
}

FDMTP_HOST_DEVICE inline int64_t SpeculateGetLogitsAdvance(int64_t offset, int64_t count,
                                                           int64_t limit) {
  // offset <= limit < 2^31 and every caller's count < 2^62: the sum cannot overflow.
  return offset + count < limit ? offset + count : limit;
}

// Source of draft row j of item b as (tensor, row): tensor 0 = logits, 1 =
// first_token_logits; row -1 when it lies outside its tensor (the copy is skipped).
struct LogitsSource {
  int tensor;
  int64_t row;
};

FDMTP_HOST_DEVICE inline LogitsSource SpeculateGetLogitsSource(const SpeculateGetLogitsArgs& a,
                                                               int64_t b, int64_t j,
                                                               int64_t next_off) {
  if (a.seq_lens_encoder[b] > 0 && j == 0) return {1, b};
  const int64_t row = next_off + (a.seq_lens_encoder[b] > 0 ? 0 : j);
  return {0, row >= 0 && row < a.logit_rows ? row : -1};
}

}  // namespace fdmtp

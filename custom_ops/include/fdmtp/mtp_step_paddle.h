// mtp_step_paddle: the allocator shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "mtp_step_paddle".
//
// MtpStepRun is a whole-batch sequential algorithm; the CUDA kernel runs it on one thread
// so order and ties are the CPU's. The free list is a stack: push at free_list_len, pop
// from free_list_len - 1.
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

struct MtpStepArgs {
  FDMTP_GM const bool* base_model_stop_flags;  // [bsz] bool, in (target)
  FDMTP_GM bool* stop_flags;                   // [bsz] bool, in/out
  FDMTP_GM bool* batch_drop;                   // [bsz] bool, in/out
  FDMTP_GM int32_t* seq_lens_this_time;        // [bsz] int32, in/out
  FDMTP_GM int32_t* seq_lens_decoder;          // [bsz] int32, in/out
  FDMTP_GM int32_t* block_tables;              // [bsz, max_blocks] int32, in/out (-1 = none)
  FDMTP_GM int32_t* encoder_block_lens;        // [bsz] int32, in/out: blocks owned by the prompt
  FDMTP_GM int32_t* used_list_len;             // [bsz] int32, in/out: draft blocks in use
  FDMTP_GM int32_t* free_list;                 // [free_capacity] int32, in/out
  FDMTP_GM int32_t* free_list_len;             // [1] int32, in/out
  int64_t bsz;
  int64_t max_blocks;
  int64_t free_capacity;
  int32_t block_size;
  int32_t max_draft_tokens;
};

// Gives item b's draft blocks back: table slots [enc, enc + used) (enc =
// encoder_block_lens[b], the prompt's blocks, which stay) that lie inside the row are pushed
// onto the free list while it has room and set to -1. The loop is bounded by the row, not
// by the values. used_list_len becomes 0; encoder_block_lens too unless `keep_encoder_lens`
// (an evicted item keeps it, as upstream).
FDMTP_HOST_DEVICE inline void MtpStepRelease(const MtpStepArgs& a, int64_t b,
                                             bool keep_encoder_lens) {
  FDMTP_GM int32_t* row = a.block_tables + b * a.max_blocks;
  const int64_t start = NonNegative(a.encoder_block_lens[b]);
  const int64_t used = NonNegative(a.used_list_len[b]);
  const int64_t end = start + used < a.max_blocks ? start + used : a.max_blocks;
  for (int64_t slot = start; slot < end; ++slot) {
    if (*a.free_list_len < a.free_capacity) a.free_list[(*a.free_list_len)++] = row[slot];
    row[slot] = kNoBlock;
  }
  if (!keep_encoder_lens) a.encoder_block_lens[b] = 0;
  a.used_list_len[b] = 0;
}

FDMTP_HOST_DEVICE inline int64_t MtpStepNeedSlot(const MtpStepArgs& a, int64_t b) {
  return (NonNegative(a.seq_lens_decoder[b]) + a.max_draft_tokens + 1) / a.block_size;
}

FDMTP_HOST_DEVICE inline bool MtpStepNeedsBlock(const MtpStepArgs& a, int64_t b) {
  if (a.base_model_stop_flags[b] || a.batch_drop[b]) return false;
  const int64_t slot = MtpStepNeedSlot(a, b);
  return slot < a.max_blocks && a.block_tables[b * a.max_blocks + slot] == kNoBlock;
}

FDMTP_HOST_DEVICE inline void MtpStepDrop(const MtpStepArgs& a, int64_t b) {
  a.stop_flags[b] = true;
  a.batch_drop[b] = true;
  a.seq_lens_this_time[b] = 0;
  a.seq_lens_decoder[b] = 0;
}

FDMTP_HOST_DEVICE inline void MtpStepRun(const MtpStepArgs& a) {
  // free_list_len is clamped to [0, F] first (and written back clamped): every pop reads
  // free_list[len - 1] with 1 <= len <= F, every push stops at F.
  const int64_t capacity = a.free_capacity < INT32_MAX ? a.free_capacity : INT32_MAX;
  *a.free_list_len = static_cast<int32_t>(ClampTo(*a.free_list_len, 0, capacity));
  for (int64_t b = 0; b < a.bsz; ++b) {
    if ((a.base_model_stop_flags[b] || a.batch_drop[b]) && a.used_list_len[b] > 0) {
      MtpStepRelease(a, b, false);
    }
  }
  int64_t need = 0;
  for (int64_t b = 0; b < a.bsz; ++b) need += MtpStepNeedsBlock(a, b) ? 1 : 0;
  // As upstream, `need` is not decremented when a needing item is evicted. Each eviction
  // zeroes a positive used_list_len, so the loop runs at most bsz times.
  while (need > *a.free_list_len) {
    int64_t victim = -1;
    int32_t most = 0;
    for (int64_t b = 0; b < a.bsz; ++b) {
      if (!a.base_model_stop_flags[b] && a.used_list_len[b] > most) {
        most = a.used_list_len[b];
        victim = b;
      }
    }
    if (victim < 0) break;  // nothing left to evict
    MtpStepRelease(a, victim, true);
    MtpStepDrop(a, victim);
  }
  for (int64_t b = 0; b < a.bsz; ++b) {
    if (!MtpStepNeedsBlock(a, b)) continue;
    if (*a.free_list_len <= 0) {
      MtpStepDrop(a, b);  // cannot be served: stopped and reported through batch_drop
      continue;
    }
    a.used_list_len[b] = SatInt32(NonNegative(a.used_list_len[b]) + 1);
    a.block_tables[b * a.max_blocks + MtpStepNeedSlot(a, b)] = a.free_list[*a.free_list_len - 1];
    *a.free_list_len -= 1;
  }
}

}  // namespace fdmtp

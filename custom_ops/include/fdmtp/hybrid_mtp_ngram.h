// hybrid_mtp_ngram: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "hybrid_mtp_ngram".
//
// The search and the global threshold are in fdmtp/ngram_common.h; this header maps the
// op's tensors to NgramItems and writes the result.
#pragma once

#include "fdmtp/ngram_common.h"

namespace fdmtp {

struct HybridMtpNgramArgs {
  FDMTP_GM const int64_t* input_ids;  // [bsz, input_width] int64, in: draft prompt (shifted by one)
  FDMTP_GM const int64_t* input_ids_len;  // [bsz] int64, in: valid tokens of each input_ids row
  FDMTP_GM const int64_t* pre_ids;  // [bsz, pre_width] int64, in: draft history; newest at step_idx
  FDMTP_GM const int64_t* step_idx;      // [bsz] int64, in: index of the newest token in pre_ids
  FDMTP_GM int64_t* draft_tokens;        // [bsz, draft_width] int64, in/out: target draft rows
  FDMTP_GM int32_t* seq_lens_this_time;  // [bsz] int32, in/out: tokens already in each draft row
  FDMTP_GM const int32_t*
      seq_lens_decoder;                 // [bsz] int32, in: > 0 counts as unprocessed (threshold)
  FDMTP_GM const int64_t* max_dec_len;  // [bsz] int64, in: generation length limit
  int64_t bsz;
  int64_t input_width;
  int64_t pre_width;
  int64_t draft_width;  // >= max_draft_tokens + 1 (checked by the entry)
  int max_ngram_size;
  int min_ngram_size;
  int max_draft_tokens;
  int64_t threshold;  // global token-number threshold (upstream's env var)
};

struct HybridMtpNgramOp {
  using Args = HybridMtpNgramArgs;

  FDMTP_HOST_DEVICE static NgramItem Item(const Args& a, int64_t b) {
    NgramItem item;
    item.prompt = a.input_ids + b * a.input_width;
    item.prompt_len = NgramClamp(a.input_ids_len[b], a.input_width);
    const int64_t step = a.step_idx[b];
    item.history = a.pre_ids + b * a.pre_width;
    item.step = step < a.pre_width ? step : -1;  // out of the row: no search
    const int64_t ori = a.seq_lens_this_time[b];
    item.base = ori;
    const int64_t by_slots = static_cast<int64_t>(a.max_draft_tokens) - ori + 1;
    const int64_t by_length = NgramByLength(a.max_dec_len[b], step);
    item.budget = by_slots < by_length ? by_slots : by_length;
    item.active = ori > 0 && item.budget > 0;
    item.pending = a.seq_lens_decoder[b] > 0;
    return item;
  }

  FDMTP_HOST_DEVICE static void Write(const Args& a, int64_t b, const NgramItem& item,
                                      const NgramProposal& p, int32_t count) {
    if (count <= 0) return;  // no match: the row and its length stay as they are
    NgramCopyTokens(a.draft_tokens + b * a.draft_width + item.base, item, p, count);
    a.seq_lens_this_time[b] = static_cast<int32_t>(item.base + count);
  }
};

}  // namespace fdmtp

// ngram_match: per-item logic shared by the CPU, CUDA and XPU kernels.
// Contract: docs/ops.md, "ngram_match".
//
// The search and the global threshold are in fdmtp/ngram_common.h; this header maps the
// op's tensors to NgramItems and writes the result.
#pragma once

#include "fdmtp/ngram_common.h"

namespace fdmtp {

struct NgramMatchArgs {
  FDMTP_GM const int64_t* input_ids;      // [bsz, input_width] int64, in: prompt tokens
  FDMTP_GM const int64_t* input_ids_len;  // [bsz] int64, in: valid tokens of each input_ids row
  FDMTP_GM const int64_t*
      token_ids_all;  // [bsz, all_width] int64, in: prompt then generated tokens
  FDMTP_GM const int64_t*
      prompt_lens;  // [bsz] int64, in: generated tokens start here in token_ids_all
  FDMTP_GM const int64_t* step_idx;  // [bsz] int64, in: pattern ends at generated token step_idx
  FDMTP_GM const int32_t* draft_token_num;  // [bsz] int32, in: per-item draft budget
  FDMTP_GM int64_t* draft_tokens;  // [bsz, draft_width] int64, in/out: drafts go to [1, 1+cnt)
  FDMTP_GM int32_t* seq_lens_this_time;      // [bsz] int32, in/out
  FDMTP_GM const int32_t* seq_lens_encoder;  // [bsz] int32, in: > 0: prefill item, left unchanged
  FDMTP_GM const int32_t*
      seq_lens_decoder;                 // [bsz] int32, in: == 0 (and not prefill): idle, slt = 0
  FDMTP_GM const int64_t* max_dec_len;  // [bsz] int64, in: generation length limit
  int64_t bsz;
  int64_t input_width;
  int64_t all_width;
  int64_t draft_width;  // >= 1 (checked by the entry)
  int max_ngram_size;   // n from max_ngram_size down to 1
  int64_t threshold;    // global token-number threshold (upstream's env var)
};

struct NgramMatchOp {
  using Args = NgramMatchArgs;

  FDMTP_HOST_DEVICE static NgramItem Item(const Args& a, int64_t b) {
    NgramItem item;
    const int32_t enc = a.seq_lens_encoder[b];
    const int32_t dec = a.seq_lens_decoder[b];
    item.pending = enc > 0 || dec > 0;
    if (enc > 0) {  // prefill: keeps its count, which still counts in the running sum
      item.base = a.seq_lens_this_time[b];
      return item;
    }
    if (dec == 0) return item;  // idle slot: seq_lens_this_time becomes 0
    item.base = 1;
    item.active = true;
    item.prompt = a.input_ids + b * a.input_width;
    item.prompt_len = NgramClamp(a.input_ids_len[b], a.input_width);
    const int64_t prompt_len = NgramClamp(a.prompt_lens[b], a.all_width);
    item.history = a.token_ids_all + b * a.all_width + prompt_len;
    const int64_t step = a.step_idx[b];
    item.step = step < a.all_width - prompt_len ? step : -1;  // out of the row: no search
    const int64_t by_request = a.draft_token_num[b];
    const int64_t by_length = NgramByLength(a.max_dec_len[b], step);
    const int64_t by_slots = a.draft_width - 1;
    int64_t budget = by_request < by_length ? by_request : by_length;
    item.budget = budget < by_slots ? budget : by_slots;
    return item;
  }

  FDMTP_HOST_DEVICE static void Write(const Args& a, int64_t b, const NgramItem& item,
                                      const NgramProposal& p, int32_t count) {
    if (a.seq_lens_encoder[b] > 0) return;
    if (!item.active) {
      a.seq_lens_this_time[b] = 0;
      return;
    }
    if (count > 0) NgramCopyTokens(a.draft_tokens + b * a.draft_width + 1, item, p, count);
    a.seq_lens_this_time[b] = 1 + count;
  }
};

}  // namespace fdmtp

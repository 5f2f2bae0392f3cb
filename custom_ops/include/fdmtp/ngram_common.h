// N-gram drafting shared by hybrid_mtp_ngram and ngram_match, on every backend.
//
// Each op maps its own tensors to one NgramItem per batch item (ngram_match.h,
// hybrid_mtp_ngram.h); from there the semantics are common and run in three phases:
//
//   1. propose (per item, independent): the longest n in [min_n, max_n] (n <= step) whose
//      pattern history[step-n+1 .. step] occurs in the prompt followed by at least one
//      token, else in history[0 .. step) followed by at least one token; for that n the
//      leftmost occurrence, prompt first. This is exactly what upstream's loop returns
//      (n from max down to min, prompt then history, leftmost match whose end < the
//      haystack length), computed in one pass per haystack: with L(e) the length of the
//      backward match ending at haystack position e (capped at the largest usable n), the
//      answer is the first e at which the running maximum of L reaches its final value.
//   2. cap (ordered over the batch): upstream's sequential token-number threshold. Its
//      slack `thr - S_b - U_b` (S_b: running token sum including item b, U_b: items still
//      unprocessed) never increases along the batch, so the result equals "every item
//      takes its full proposal up to the first item whose proposal does not fit; that
//      item takes what is left if at least 2 fit, every later item takes nothing". This
//      closed form is what lets CUDA use a parallel prefix sum instead of a serial loop.
//   3. write: per item, the accepted tokens and the new seq_lens_this_time.
// Contract: docs/ops.md, "The n-gram ops (shared rules)"; reference: tests/reference/ngram.py.
#pragma once

#include <cstdint>

#include "fdmtp/common.h"

namespace fdmtp {

// One batch item, as both n-gram ops see it.
struct NgramItem {
  FDMTP_GM const int64_t* prompt = nullptr;   // haystack 1: prompt tokens
  int64_t prompt_len = 0;                     // its length (already clamped to the row width)
  FDMTP_GM const int64_t* history = nullptr;  // generated tokens; the pattern ends at history[step]
  int64_t step = -1;                          // < 0: no usable history (no search)
  int64_t base = 0;                           // this item's seq_lens_this_time before n-gram tokens
  int64_t budget = 0;                         // per-item token budget before the threshold
  bool active = false;                        // searched; decrements the unprocessed count
  bool pending = false;                       // counted in the initial unprocessed count
};

// Phase 1 result for one item. `count` is the number of tokens the match offers, already
// limited by the item's budget (0: no match, or the item does not take part).
struct NgramProposal {
  int64_t start;   // first token to copy, index into the source haystack
  int32_t source;  // kNgramSourceNone / Prompt / History
  int32_t count;
};

// The largest max_ngram_size the ops accept (checked on the host, an error naming the
// attr). Match lengths never exceed it; the CUDA search packs a length in 16 bits.
constexpr int kMaxNgramSize = 1024;

constexpr int32_t kNgramSourceNone = 0;
constexpr int32_t kNgramSourcePrompt = 1;
constexpr int32_t kNgramSourceHistory = 2;

// The tokens an item may still generate before max_dec_len: max_dec_len - step - 1,
// saturating (both are values from tensors, any int64).
FDMTP_HOST_DEVICE inline int64_t NgramByLength(int64_t max_dec_len, int64_t step) {
  return SatSub(SatSub(max_dec_len, step), 1);
}

// v clamped to [0, hi]: lengths and offsets read from tensors, kept inside their rows.
FDMTP_HOST_DEVICE inline int64_t NgramClamp(int64_t v, int64_t hi) {
  return v < 0 ? 0 : (v > hi ? hi : v);
}

// The largest usable n for an item: n <= max_n and n <= step (upstream skips n > step).
FDMTP_HOST_DEVICE inline int64_t NgramMaxN(const NgramItem& item, int max_n) {
  return item.step < max_n ? item.step : static_cast<int64_t>(max_n);
}

// L(e): how many tokens ending at hay[e] equal the pattern ending at history[step], at
// most `cap` (and at most e + 1). Callers check hay[e] == history[step] first.
FDMTP_HOST_DEVICE inline int64_t NgramMatchLength(FDMTP_GM const int64_t* hay, int64_t e,
                                                  FDMTP_GM const int64_t* history, int64_t step,
                                                  int64_t cap) {
  const int64_t limit = cap < e + 1 ? cap : e + 1;
  int64_t len = 0;
  while (len < limit && hay[e - len] == history[step - len]) ++len;
  return len;
}

// The proposal from a match of the running-maximum scan: `best_len` (0 = none) ending at
// `best_end` in `source` whose haystack has `hay_len` tokens.
FDMTP_HOST_DEVICE inline NgramProposal NgramMakeProposal(const NgramItem& item, int32_t source,
                                                         int64_t best_end, int64_t hay_len) {
  NgramProposal p;
  p.start = 0;
  p.source = kNgramSourceNone;
  p.count = 0;
  if (source == kNgramSourceNone || !item.active || item.budget <= 0) return p;
  const int64_t start = best_end + 1;
  int64_t available = hay_len - start;
  if (available > item.budget) available = item.budget;
  if (available <= 0) return p;
  p.start = start;
  p.source = source;
  p.count = static_cast<int32_t>(available);
  return p;
}

// Phase 2, per item, given the uncapped running values: `sum` = S_b (tokens of the items
// before b with their full proposals, plus b's base) and `unprocessed` = U_b. Returns
// true when item b is the first whose proposal does not fit (everything after it gets
// nothing); *count is what b takes.
FDMTP_HOST_DEVICE inline bool NgramCapItem(const NgramItem& item, const NgramProposal& p,
                                           int64_t threshold, int64_t sum, int64_t unprocessed,
                                           int32_t* count) {
  *count = p.count;
  if (!item.active || p.count <= 0) return false;
  const int64_t slack = threshold - sum - unprocessed;
  if (slack >= 2 && slack >= p.count) return false;
  *count = slack >= 2 ? static_cast<int32_t>(slack) : 0;
  return true;
}

// Copies the `count` accepted tokens of proposal `p` to dst[0 .. count).
FDMTP_HOST_DEVICE inline void NgramCopyTokens(FDMTP_GM int64_t* dst, const NgramItem& item,
                                              const NgramProposal& p, int32_t count) {
  FDMTP_GM const int64_t* src =
      (p.source == kNgramSourcePrompt ? item.prompt : item.history) + p.start;
  for (int32_t k = 0; k < count; ++k) dst[k] = src[k];
}

// An item's contribution to the running token sum before its n-gram tokens (negative
// seq_lens_this_time values are invalid and count as 0).
FDMTP_HOST_DEVICE inline int64_t NgramBaseForSum(const NgramItem& item) {
  return item.base > 0 ? item.base : 0;
}

// Phase 1 on one item, shared by the CPU driver (which passes its vectorised candidate
// filter) and the XPU3 kernel (NgramFindNextScalar). find_next(hay, from, end, value):
// the first e in [from, end) with hay[e] == value, else end.
FDMTP_HOST_DEVICE inline int64_t NgramFindNextScalar(FDMTP_GM const int64_t* hay, int64_t from,
                                                     int64_t end, int64_t value) {
  for (int64_t i = from; i < end; ++i) {
    if (hay[i] == value) return i;
  }
  return end;
}

// NgramFindNextScalar as a functor, for device code (which passes no function pointers).
struct NgramFindNextScalarFn {
  FDMTP_HOST_DEVICE int64_t operator()(FDMTP_GM const int64_t* hay, int64_t from, int64_t end,
                                       int64_t value) const {
    return NgramFindNextScalar(hay, from, end, value);
  }
};

// The running-maximum scan over match ends e in [0, positions): returns the first e at
// which L(e) reaches its final maximum, if that maximum exceeds *best_len; *best_len is
// updated to it. Stops early once L(e) == cap (nothing can beat it).
template <typename FindNext>
FDMTP_HOST_DEVICE inline int64_t NgramScanHaystack(FindNext find_next, FDMTP_GM const int64_t* hay,
                                                   int64_t positions, const NgramItem& item,
                                                   int64_t cap, int64_t* best_len) {
  const int64_t last = item.history[item.step];
  int64_t best_end = -1;
  for (int64_t e = find_next(hay, 0, positions, last); e < positions;
       e = find_next(hay, e + 1, positions, last)) {
    const int64_t len = NgramMatchLength(hay, e, item.history, item.step, cap);
    if (len > *best_len) {
      *best_len = len;
      best_end = e;
      if (len == cap) break;
    }
  }
  return best_end;
}

template <typename FindNext>
FDMTP_HOST_DEVICE inline NgramProposal NgramProposeItem(FindNext find_next, const NgramItem& item,
                                                        int max_n, int min_n) {
  const int64_t cap = NgramMaxN(item, max_n);
  if (!item.active || item.budget <= 0 || cap < min_n) {
    return NgramMakeProposal(item, kNgramSourceNone, 0, 0);
  }
  // Matches must leave at least one token after them: ends e <= hay_len - 2.
  int64_t best_len = min_n - 1;
  const int64_t prompt_end =
      NgramScanHaystack(find_next, item.prompt, item.prompt_len - 1, item, cap, &best_len);
  if (best_len < cap) {
    const int64_t history_end =
        NgramScanHaystack(find_next, item.history, item.step - 1, item, cap, &best_len);
    if (history_end >= 0) {
      return NgramMakeProposal(item, kNgramSourceHistory, history_end, item.step);
    }
  }
  if (prompt_end >= 0) {
    return NgramMakeProposal(item, kNgramSourcePrompt, prompt_end, item.prompt_len);
  }
  return NgramMakeProposal(item, kNgramSourceNone, 0, 0);
}

// Phase 2 over the batch, in order: counts[b] = the tokens item b keeps. item_at(b) gives
// item b (the CPU passes its array, the XPU kernel rebuilds items from the tensors).
template <typename ItemAt>
FDMTP_HOST_DEVICE inline void NgramCapBatch(ItemAt item_at, const NgramProposal* proposals,
                                            int64_t bsz, int64_t threshold, int32_t* counts) {
  int64_t unprocessed = 0;
  for (int64_t b = 0; b < bsz; ++b) unprocessed += item_at(b).pending ? 1 : 0;
  int64_t before = 0;  // tokens of the earlier items, with their full proposals
  bool capped = false;
  for (int64_t b = 0; b < bsz; ++b) {
    const NgramItem item = item_at(b);
    if (item.active) --unprocessed;
    if (capped) {
      counts[b] = 0;
      continue;
    }
    capped = NgramCapItem(item, proposals[b], threshold, before + NgramBaseForSum(item),
                          unprocessed, &counts[b]);
    before += NgramBaseForSum(item) + (item.active ? proposals[b].count : 0);
  }
}

}  // namespace fdmtp

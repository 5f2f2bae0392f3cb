// CPU driver of the two n-gram ops (see fdmtp/ngram_common.h for the three phases).
// Phase 1 (the search) runs on up to `num_threads` threads, items split into contiguous
// chunks; each item's result depends only on its own inputs, so the output does not
// depend on the thread count. Phases 2 and 3 are a short ordered pass.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "fdmtp/ngram_common.h"
#include "fdmtp/tensor_ref.h"

namespace fdmtp {

// The host check of the attr's upper bound (kMaxNgramSize), shared by both n-gram ops.
inline void CheckMaxNgramSize(const ArgChecker& check, int64_t max_ngram_size) {
  if (max_ngram_size > kMaxNgramSize) {
    check.Fail("attr `max_ngram_size` must be <= " + std::to_string(kMaxNgramSize) + ", got " +
               std::to_string(max_ngram_size));
  }
}

namespace cpu {

// Phase 1 for every item. num_threads <= 0: chosen from the amount of work.
void NgramPropose(const NgramItem* items, int64_t bsz, int max_n, int min_n, int num_threads,
                  NgramProposal* proposals);

// Phase 2: the threshold, in batch order.
void NgramCap(const NgramItem* items, const NgramProposal* proposals, int64_t bsz,
              int64_t threshold, int32_t* counts);

template <typename Op>
void RunNgram(const typename Op::Args& args, int64_t bsz, int max_n, int min_n, int64_t threshold,
              int num_threads) {
  std::vector<NgramItem> items(static_cast<std::size_t>(bsz));
  for (int64_t b = 0; b < bsz; ++b) items[b] = Op::Item(args, b);
  std::vector<NgramProposal> proposals(static_cast<std::size_t>(bsz));
  NgramPropose(items.data(), bsz, max_n, min_n, num_threads, proposals.data());
  std::vector<int32_t> counts(static_cast<std::size_t>(bsz));
  NgramCap(items.data(), proposals.data(), bsz, threshold, counts.data());
  for (int64_t b = 0; b < bsz; ++b) Op::Write(args, b, items[b], proposals[b], counts[b]);
}

}  // namespace cpu
}  // namespace fdmtp

#include "ngram_common.h"

#include <algorithm>
#include <thread>

namespace fdmtp {
namespace cpu {
namespace {

// First e in [from, end) with hay[e] == value, else end. Blocks of 8 are tested with a
// branch-free OR so the compiler can vectorise the common "no candidate here" case.
int64_t FindNext(const int64_t* hay, int64_t from, int64_t end, int64_t value) {
  constexpr int64_t kBlock = 8;
  int64_t i = from;
  for (; i + kBlock <= end; i += kBlock) {
    bool any = false;
    for (int64_t k = 0; k < kBlock; ++k) any |= hay[i + k] == value;
    if (any) break;
  }
  for (; i < end; ++i) {
    if (hay[i] == value) return i;
  }
  return end;
}

// The running-maximum scan over match ends e in [0, positions): returns the first e at
// which L(e) reaches its final maximum, if that maximum exceeds `floor`; *best_len is
// updated to it. Stops early once L(e) == cap (nothing can beat it).
int64_t ScanHaystack(const int64_t* hay, int64_t positions, const NgramItem& item, int64_t cap,
                     int64_t* best_len) {
  const int64_t last = item.history[item.step];
  int64_t best_end = -1;
  for (int64_t e = FindNext(hay, 0, positions, last); e < positions;
       e = FindNext(hay, e + 1, positions, last)) {
    const int64_t len = NgramMatchLength(hay, e, item.history, item.step, cap);
    if (len > *best_len) {
      *best_len = len;
      best_end = e;
      if (len == cap) break;
    }
  }
  return best_end;
}

NgramProposal ProposeItem(const NgramItem& item, int max_n, int min_n) {
  const int64_t cap = NgramMaxN(item, max_n);
  if (!item.active || item.budget <= 0 || cap < min_n) {
    return NgramMakeProposal(item, kNgramSourceNone, 0, 0);
  }
  // Matches must leave at least one token after them: ends e <= hay_len - 2.
  int64_t best_len = min_n - 1;
  const int64_t prompt_end = ScanHaystack(item.prompt, item.prompt_len - 1, item, cap, &best_len);
  if (best_len < cap) {
    const int64_t history_end = ScanHaystack(item.history, item.step - 1, item, cap, &best_len);
    if (history_end >= 0) {
      return NgramMakeProposal(item, kNgramSourceHistory, history_end, item.step);
    }
  }
  if (prompt_end >= 0) {
    return NgramMakeProposal(item, kNgramSourcePrompt, prompt_end, item.prompt_len);
  }
  return NgramMakeProposal(item, kNgramSourceNone, 0, 0);
}

// Automatic thread count: one thread per this many haystack tokens (about a millisecond
// of scanning), so that thread start-up and scheduling delays stay small beside the work.
constexpr int64_t kTokensPerThread = 1 << 22;

}  // namespace

void NgramPropose(const NgramItem* items, int64_t bsz, int max_n, int min_n, int num_threads,
                  NgramProposal* proposals) {
  std::vector<int64_t> work_before(static_cast<std::size_t>(bsz) + 1, 0);
  for (int64_t b = 0; b < bsz; ++b) {
    const int64_t work = items[b].active ? items[b].prompt_len + std::max<int64_t>(items[b].step, 0) : 0;
    work_before[b + 1] = work_before[b] + work + 1;
  }
  const int64_t total = work_before[bsz];
  int64_t threads = num_threads;
  if (threads <= 0) {
    threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
    threads = std::min<int64_t>(threads, std::max<int64_t>(1, total / kTokensPerThread));
  }
  threads = std::max<int64_t>(1, std::min<int64_t>(threads, bsz));
  auto run = [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) proposals[b] = ProposeItem(items[b], max_n, min_n);
  };
  if (threads == 1) {
    run(0, bsz);
    return;
  }
  // Contiguous chunks of about equal work: chunk t starts at the first item whose work
  // prefix reaches t/threads of the total.
  std::vector<int64_t> bounds(static_cast<std::size_t>(threads) + 1, bsz);
  bounds[0] = 0;
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t target = total * t / threads;
    bounds[t] = std::lower_bound(work_before.begin(), work_before.end(), target) - work_before.begin();
    bounds[t] = std::max(bounds[t - 1], std::min(bounds[t], bsz));
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads) - 1);
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(run, bounds[t], bounds[t + 1]);
  run(bounds[0], bounds[1]);
  for (std::thread& th : pool) th.join();
}

void NgramCap(const NgramItem* items, const NgramProposal* proposals, int64_t bsz,
              int64_t threshold, int32_t* counts) {
  int64_t unprocessed = 0;
  for (int64_t b = 0; b < bsz; ++b) unprocessed += items[b].pending ? 1 : 0;
  int64_t before = 0;  // tokens of the earlier items, with their full proposals
  bool capped = false;
  for (int64_t b = 0; b < bsz; ++b) {
    const NgramItem& item = items[b];
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

}  // namespace cpu
}  // namespace fdmtp

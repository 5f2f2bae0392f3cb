#include "ngram_common.h"

#include <algorithm>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fdmtp {
namespace cpu {
namespace {

int64_t FindNextScalar(const int64_t* hay, int64_t from, int64_t end, int64_t value) {
  for (int64_t i = from; i < end; ++i) {
    if (hay[i] == value) return i;
  }
  return end;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FDMTP_NGRAM_X86 1
// First e in [from, end) with hay[e] == value, else end; 8 tokens per step. SSE2 (the
// x86-64 baseline) has no 64-bit compare: equal 64-bit lanes are those whose two 32-bit
// halves both compare equal.
int64_t FindNextSse2(const int64_t* hay, int64_t from, int64_t end, int64_t value) {
  const __m128i v = _mm_set1_epi64x(value);
  int64_t i = from;
  for (; i + 8 <= end; i += 8) {
    const __m128i* p = reinterpret_cast<const __m128i*>(hay + i);
    __m128i acc = _mm_setzero_si128();
    for (int k = 0; k < 4; ++k) {
      const __m128i c = _mm_cmpeq_epi32(_mm_loadu_si128(p + k), v);
      acc = _mm_or_si128(acc, _mm_and_si128(c, _mm_shuffle_epi32(c, _MM_SHUFFLE(2, 3, 0, 1))));
    }
    if (_mm_movemask_epi8(acc) != 0) break;
  }
  return FindNextScalar(hay, i, end, value);
}

// The same with AVX2, 16 tokens per step; used when the CPU has AVX2.
__attribute__((target("avx2"))) int64_t FindNextAvx2(const int64_t* hay, int64_t from,
                                                     int64_t end, int64_t value) {
  const __m256i v = _mm256_set1_epi64x(value);
  int64_t i = from;
  for (; i + 16 <= end; i += 16) {
    const __m256i* p = reinterpret_cast<const __m256i*>(hay + i);
    const __m256i a = _mm256_or_si256(_mm256_cmpeq_epi64(_mm256_loadu_si256(p), v),
                                      _mm256_cmpeq_epi64(_mm256_loadu_si256(p + 1), v));
    const __m256i b = _mm256_or_si256(_mm256_cmpeq_epi64(_mm256_loadu_si256(p + 2), v),
                                      _mm256_cmpeq_epi64(_mm256_loadu_si256(p + 3), v));
    if (_mm256_movemask_epi8(_mm256_or_si256(a, b)) != 0) break;
  }
  return FindNextSse2(hay, i, end, value);
}
#endif

using FindNextFn = int64_t (*)(const int64_t*, int64_t, int64_t, int64_t);

// The fastest candidate filter this CPU supports (all return the same index).
FindNextFn PickFindNext() {
#if defined(FDMTP_NGRAM_X86)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") ? FindNextAvx2 : FindNextSse2;
#else
  return FindNextScalar;
#endif
}

// The running-maximum scan over match ends e in [0, positions): returns the first e at
// which L(e) reaches its final maximum, if that maximum exceeds `floor`; *best_len is
// updated to it. Stops early once L(e) == cap (nothing can beat it).
int64_t ScanHaystack(FindNextFn find_next, const int64_t* hay, int64_t positions,
                     const NgramItem& item, int64_t cap, int64_t* best_len) {
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

NgramProposal ProposeItem(FindNextFn find_next, const NgramItem& item, int max_n, int min_n) {
  const int64_t cap = NgramMaxN(item, max_n);
  if (!item.active || item.budget <= 0 || cap < min_n) {
    return NgramMakeProposal(item, kNgramSourceNone, 0, 0);
  }
  // Matches must leave at least one token after them: ends e <= hay_len - 2.
  int64_t best_len = min_n - 1;
  const int64_t prompt_end = ScanHaystack(find_next, item.prompt, item.prompt_len - 1, item, cap,
                                             &best_len);
  if (best_len < cap) {
    const int64_t history_end = ScanHaystack(find_next, item.history, item.step - 1, item, cap,
                                                &best_len);
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
  const FindNextFn find_next = PickFindNext();
  auto run = [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      proposals[b] = ProposeItem(find_next, items[b], max_n, min_n);
    }
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

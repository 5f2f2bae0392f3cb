#include "ngram_cpu.h"

#include <algorithm>
#include <system_error>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fdmtp {
namespace cpu {
namespace {

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
  return NgramFindNextScalar(hay, i, end, value);
}

// The same with AVX2, 16 tokens per step; used when the CPU has AVX2.
__attribute__((target("avx2"))) int64_t FindNextAvx2(const int64_t* hay, int64_t from, int64_t end,
                                                     int64_t value) {
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
  return NgramFindNextScalar;
#endif
}

// Automatic thread count: one thread per this many haystack tokens (about a millisecond
// of scanning), so that thread start-up and scheduling delays stay small beside the work.
constexpr int64_t kTokensPerThread = 1 << 22;

}  // namespace

void NgramPropose(const NgramItem* items, int64_t bsz, int max_n, int min_n, int num_threads,
                  NgramProposal* proposals) {
  std::vector<int64_t> work_before(static_cast<std::size_t>(bsz) + 1, 0);
  for (int64_t b = 0; b < bsz; ++b) {
    const int64_t work =
        items[b].active ? items[b].prompt_len + std::max<int64_t>(items[b].step, 0) : 0;
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
      proposals[b] = NgramProposeItem(find_next, items[b], max_n, min_n);
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
    bounds[t] =
        std::lower_bound(work_before.begin(), work_before.end(), target) - work_before.begin();
    bounds[t] = std::max(bounds[t - 1], std::min(bounds[t], bsz));
  }
  // A worker thread that cannot be created (std::system_error: a pid or address-space
  // limit) is not an error: its chunk, and every later one, runs on the calling thread.
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads) - 1);
  int64_t spawned_until = 1;  // chunks [1, spawned_until) run on worker threads
  try {
    for (; spawned_until < threads; ++spawned_until) {
      pool.emplace_back(run, bounds[spawned_until], bounds[spawned_until + 1]);
    }
  } catch (const std::system_error&) {
  }
  run(bounds[0], bounds[1]);
  for (int64_t t = spawned_until; t < threads; ++t) run(bounds[t], bounds[t + 1]);
  for (std::thread& th : pool) th.join();
}

void NgramCap(const NgramItem* items, const NgramProposal* proposals, int64_t bsz,
              int64_t threshold, int32_t* counts) {
  NgramCapBatch([items](int64_t b) { return items[b]; }, proposals, bsz, threshold, counts);
}

}  // namespace cpu
}  // namespace fdmtp

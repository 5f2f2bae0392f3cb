// CUDA driver of the two n-gram ops (see fdmtp/ngram_common.h for the three phases):
//   ProposeKernel  one block per item (grid-stride over items): the running-maximum scan,
//                  tiles of the haystack in order, a packed atomicMax per tile, early exit;
//   CapKernel      one block, in batch order: block-wide prefix sums of the uncapped
//                  token counts and of the active items, then the first item that does
//                  not fit (the closed form of upstream's serial threshold loop);
//   WriteKernel    one thread per item: tokens and seq_lens_this_time.
// Scratch (NgramWorkspaceBytes) comes from the caller. No host sync, no allocation, any
// batch size, same results as the CPU driver.
#pragma once

#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace ngram {

constexpr int kProposeThreads = 256;
constexpr int kCapThreads = 1024;
constexpr int kEndBits = 48;  // match ends below 2^48; the length sits above them
constexpr unsigned long long kEndMask = (1ULL << kEndBits) - 1;
// A match length is at most max_ngram_size <= kMaxNgramSize (checked on the host), so it
// fits in the 16 bits above the end.
static_assert(kMaxNgramSize < (1 << (64 - kEndBits)), "n-gram key: the length needs 16 bits");

struct Workspace {
  NgramProposal* proposals;  // [bsz]
  int32_t* counts;           // [bsz]
};

inline size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

inline Workspace Carve(void* base, int64_t bsz) {
  char* p = static_cast<char*>(base);
  Workspace ws;
  ws.proposals = reinterpret_cast<NgramProposal*>(p);
  ws.counts = reinterpret_cast<int32_t*>(p + AlignUp(sizeof(NgramProposal) * bsz));
  return ws;
}

inline size_t WorkspaceBytes(int64_t bsz) {
  return AlignUp(sizeof(NgramProposal) * bsz) + AlignUp(sizeof(int32_t) * bsz);
}

// Block-wide running-maximum scan of one haystack over match ends [0, positions).
// Returns the first end reaching the final maximum if it exceeds *best_len (updated).
__device__ inline int64_t ScanHaystack(const int64_t* hay, int64_t positions, const NgramItem& item,
                                       int64_t cap, int64_t* best_len, unsigned long long* key) {
  const int64_t last = item.history[item.step];
  const int64_t floor = *best_len;
  if (threadIdx.x == 0) *key = 0;
  __syncthreads();
  for (int64_t tile = 0; tile < positions; tile += blockDim.x) {
    const int64_t e = tile + threadIdx.x;
    if (e < positions && hay[e] == last) {
      const int64_t len = NgramMatchLength(hay, e, item.history, item.step, cap);
      if (len > floor) {
        // larger length wins; for equal lengths the smaller end
        atomicMax(key, (static_cast<unsigned long long>(len) << kEndBits) |
                           (kEndMask - static_cast<unsigned long long>(e)));
      }
    }
    __syncthreads();
    const bool done = static_cast<int64_t>(*key >> kEndBits) == cap;
    __syncthreads();  // every thread has read *key before the next tile's atomics
    if (done) break;
  }
  const unsigned long long found = *key;
  __syncthreads();  // *key is reused by the next scan
  if (found == 0) return -1;
  *best_len = static_cast<int64_t>(found >> kEndBits);
  return static_cast<int64_t>(kEndMask - (found & kEndMask));
}

template <typename Op>
__global__ void ProposeKernel(typename Op::Args args, int64_t bsz, int max_n, int min_n,
                              Workspace ws) {
  __shared__ unsigned long long key;
  for (int64_t b = blockIdx.x; b < bsz; b += gridDim.x) {
    const NgramItem item = Op::Item(args, b);
    const int64_t cap = NgramMaxN(item, max_n);
    NgramProposal p = NgramMakeProposal(item, kNgramSourceNone, 0, 0);
    if (item.active && item.budget > 0 && cap >= min_n) {  // uniform over the block
      int64_t best_len = min_n - 1;
      const int64_t prompt_end =
          ScanHaystack(item.prompt, item.prompt_len - 1, item, cap, &best_len, &key);
      int64_t history_end = -1;
      if (best_len < cap) {
        history_end = ScanHaystack(item.history, item.step - 1, item, cap, &best_len, &key);
      }
      if (history_end >= 0) {
        p = NgramMakeProposal(item, kNgramSourceHistory, history_end, item.step);
      } else if (prompt_end >= 0) {
        p = NgramMakeProposal(item, kNgramSourcePrompt, prompt_end, item.prompt_len);
      }
    }
    if (threadIdx.x == 0) ws.proposals[b] = p;
  }
}

template <typename Op>
__global__ void CapKernel(typename Op::Args args, int64_t bsz, int64_t threshold, Workspace ws) {
  __shared__ int64_t first_capped;
  int64_t pending = 0;
  for (int64_t b = threadIdx.x; b < bsz; b += blockDim.x) {
    pending += Op::Item(args, b).pending ? 1 : 0;
  }
  int64_t unprocessed_start = 0;
  BlockExclusiveSum(pending, &unprocessed_start);

  int64_t tokens_before = 0;  // uncapped tokens of the earlier tiles
  int64_t active_before = 0;  // active items of the earlier tiles
  bool capped = false;
  for (int64_t tile = 0; tile < bsz; tile += blockDim.x) {
    const int64_t b = tile + threadIdx.x;
    NgramItem item;
    NgramProposal p = NgramMakeProposal(item, kNgramSourceNone, 0, 0);
    if (b < bsz) {
      item = Op::Item(args, b);
      p = ws.proposals[b];
    }
    const int64_t mine = NgramBaseForSum(item) + (item.active ? p.count : 0);
    int64_t tile_tokens = 0, tile_active = 0;
    const int64_t tokens = tokens_before + BlockExclusiveSum(mine, &tile_tokens);
    const int64_t active_upto = active_before +
                                BlockExclusiveSum(item.active ? 1 : 0, &tile_active) +
                                (item.active ? 1 : 0);
    int32_t count = 0;
    bool violates = false;
    if (b < bsz && !capped) {
      violates = NgramCapItem(item, p, threshold, tokens + NgramBaseForSum(item),
                              unprocessed_start - active_upto, &count);
    }
    if (threadIdx.x == 0) first_capped = bsz;
    __syncthreads();
    if (violates)
      atomicMin(reinterpret_cast<unsigned long long*>(&first_capped),
                static_cast<unsigned long long>(b));
    __syncthreads();
    const int64_t first = first_capped;
    if (b < bsz) ws.counts[b] = (capped || b > first) ? 0 : count;
    capped = capped || first < bsz;
    tokens_before += tile_tokens;
    active_before += tile_active;
    __syncthreads();  // first_capped is reset by the next tile
  }
}

template <typename Op>
__global__ void WriteKernel(typename Op::Args args, int64_t bsz, Workspace ws) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < bsz;
       b += stride) {
    Op::Write(args, b, Op::Item(args, b), ws.proposals[b], ws.counts[b]);
  }
}

template <typename Op>
int LaunchAll(const typename Op::Args& args, int64_t bsz, int max_n, int min_n, int64_t threshold,
              void* workspace, Stream stream) {
  if (bsz == 0) return cudaSuccess;
  const Workspace ws = Carve(workspace, bsz);
  const cudaStream_t s = AsCudaStream(stream);
  const int propose_blocks = static_cast<int>(bsz < kMaxBlocks ? bsz : kMaxBlocks);
  FDMTP_CUDA_CALL(cuda::Launch<ProposeKernel<Op>>(propose_blocks, kProposeThreads, 0, s, args, bsz,
                                                  max_n, min_n, ws));
  // CapKernel's block sum (BlockExclusiveSum above) needs exactly kCapThreads threads.
  FDMTP_CUDA_CALL(
      cuda::LaunchFixedBlock<CapKernel<Op>>(1, kCapThreads, 0, s, args, bsz, threshold, ws));
  FDMTP_CUDA_CALL(
      cuda::Launch<WriteKernel<Op>>(BlocksFor(bsz), kThreadsPerBlock, 0, s, args, bsz, ws));
  return cudaSuccess;
}

}  // namespace ngram
}  // namespace cuda
}  // namespace fdmtp

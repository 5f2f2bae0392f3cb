// Helpers for the CUDA launchers: error propagation and grid sizing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

// Evaluates a CUDA runtime call and returns its error code from the enclosing launcher.
#define FDMTP_CUDA_CALL(expr)                 \
  do {                                        \
    const cudaError_t fdmtp_status_ = (expr); \
    if (fdmtp_status_ != cudaSuccess) {       \
      return static_cast<int>(fdmtp_status_); \
    }                                         \
  } while (0)

namespace fdmtp {
namespace cuda {

constexpr int kThreadsPerBlock = 256;
// Grid-stride loops cover any item count; the grid is capped so launch sizes stay sane.
constexpr int64_t kMaxBlocks = 65535;

inline int BlocksFor(int64_t items) {
  const int64_t blocks = (items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<int>(std::max<int64_t>(1, std::min(blocks, kMaxBlocks)));
}

inline cudaStream_t AsCudaStream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Single-block kernels that walk the batch in chunks of kScanThreads items (so they work
// for any batch size and keep a running carry across chunks) use this block size.
constexpr int kScanThreads = 1024;

// Exclusive prefix sum of `value` over the threads of the block (blockDim.x a multiple of
// 32, every thread calls it). `*block_total` receives the sum over the block. Contains
// __syncthreads(); deterministic (integer adds in a fixed order).
__device__ inline int64_t BlockExclusiveSum(int64_t value, int64_t* block_total) {
  __shared__ int64_t warp_sums[32];
  __shared__ int64_t total;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  int64_t inclusive = value;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int64_t up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int64_t mine = lane < num_warps ? warp_sums[lane] : 0;
    int64_t scan = mine;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int64_t up = __shfl_up_sync(0xffffffffu, scan, offset);
      if (lane >= offset) scan += up;
    }
    if (lane < num_warps) warp_sums[lane] = scan - mine;  // exclusive over warps
    if (lane == 31) total = scan;
  }
  __syncthreads();
  const int64_t result = warp_sums[warp] + inclusive - value;
  *block_total = total;
  __syncthreads();  // the shared slots may be reused by the next call
  return result;
}

}  // namespace cuda
}  // namespace fdmtp

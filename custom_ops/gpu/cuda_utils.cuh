// Helpers for the CUDA launchers: error propagation, grid sizing and the launch call.
// With FDMTP_CUDA_EMULATOR the same sources compile with the host compiler against the CUDA
// emulator (emu/cuda_emu.h) instead of the CUDA runtime.
#pragma once

#if defined(FDMTP_CUDA_EMULATOR)
#include "emu/cuda_emu.h"
#else
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdint>

// Evaluates a CUDA runtime call and returns its error code from the enclosing launcher.
// (Variadic so that a template argument list's commas can appear in the call.)
#define FDMTP_CUDA_CALL(...)                         \
  do {                                               \
    const cudaError_t fdmtp_status_ = (__VA_ARGS__); \
    if (fdmtp_status_ != cudaSuccess) {              \
      return static_cast<int>(fdmtp_status_);        \
    }                                                \
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

// A kernel's dynamic shared memory (the launch's `smem` bytes) as `T* name`.
#if defined(FDMTP_CUDA_EMULATOR)
#define FDMTP_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::cuda_emu_rt::DynamicShared())
#else
#define FDMTP_DYNAMIC_SHARED(T, name)                      \
  extern __shared__ __align__(16) unsigned char name##_[]; \
  T* name = reinterpret_cast<T*>(name##_)
#endif

// Launches Kernel<<<grid, block, smem, stream>>>(args...) and returns cudaGetLastError().
// Under the emulator the launch runs on the CPU with its checks, and the emulator may
// launch the kernel with a smaller block and grid than asked (its second launch shape):
// kernels written for any launch shape (grid-stride and chunk loops over blockDim) must
// give the same results. LaunchFixedBlock keeps the block size for kernels that need
// exactly that many threads.
template <auto Kernel, typename... A>
cudaError_t Launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A... args) {
#if defined(FDMTP_CUDA_EMULATOR)
  (void)stream;
  return static_cast<cudaError_t>(
      cuda_emu_rt::LaunchKernel<Kernel>(__PRETTY_FUNCTION__, grid, block, smem, 0, args...));
#else
  // clang-format off
  Kernel<<<grid, block, smem, stream>>>(args...);
  // clang-format on
  return cudaGetLastError();
#endif
}

template <auto Kernel, typename... A>
cudaError_t LaunchFixedBlock(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A... args) {
#if defined(FDMTP_CUDA_EMULATOR)
  (void)stream;
  return static_cast<cudaError_t>(cuda_emu_rt::LaunchKernel<Kernel>(
      __PRETTY_FUNCTION__, grid, block, smem, cuda_emu_rt::kFixedBlock, args...));
#else
  return Launch<Kernel>(grid, block, smem, stream, args...);
#endif
}

// One thread per item b in [0, n), grid-stride so that any n is covered: Item(args..., b).
template <auto Item, typename... A>
__global__ void PerItemKernel(int64_t n, A... args) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < n;
       b += stride) {
    Item(args..., b);
  }
}

// Launches PerItemKernel<Item> over n items on `stream`; nothing when n == 0. Returns the
// cudaError_t as an int, as the op launchers do.
template <auto Item, typename... A>
int LaunchPerItem(int64_t n, void* stream, A... args) {
  if (n == 0) return cudaSuccess;
  FDMTP_CUDA_CALL(Launch<PerItemKernel<Item, A...>>(BlocksFor(n), kThreadsPerBlock, 0,
                                                    AsCudaStream(stream), n, args...));
  return cudaSuccess;
}

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

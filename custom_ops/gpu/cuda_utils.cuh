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

}  // namespace cuda
}  // namespace fdmtp

// Framework-free basics shared by every backend (CPU, CUDA, XPU emulator and the
// real Kunlun toolchain): the host/device qualifier and the sentinels used by the ops.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FDMTP_HOST_DEVICE __host__ __device__
#else
#define FDMTP_HOST_DEVICE
#endif

namespace fdmtp {

// A draft slot that holds no token. Every op treats it as "empty", wherever it stands
// in the row (see draft_model_postprocess: holes in the middle of a row are skipped,
// not treated as the end of the row).
constexpr int64_t kPlaceholderToken = -1;

}  // namespace fdmtp

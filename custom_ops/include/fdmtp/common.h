// Framework-free basics shared by every backend (CPU, CUDA, XPU emulator and the
// real Kunlun toolchain): the host/device qualifier, the shared constants (kPlaceholderToken: a
// draft slot that holds no token, wherever it stands in the row) and helpers used by several ops.
#pragma once

#include <cstdint>

#include "fdmtp/constants.h"  // generated from custom_ops/ops/constants.toml

#if defined(__CUDACC__)
#define FDMTP_HOST_DEVICE __host__ __device__
#else
#define FDMTP_HOST_DEVICE
#endif

namespace fdmtp {

// True when `token` is one of the `num_end_tokens` EOS ids (a linear scan, as upstream's
// is_in_end). Shared by verify_draft_tokens and unified_update_model_status so both ops
// make the same stop decision.
FDMTP_HOST_DEVICE inline bool IsEndToken(int64_t token, const int64_t* end_tokens,
                                         int64_t num_end_tokens) {
  for (int64_t e = 0; e < num_end_tokens; ++e) {
    if (end_tokens[e] == token) return true;
  }
  return false;
}

}  // namespace fdmtp

// Framework-free basics shared by every backend (CPU, CUDA, XPU emulator and the
// real Kunlun toolchain): the host/device qualifier, the shared constants (kPlaceholderToken: a
// draft slot that holds no token, wherever it stands in the row) and helpers used by several ops.
#pragma once

#include <cstdint>

#include "fdmtp/constants.h"  // generated from custom_ops/ops/constants.toml

// Qualifiers of the shared per-item logic and of the global-memory pointers it reads:
//   FDMTP_HOST_DEVICE  `__host__ __device__` for nvcc, `__device__` in XPU device code (the
//                      Kunlun XTDK compile defines __XPU3__; the emulated .xpu compile
//                      defines FDMTP_XPU_DEVICE_CODE), nothing for host compilers;
//   FDMTP_GM           `__global_ptr__` in XPU device code, nothing elsewhere: on XPU an
//                      unqualified pointer is local memory, so every pointer to a tensor
//                      (the Args structs' fields, helper parameters that receive them)
//                      carries it. The emulator makes it a distinct qualified type, so
//                      dropping it does not compile there either (xpu/emu/kp_emu.h).
#if defined(__CUDACC__)
#define FDMTP_HOST_DEVICE __host__ __device__
#define FDMTP_GM
#elif defined(__XPU3__) || defined(FDMTP_XPU_DEVICE_CODE)
#define FDMTP_HOST_DEVICE __device__
#define FDMTP_GM __global_ptr__
#else
#define FDMTP_HOST_DEVICE
#define FDMTP_GM
#endif

namespace fdmtp {

// True when `token` is one of the `num_end_tokens` EOS ids (a linear scan, as upstream's
// is_in_end). Shared by verify_draft_tokens and unified_update_model_status so both ops
// make the same stop decision.
FDMTP_HOST_DEVICE inline bool IsEndToken(int64_t token, FDMTP_GM const int64_t* end_tokens,
                                         int64_t num_end_tokens) {
  for (int64_t e = 0; e < num_end_tokens; ++e) {
    if (end_tokens[e] == token) return true;
  }
  return false;
}

}  // namespace fdmtp

namespace fdmtp {

// Overflow-proof arithmetic for values read from tensors (lengths, steps, offsets), whose
// range the host does not check: sums and differences saturate at the int64 limits instead
// of wrapping (signed overflow is undefined behaviour), and a 64-bit value stored into an
// int32 output saturates at the int32 limits. Literal limits, so the helpers compile
// unchanged for the host, CUDA device code and the XPU3 toolchain.
constexpr int64_t kInt64Max = 0x7fffffffffffffffLL;
constexpr int64_t kInt64Min = -kInt64Max - 1;
constexpr int64_t kInt32Max = 0x7fffffff;
constexpr int64_t kInt32Min = -kInt32Max - 1;

// a + b saturated to the int64 range: the comparison comes before the addition.
FDMTP_HOST_DEVICE inline int64_t SatAdd(int64_t a, int64_t b) {
  if (b > 0 && a > kInt64Max - b) return kInt64Max;
  if (b < 0 && a < kInt64Min - b) return kInt64Min;
  return a + b;
}

// a - b saturated to the int64 range.
FDMTP_HOST_DEVICE inline int64_t SatSub(int64_t a, int64_t b) {
  if (b < 0 && a > kInt64Max + b) return kInt64Max;
  if (b > 0 && a < kInt64Min + b) return kInt64Min;
  return a - b;
}

// v clamped to [lo, hi] (lo <= hi).
FDMTP_HOST_DEVICE inline int64_t ClampTo(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// v saturated to the int32 range (for int32 outputs computed in 64 bits).
FDMTP_HOST_DEVICE inline int32_t SatInt32(int64_t v) {
  return static_cast<int32_t>(ClampTo(v, kInt32Min, kInt32Max));
}

// A length or count read from an int32 tensor, clamped to [0, INT32_MAX]: a negative value
// counts as 0. Values are clamped, never checked, the same way on every backend (a device
// kernel cannot check them without a host sync).
FDMTP_HOST_DEVICE inline int64_t NonNegative(int32_t v) { return v > 0 ? v : 0; }

}  // namespace fdmtp

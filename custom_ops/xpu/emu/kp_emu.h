// An emulator of the subset of the Kunlun KP programming model that our XPU3 kernels use,
// so every kernel/*.xpu source compiles with g++ (-DFDMTP_XPU_EMULATOR) and runs on the
// CPU in tests. Kernels must use only what is listed here:
//
//   qualifiers   __global__ (kernel), __device__, __global_ptr__ (global-memory pointer,
//                no-op here), __local__ (local memory: an automatic array of the running
//                core), __shared__ (shared memory of the running cluster; a function-local
//                static here, which is sound because clusters run one after another)
//   ids          cluster_id(), cluster_num(), core_id(), core_num()
//   memory       GM2LM(gm_src, lm_dst, bytes), LM2GM(lm_src, gm_dst, bytes), mfence()
//   barrier      sync_cluster(): every core of the cluster waits for the others
//   launch       FDMTP_XPU_LAUNCH(ctx, kernel, args...) in the wrappers, which is
//                `kernel<<<clusters, cores, stream>>>(args...)` on the real toolchain
//
// Checks (a failed check aborts the launch with an error naming the kernel; the wrapper
// returns it and the op raises, so a test sees it instead of corrupted memory):
//   * GM2LM / LM2GM: the local side must be a __local__ object of the running core (an
//     array named directly, or the address of a scalar), and `bytes` must not exceed its
//     size: copying past a local buffer is an error, not a silent overwrite. The global
//     side must not be local memory.
//   * The local arrays of a kernel must fit in fdmtp::xpu::kLocalMemBytes: kernels state
//     their LM and SM use with static_assert against xpu_limits.h, so an oversized buffer does
//     not compile (on the real compiler as here).
//   * sync_cluster(): a core that returns while other cores of its cluster wait at a
//     barrier (a deadlock on hardware) is an error.
//   * Launch shape: 1 <= clusters, 1 <= cores <= kMaxCoresPerCluster.
//
// Scheduling: cooperative and deterministic. The cores of one cluster run as ucontext
// coroutines on one thread, each on its own stack, one at a time from the last core to the
// first; sync_cluster() switches to the next core. Clusters run one after another. Launches
// are serialised process-wide (shared memory is static storage). What this does not model:
// timing, memory bandwidth, data races between clusters, the real compiler's code
// generation (see docs/architecture.md "XPU backend").
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#include "xpu/xpu_limits.h"

#define __global__
#define __device__
#define __global_ptr__
#define __local__
#define __shared__ static

namespace fdmtp {
namespace xpu_emu {

int ClusterId();
int ClusterNum();
int CoreId();
int CoreNum();
void SyncCluster();
// True when [p, p + bytes) lies in the running core's local memory (its stack).
bool IsLocal(const void* p, int64_t bytes);
// Aborts the running launch with `message` (throws inside the core; the launch reports it).
[[noreturn]] void Fault(const std::string& message);

// Runs `body` on clusters x cores emulated cores. Returns 0, or 1 with *error set.
int Launch(int clusters, int cores, const char* kernel, const std::function<void()>& body,
           std::string* error);

template <typename L>
void CheckLocal(const char* what, L&& local, int64_t bytes) {
  using R = std::remove_reference_t<L>;
  int64_t size = 0;
  const void* p = nullptr;
  if constexpr (std::is_array_v<R>) {
    size = static_cast<int64_t>(sizeof(R));
    p = static_cast<const void*>(local);
  } else {
    static_assert(std::is_pointer_v<R>, "the local side must be a __local__ array or &scalar");
    using E = std::remove_pointer_t<R>;
    static_assert(!std::is_void_v<E>,
                  "name the __local__ buffer, not a void*, so its size is known");
    size = static_cast<int64_t>(sizeof(E));
    p = static_cast<const void*>(local);
  }
  if (bytes < 0 || bytes > size) {
    Fault(std::string(what) + ": " + std::to_string(bytes) + " bytes do not fit the " +
          std::to_string(size) + "-byte local buffer (local memory overflow)");
  }
  if (!IsLocal(p, bytes)) Fault(std::string(what) + ": the local-side pointer is not local memory");
}

}  // namespace xpu_emu
}  // namespace fdmtp

inline int cluster_id() { return fdmtp::xpu_emu::ClusterId(); }
inline int cluster_num() { return fdmtp::xpu_emu::ClusterNum(); }
inline int core_id() { return fdmtp::xpu_emu::CoreId(); }
inline int core_num() { return fdmtp::xpu_emu::CoreNum(); }
inline void sync_cluster() { fdmtp::xpu_emu::SyncCluster(); }
inline void mfence() {}

template <typename L>
inline void GM2LM(const void* gm_src, L&& lm_dst, int64_t bytes) {
  fdmtp::xpu_emu::CheckLocal("GM2LM", lm_dst, bytes);
  if (fdmtp::xpu_emu::IsLocal(gm_src, 1))
    fdmtp::xpu_emu::Fault("GM2LM: the source is local memory");
  if (bytes > 0) std::memcpy(static_cast<void*>(lm_dst), gm_src, static_cast<size_t>(bytes));
}

template <typename L>
inline void LM2GM(L&& lm_src, void* gm_dst, int64_t bytes) {
  fdmtp::xpu_emu::CheckLocal("LM2GM", lm_src, bytes);
  if (fdmtp::xpu_emu::IsLocal(gm_dst, 1))
    fdmtp::xpu_emu::Fault("LM2GM: the destination is local memory");
  if (bytes > 0) std::memcpy(gm_dst, static_cast<const void*>(lm_src), static_cast<size_t>(bytes));
}

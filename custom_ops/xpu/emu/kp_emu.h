// An emulator of the subset of the Kunlun KP programming model (XTDK dialect) that our XPU3
// kernels use, so every kernel/*.xpu source compiles with g++ and runs on the CPU in tests.
// Kernels must use only what is listed here:
//
//   qualifiers   __global__ (kernel), __device__ (device helper), __global_ptr__ (pointer to
//                global memory), __local__ (local memory: an automatic object of the running
//                core), __shared__ (shared memory of the running cluster)
//   ids          cluster_id(), cluster_num(), core_id(), core_num()
//   memory       GM2LM(gm_src, lm_dst, bytes), LM2GM(lm_src, gm_dst, bytes), mfence()
//   barrier      sync_cluster(): every core of the cluster waits for the others
//   launch       FDMTP_XPU_LAUNCH(op, ctx, kernel, args...) in the wrappers, which is
//                `kernel<<<clusters, cores, stream>>>(args...)` on the real toolchain
//
// The emulated kernel units are compiled as XPU device code: -DFDMTP_XPU_DEVICE_CODE (so
// fdmtp/common.h gives the shared per-item logic its XPU qualifiers) and -Dfdmtp=fdmtp_xpuemu
// (so those qualified copies of the Args structs and per-item functions are distinct from
// the CPU build's in the same library). What the dialect rules become here:
//
// Compile time (g++):
//   * __global_ptr__ is `volatile`: a distinct qualified pointer type. Storing or passing a
//     global-memory pointer as an unqualified (local-memory) pointer drops the qualifier,
//     which does not compile; GM2LM/LM2GM take the global side as a __global_ptr__.
//   * Kernel parameters (FDMTP_XPU_EMU_ENTRY) must be arithmetic values, __global_ptr__
//     pointers, or structs whose every field is one of those (checked field by field by
//     aggregate initialisation): a struct with an unqualified pointer does not compile.
//   * What types cannot express (lambdas, function pointers, standard-library calls in
//     device code) is checked by xpu/emu/xtdk_lint.py, run by CMake on every kernel source.
//
// Run time (a failed check aborts the launch with an error naming the kernel; the wrapper
// returns it and the op raises, so a test sees it instead of corrupted memory):
//   * GM2LM / LM2GM: the local side must be a __local__ object of the running core (an
//     array named directly, or the address of a scalar), and `bytes` must not exceed its
//     size. The global side must not be local memory.
//   * Every load and store of a kernel unit is observed (emu_common/access_hooks.h, when the
//     build has FDMTP_EMU_CHECK_ACCESSES): an access to another core's local memory is a fault;
//     a core that wrote shared memory and reaches sync_cluster() without mfence() is a fault.
//   * Local memory: each core's stack high-water mark (its __local__ objects, by-value
//     structs and the frames of the helpers it calls) must stay within kLocalMemBytes plus
//     kHostFrameAllowance (kp_emu.cc) for the host frames the emulator itself adds.
//   * sync_cluster(): a core that returns while other cores of its cluster wait at a
//     barrier (a deadlock on hardware) is an error.
//   * Launch shape: 1 <= clusters, 1 <= cores <= kMaxCoresPerCluster.
//
// Scheduling: all cores of all clusters are ucontext coroutines on one thread, run in an
// order drawn from a PRNG seeded by the kernel name and launch shape (deterministic), and
// switched at every KP intrinsic and every few dozen memory accesses, so ordering bugs
// between cores and clusters show as differences between launch shapes. Each cluster has
// its own shared memory (the statics of __shared__ declarations live in one linker section,
// whose touched blocks are swapped per cluster). What this does not model: timing, the
// memory model's reorderings (mfence is checked, not needed), the real compiler's code
// generation (see docs/architecture.md "XPU backend").
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "xpu/emu/kp_launch.h"
#include "xpu/xpu_limits.h"

#define __global__
#define __device__
#define __global_ptr__ volatile
#define __local__
#define __shared__ static __attribute__((section("fdmtp_xpu_sm")))

namespace fdmtp_kpemu {

int ClusterId();
int ClusterNum();
int CoreId();
int CoreNum();
void SyncCluster();
void Mfence();
// A KP intrinsic ran: the scheduler may switch to another core here.
void Intrinsic();
// True when [p, p + bytes) lies in the running core's local memory (its stack).
bool IsLocal(const volatile void* p, int64_t bytes);
// Aborts the running launch with `message` (the core stops; the launch reports it).
[[noreturn]] void Fault(const std::string& message);

template <typename L>
void CheckLocal(const char* what, L&& local, int64_t bytes) {
  using R = std::remove_reference_t<L>;
  int64_t size = 0;
  if constexpr (std::is_array_v<R>) {
    size = static_cast<int64_t>(sizeof(R));
  } else {
    static_assert(std::is_pointer_v<R>, "the local side must be a __local__ array or &scalar");
    using E = std::remove_pointer_t<R>;
    static_assert(!std::is_void_v<E>,
                  "name the __local__ buffer, not a void*, so its size is known");
    static_assert(!std::is_volatile_v<E>,
                  "the local side of GM2LM/LM2GM is a __global_ptr__ (global memory)");
    size = static_cast<int64_t>(sizeof(E));
  }
  if (bytes < 0 || bytes > size) {
    Fault(std::string(what) + ": " + std::to_string(bytes) + " bytes do not fit the " +
          std::to_string(size) + "-byte local buffer (local memory overflow)");
  }
  if (!IsLocal(local, bytes))
    Fault(std::string(what) + ": the local-side pointer is not local memory");
}

// ---- kernel parameters --------------------------------------------------------------------
// A value that converts to any type (counts an aggregate's fields).
struct AnyField {
  template <typename T>
  operator T() const;  // unevaluated only
};

template <typename T, typename = void>
struct IsKernelValue;

// A value that converts only to the types a kernel may receive.
struct KernelField {
  template <typename T, std::enable_if_t<IsKernelValue<T>::value, int> = 0>
  operator T() const;  // unevaluated only
};

template <typename T, typename Seq, typename = void>
struct InitsFrom : std::false_type {};
template <typename T, size_t... I>
struct InitsFrom<T, std::index_sequence<I...>,
                 std::void_t<decltype(T{(static_cast<void>(I), AnyField{})...})>> : std::true_type {
};
template <typename T, typename Seq, typename = void>
struct InitsFromKernelFields : std::false_type {};
template <typename T, size_t... I>
struct InitsFromKernelFields<T, std::index_sequence<I...>,
                             std::void_t<decltype(T{(static_cast<void>(I), KernelField{})...})>>
    : std::true_type {};

template <typename T, size_t N = 0>
constexpr size_t FieldCount() {
  if constexpr (N < 64 && InitsFrom<T, std::make_index_sequence<N + 1>>::value) {
    return FieldCount<T, N + 1>();
  } else {
    return N;
  }
}

template <typename T>
struct IsKernelValue<T, std::enable_if_t<std::is_arithmetic_v<T> || std::is_enum_v<T>>>
    : std::true_type {};
template <typename T>
struct IsKernelValue<T, std::enable_if_t<std::is_pointer_v<T>>>
    : std::bool_constant<std::is_volatile_v<std::remove_pointer_t<T>>> {};
template <typename T>
struct IsKernelValue<T, std::enable_if_t<std::is_class_v<T>>>
    : std::bool_constant<
          std::is_aggregate_v<T> && std::is_trivially_copyable_v<T> &&
          InitsFromKernelFields<T, std::make_index_sequence<FieldCount<T>()>>::value> {};
template <typename T>
struct IsKernelValue<T, std::enable_if_t<!std::is_arithmetic_v<T> && !std::is_enum_v<T> &&
                                         !std::is_pointer_v<T> && !std::is_class_v<T>>>
    : std::false_type {};

template <typename... P, size_t... I>
int LaunchKernel(const KernelParams& p, const char* name, void (*kernel)(P...),
                 std::index_sequence<I...>) {
  static_assert((IsKernelValue<std::decay_t<P>>::value && ...),
                "dialect rule gm-pointer: an XPU kernel parameter must be an arithmetic value, a "
                "__global_ptr__ pointer, or a struct whose fields are all such values (an "
                "unqualified pointer in a kernel argument is local memory on XPU)");
  const std::string what = name;
  if (p.count != sizeof...(P)) {
    *p.error = "XPU kernel " + what + " (emulated): launched with " + std::to_string(p.count) +
               " arguments, it takes " + std::to_string(sizeof...(P));
    return 1;
  }
  const size_t sizes[] = {sizeof(std::decay_t<P>)..., 0};
  for (size_t i = 0; i < sizeof...(P); ++i) {
    if (p.sizes[i] != sizes[i]) {
      *p.error = "XPU kernel " + what + " (emulated): argument " + std::to_string(i) + " is " +
                 std::to_string(p.sizes[i]) + " bytes on the host, the kernel takes " +
                 std::to_string(sizes[i]);
      return 1;
    }
  }
  std::tuple<std::decay_t<P>...> values;
  (std::memcpy(static_cast<void*>(&std::get<I>(values)), p.values[I], sizes[I]), ...);
  return Launch(p.clusters, p.cores, name, [&] { std::apply(kernel, values); }, p.error);
}

template <typename... P>
int LaunchKernel(const KernelParams& p, const char* name, void (*kernel)(P...)) {
  return LaunchKernel(p, name, kernel, std::index_sequence_for<P...>{});
}

}  // namespace fdmtp_kpemu

// Defines the emulator entry of kernel fdmtp_xpu3::name (after its definition).
#define FDMTP_XPU_EMU_ENTRY(name)                                           \
  FDMTP_XPU_EMU_ENTRY_DECL(name);                                           \
  FDMTP_XPU_EMU_ENTRY_DECL(name) {                                          \
    return ::fdmtp_kpemu::LaunchKernel(params, #name, &::fdmtp_xpu3::name); \
  }

inline int cluster_id() { return fdmtp_kpemu::ClusterId(); }
inline int cluster_num() { return fdmtp_kpemu::ClusterNum(); }
inline int core_id() { return fdmtp_kpemu::CoreId(); }
inline int core_num() { return fdmtp_kpemu::CoreNum(); }
inline void sync_cluster() { fdmtp_kpemu::SyncCluster(); }
inline void mfence() { fdmtp_kpemu::Mfence(); }

template <typename L>
inline void GM2LM(__global_ptr__ const void* gm_src, L&& lm_dst, int64_t bytes) {
  fdmtp_kpemu::CheckLocal("GM2LM", lm_dst, bytes);
  if (fdmtp_kpemu::IsLocal(gm_src, 1)) fdmtp_kpemu::Fault("GM2LM: the source is local memory");
  if (bytes > 0) {
    std::memcpy(static_cast<void*>(lm_dst), const_cast<const void*>(gm_src),
                static_cast<size_t>(bytes));
  }
  fdmtp_kpemu::Intrinsic();
}

template <typename L>
inline void LM2GM(L&& lm_src, __global_ptr__ void* gm_dst, int64_t bytes) {
  fdmtp_kpemu::CheckLocal("LM2GM", lm_src, bytes);
  if (fdmtp_kpemu::IsLocal(gm_dst, 1)) fdmtp_kpemu::Fault("LM2GM: the destination is local memory");
  if (bytes > 0) {
    std::memcpy(const_cast<void*>(gm_dst), static_cast<const void*>(lm_src),
                static_cast<size_t>(bytes));
  }
  fdmtp_kpemu::Intrinsic();
}

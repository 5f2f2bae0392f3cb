// The CUDA emulator: what our .cu sources use of the CUDA language and runtime, for the
// host compiler, so that the same kernel sources run on the CPU (the `cuda-emu` backend).
// cuda_utils.cuh includes this header instead of <cuda_runtime.h> when FDMTP_CUDA_EMULATOR
// is defined; the emulated units are compiled as C++ with the namespace `fdmtp` renamed
// (so their copies of the shared per-item code do not merge with the CPU build's) and with
// every load and store instrumented (emu_common/access_hooks.h).
//
// Emulated: __global__/__device__/__host__ functions; threadIdx, blockIdx, blockDim,
// gridDim; static and dynamic (`extern __shared__`) shared memory; __syncthreads and its
// _or/_and/_count forms; the warp intrinsics __shfl_sync/_up/_down/_xor, __ballot_sync,
// __any_sync, __all_sync, __syncwarp, in lock-step with their masks; atomics on 32- and
// 64-bit integers (and atomicAdd on float); cudaMemsetAsync; launch limits.
//
// Each CUDA thread is a coroutine with its own stack; the threads of a block switch at
// barriers and warp intrinsics; blocks run one after another. A launch FAILS, with a
// message naming the kernel, the thread and the address, on:
//   * a shared-memory race: a byte written by one thread and read or written by another
//     with no __syncthreads() between (atomics only race with plain accesses), or a read
//     of shared memory no thread of the block has written;
//   * a barrier not reached by every thread of the block (some exited, or wait elsewhere);
//   * a warp intrinsic whose mask omits a lane that calls it, or names a lane that does
//     not reach it, or lanes of one mask that call different intrinsics;
//   * a load or store outside the launch's tensors, its parameters, the calling thread's
//     own stack and shared memory (reads of the library's constants are allowed);
//   * an invalid launch shape: a zero dimension, more than 1024 threads per block or a
//     block dimension past (1024, 1024, 64), a grid past (2^31 - 1, 65535, 65535), or
//     more than 48 KB of dynamic shared memory.
// Not modelled: timing, the memory model beyond barriers (no reordering is simulated),
// global-memory races, registers and occupancy, the real compiler (docs/architecture.md).
#pragma once

#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_emu_rt.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Shared memory is static storage of the library; the emulator tells it apart from the
// rest (accesses to the library's writable data from a kernel are shared-memory accesses).
#define __shared__ static

using dim3 = cuda_emu_rt::Dim3;
struct uint4 {
  unsigned int x, y, z, w;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return uint4{x, y, z, w};
}

#define threadIdx (::cuda_emu_rt::ThreadIdx())
#define blockIdx (::cuda_emu_rt::BlockIdx())
#define blockDim (::cuda_emu_rt::BlockDim())
#define gridDim (::cuda_emu_rt::GridDim())

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorLaunchFailure = 719,
  cudaErrorInvalidConfiguration = 9,
};
using cudaStream_t = void*;

inline cudaError_t cudaGetLastError() {
  return static_cast<cudaError_t>(::cuda_emu_rt::LastLaunchError());
}
enum cudaFuncAttribute : int { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <typename F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return static_cast<cudaError_t>(
      ::cuda_emu_rt::SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(kernel), value));
}
inline cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t) {
  return static_cast<cudaError_t>(::cuda_emu_rt::Memset(ptr, value, bytes));
}

inline void __syncthreads() { ::cuda_emu_rt::Barrier(::cuda_emu_rt::BarrierOp::kSync, 0); }
inline int __syncthreads_or(int p) {
  return ::cuda_emu_rt::Barrier(::cuda_emu_rt::BarrierOp::kOr, p);
}
inline int __syncthreads_and(int p) {
  return ::cuda_emu_rt::Barrier(::cuda_emu_rt::BarrierOp::kAnd, p);
}
inline int __syncthreads_count(int p) {
  return ::cuda_emu_rt::Barrier(::cuda_emu_rt::BarrierOp::kCount, p);
}
inline void __threadfence() {}
inline void __threadfence_block() {}

namespace cuda_emu_rt {

// The bits of a shuffled value (at most 8 bytes, trivially copyable), and back.
template <typename T>
uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "__shfl of a value > 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <typename T>
T FromBits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

template <typename T>
T Shuffle(WarpOp op, unsigned mask, T v, int arg, int width, const char* name) {
  return FromBits<T>(Warp(op, mask, ToBits(v), arg, width, name));
}

}  // namespace cuda_emu_rt

template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return ::cuda_emu_rt::Shuffle(::cuda_emu_rt::WarpOp::kShflIdx, mask, v, src_lane, width,
                                "__shfl_sync");
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::cuda_emu_rt::Shuffle(::cuda_emu_rt::WarpOp::kShflUp, mask, v, static_cast<int>(delta),
                                width, "__shfl_up_sync");
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::cuda_emu_rt::Shuffle(::cuda_emu_rt::WarpOp::kShflDown, mask, v, static_cast<int>(delta),
                                width, "__shfl_down_sync");
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return ::cuda_emu_rt::Shuffle(::cuda_emu_rt::WarpOp::kShflXor, mask, v, lane_mask, width,
                                "__shfl_xor_sync");
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(::cuda_emu_rt::Warp(::cuda_emu_rt::WarpOp::kBallot, mask,
                                                   predicate != 0, 0, 32, "__ballot_sync"));
}
inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      ::cuda_emu_rt::Warp(::cuda_emu_rt::WarpOp::kAny, mask, predicate != 0, 0, 32, "__any_sync"));
}
inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      ::cuda_emu_rt::Warp(::cuda_emu_rt::WarpOp::kAll, mask, predicate != 0, 0, 32, "__all_sync"));
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::cuda_emu_rt::Warp(::cuda_emu_rt::WarpOp::kSyncWarp, mask, 0, 0, 32, "__syncwarp");
}

// Atomics are calls into the runtime (so the compiler cannot forward or cache the value
// around them, as it cannot on a GPU); each checks its address and is recorded as an atomic
// access for the race check.
namespace cuda_emu_rt {
template <typename T>
T AtomicOf(AtomicOp op, T* addr, T val, T compare = T{}) {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, unsigned int> ||
                    std::is_same_v<T, long long> || std::is_same_v<T, unsigned long long> ||
                    std::is_same_v<T, float>,
                "emulated atomics take int, unsigned, long long, unsigned long long or float");
  const AtomicType type = std::is_same_v<T, float> ? AtomicType::kF32
                          : std::is_signed_v<T>    ? AtomicType::kSigned
                                                   : AtomicType::kUnsigned;
  return FromBits<T>(Atomic(op, type, addr, sizeof(T), ToBits(val), ToBits(compare)));
}
}  // namespace cuda_emu_rt

#define FDMTP_CUDA_EMU_ATOMIC(name, op)                                     \
  template <typename T>                                                     \
  inline T name(T* addr, T val) {                                           \
    return ::cuda_emu_rt::AtomicOf(::cuda_emu_rt::AtomicOp::op, addr, val); \
  }
FDMTP_CUDA_EMU_ATOMIC(atomicAdd, kAdd)
FDMTP_CUDA_EMU_ATOMIC(atomicSub, kSub)
FDMTP_CUDA_EMU_ATOMIC(atomicMax, kMax)
FDMTP_CUDA_EMU_ATOMIC(atomicMin, kMin)
FDMTP_CUDA_EMU_ATOMIC(atomicExch, kExch)
FDMTP_CUDA_EMU_ATOMIC(atomicOr, kOr)
FDMTP_CUDA_EMU_ATOMIC(atomicAnd, kAnd)
#undef FDMTP_CUDA_EMU_ATOMIC

template <typename T>
inline T atomicCAS(T* addr, T compare, T val) {
  return ::cuda_emu_rt::AtomicOf(::cuda_emu_rt::AtomicOp::kCas, addr, val, compare);
}

namespace cuda_emu_rt {

template <auto Kernel, typename Params, size_t... I>
void RunKernel(Params* p, std::index_sequence<I...>) {
  Kernel(std::get<I>(*p)...);
}

template <auto Kernel, typename Params>
void Entry(void* params) {
  RunKernel<Kernel>(static_cast<Params*>(params),
                    std::make_index_sequence<std::tuple_size_v<Params>>{});
}

// The kernel's name from this function's signature ("... [with auto Kernel = NAME; ...]").
const char* KernelName(const char* pretty_function);

template <auto Kernel, typename... A>
int LaunchKernel(const char* pretty, Dim3 grid, Dim3 block, size_t smem, int flags, A... args) {
  std::tuple<A...> params(args...);
  return Launch(KernelName(pretty), reinterpret_cast<const void*>(Kernel), grid, block, smem,
                &Entry<Kernel, std::tuple<A...>>, &params, sizeof(params), flags);
}

}  // namespace cuda_emu_rt

// What every kernel/*.xpu includes: the Kunlun KP headers on the real toolchain, the
// emulator (../emu/kp_emu.h) otherwise, plus the partitioning helpers the kernels share.
// Kernels are in namespace fdmtp_xpu3 and use only the KP subset listed in kp_emu.h, in the
// dialect the XTDK compiler accepts: __global__ kernels and __device__ helpers, every
// global-memory pointer __global_ptr__ (FDMTP_GM in the shared headers), shared-memory
// pointers FDMTP_SM, no lambdas, function pointers or standard-library calls (functor
// structs instead; checked by emu/xtdk_lint.py), and mfence() before every sync_cluster()
// that follows shared-memory writes.
#pragma once

#if defined(FDMTP_XPU_EMULATOR)
#include "xpu/emu/kp_emu.h"
// The emulator has one address space for local and shared memory.
#define FDMTP_SM
#else
#include "xpu/kernel/cluster.h"
#include "xpu/kernel/cluster_partition.h"
#include "xpu/kernel/cluster_primitive.h"
// Pointer to shared memory (the qualifier of Paddle's XPU kernels; unverified here).
#define FDMTP_SM _shared_ptr_
#endif

#include "fdmtp/kernels.h"
#include "xpu/xpu_limits.h"

namespace fdmtp_xpu3 {

namespace lim = ::fdmtp::xpu;

// This core's index among all cores of the launch, and their number.
__device__ inline int64_t GlobalCore() {
  return static_cast<int64_t>(cluster_id()) * core_num() + core_id();
}
__device__ inline int64_t GlobalCores() { return static_cast<int64_t>(cluster_num()) * core_num(); }

// Copies `bytes` from global `src` to global `dst` through local memory.
__device__ inline void CopyGm(__global_ptr__ void* dst, __global_ptr__ const void* src,
                              int64_t bytes) {
  __local__ char buf[lim::kCopyChunkBytes];
  for (int64_t off = 0; off < bytes; off += lim::kCopyChunkBytes) {
    const int64_t n = bytes - off < lim::kCopyChunkBytes ? bytes - off : lim::kCopyChunkBytes;
    GM2LM(static_cast<__global_ptr__ const char*>(src) + off, buf, n);
    mfence();
    LM2GM(buf, static_cast<__global_ptr__ char*>(dst) + off, n);
  }
  mfence();
}

// Zeroes `bytes` of global memory from a zeroed local buffer.
__device__ inline void ZeroGm(__global_ptr__ void* dst, int64_t bytes) {
  __local__ char zeros[lim::kCopyChunkBytes];
  for (int64_t i = 0; i < lim::kCopyChunkBytes; ++i) zeros[i] = 0;
  for (int64_t off = 0; off < bytes; off += lim::kCopyChunkBytes) {
    const int64_t n = bytes - off < lim::kCopyChunkBytes ? bytes - off : lim::kCopyChunkBytes;
    LM2GM(zeros, static_cast<__global_ptr__ char*>(dst) + off, n);
  }
  mfence();
}

// Stores one value into global memory (through local memory).
template <typename T>
__device__ inline void StoreGm(__global_ptr__ T* dst, T value) {
  __local__ T v = value;
  LM2GM(&v, dst, sizeof(T));
  mfence();
}

// Identity store of a prefix sum (ClusterExclusiveScan's default).
struct StoreExact {
  __device__ int64_t operator()(int64_t v) const { return v; }
};

// Exclusive prefix sums of value(b), b in [0, n), computed by the cores of this cluster:
// out[b] = store(value(0) + ... + value(b - 1)), out[n] = store(the total). `value` and
// `store` are functor structs (int64_t operator()(int64_t) const). `out` ([n + 1]) and
// `partial` ([core_num() + 1]) are __shared__ buffers of the calling kernel. Every core of
// the cluster must call it; the results are visible to all of them on return.
template <typename OutT, typename ValueFn, typename StoreFn = StoreExact>
__device__ inline void ClusterExclusiveScan(int64_t n, const ValueFn& value, FDMTP_SM OutT* out,
                                            FDMTP_SM int64_t* partial,
                                            const StoreFn& store = StoreFn()) {
  const int64_t cores = core_num();
  const int64_t chunk = (n + cores - 1) / cores;
  const int64_t begin = core_id() * chunk < n ? core_id() * chunk : n;
  const int64_t end = begin + chunk < n ? begin + chunk : n;
  int64_t sum = 0;
  for (int64_t b = begin; b < end; ++b) sum += value(b);
  partial[core_id() + 1] = sum;
  mfence();
  sync_cluster();
  if (core_id() == 0) {
    partial[0] = 0;
    for (int64_t c = 1; c <= cores; ++c) partial[c] += partial[c - 1];
  }
  mfence();
  sync_cluster();
  int64_t run = partial[core_id()];
  for (int64_t b = begin; b < end; ++b) {
    out[b] = static_cast<OutT>(store(run));
    run += value(b);
  }
  if (core_id() == cores - 1) out[n] = static_cast<OutT>(store(partial[cores]));
  mfence();
  sync_cluster();
}

}  // namespace fdmtp_xpu3

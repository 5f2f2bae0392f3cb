// CUDA kernel for a row-gather plan (see fdmtp/row_gather.h), one launch, no scratch
// memory, no cooperative launch, no host sync, any batch size and any hidden size.
//
// Each block owns a tile of kRowsPerTile output rows. To find which item and input row
// feeds each of its rows, it scans the items' counts in chunks of blockDim.x (a block
// prefix sum with a running carry), and stops as soon as the running output offset passes
// its tile; the block of tile 0 scans every item and writes output_token_num. Then the
// block copies its rows: 16-byte vectors when both rows are 16-byte aligned, elementwise
// for the tail (and for unaligned rows), or zeros for rows nobody feeds.
#pragma once

#include <cstdint>

#include "cuda_utils.cuh"
#include "fdmtp/row_gather.h"

namespace fdmtp {
namespace cuda {

constexpr int kRowsPerTile = 8;

// Copies n elements of `src` to `dst` (zeros when src is null) with the whole block.
template <typename T>
__device__ void BlockCopyRow(T* dst, const T* src, int64_t n) {
  constexpr int64_t kVec = 16 / sizeof(T);
  int64_t vec_end = 0;
  const bool aligned = (reinterpret_cast<uintptr_t>(dst) % 16 == 0) &&
                       (src == nullptr || reinterpret_cast<uintptr_t>(src) % 16 == 0);
  if (aligned) {
    vec_end = n / kVec;
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (int64_t i = threadIdx.x; i < vec_end; i += blockDim.x) {
      d[i] = src != nullptr ? s[i] : make_uint4(0, 0, 0, 0);
    }
    vec_end *= kVec;
  }
  for (int64_t i = vec_end + threadIdx.x; i < n; i += blockDim.x) {
    dst[i] = src != nullptr ? src[i] : T{};
  }
}

// Inclusive prefix sums of two per-thread values across the block (Hillis-Steele in
// shared memory, one slot per thread): on return, a[t] = sum of va over threads <= t (same
// for b), visible to every thread. The caller syncs before rewriting a or b.
template <typename V>
__device__ void BlockInclusiveScanPair(V* a, V* b, V va, V vb) {
  const int tid = threadIdx.x;
  a[tid] = va;
  b[tid] = vb;
  __syncthreads();
  for (int offset = 1; offset < static_cast<int>(blockDim.x); offset <<= 1) {
    const V add_a = tid >= offset ? a[tid - offset] : V(0);
    const V add_b = tid >= offset ? b[tid - offset] : V(0);
    __syncthreads();
    a[tid] += add_a;
    b[tid] += add_b;
    __syncthreads();
  }
}

template <typename T, typename Plan>
__global__ void __launch_bounds__(kThreadsPerBlock) GatherRowsKernel(Plan plan, int64_t num_tiles) {
  __shared__ int64_t scan_in[kThreadsPerBlock];
  __shared__ int64_t scan_out[kThreadsPerBlock];
  __shared__ int64_t source[kRowsPerTile];
  const RowGatherArgs& r = plan.rows;
  const int tid = threadIdx.x;
  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t r0 = tile * kRowsPerTile;
    const int64_t r1 = r0 + kRowsPerTile < r.out_rows ? r0 + kRowsPerTile : r.out_rows;
    if (tid < kRowsPerTile) source[tid] = -1;
    __syncthreads();
    const bool write_total = tile == 0;
    int64_t carry_in = 0;
    int64_t carry_out = 0;
    for (int64_t chunk = 0; chunk < r.bsz; chunk += blockDim.x) {
      const int64_t b = chunk + tid;
      const ItemRows c = b < r.bsz ? plan.Counts(b) : ItemRows{0, 0};
      BlockInclusiveScanPair(scan_in, scan_out, c.in, c.out);
      const int64_t in_off = carry_in + scan_in[tid] - c.in;
      const int64_t out_off = carry_out + scan_out[tid] - c.out;
      carry_in += scan_in[blockDim.x - 1];
      carry_out += scan_out[blockDim.x - 1];
      const int64_t lo = out_off > r0 ? out_off : r0;
      const int64_t hi = out_off + c.out < r1 ? out_off + c.out : r1;
      for (int64_t row = lo; row < hi; ++row) {
        const int64_t j = row - out_off;
        source[row - r0] = SourceRow(plan.Source(b, j, c), c, in_off, r.in_rows);
      }
      __syncthreads();  // scan_* are rewritten by the next chunk; source is read below
      if (!write_total && carry_out >= r1) break;  // later items start past this tile
    }
    if (write_total && tid == 0) *r.output_token_num = SatInt32(carry_out);
    const T* input = static_cast<const T*>(r.input);
    T* out = static_cast<T*>(r.out);
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t src = source[row - r0];
      BlockCopyRow<T>(out + row * r.hidden, src >= 0 ? input + src * r.hidden : nullptr, r.hidden);
    }
    __syncthreads();  // `source` is reset by the next tile
  }
}

template <typename T, typename Plan>
int LaunchGatherRows(const Plan& plan, Stream stream) {
  const int64_t rows = plan.rows.out_rows;
  // At least one tile, so output_token_num is written even with no output rows.
  const int64_t tiles = rows > 0 ? (rows + kRowsPerTile - 1) / kRowsPerTile : 1;
  const int blocks = static_cast<int>(tiles < kMaxBlocks ? tiles : kMaxBlocks);
  FDMTP_CUDA_CALL(Launch<GatherRowsKernel<T, Plan>>(blocks, kThreadsPerBlock, 0,
                                                    AsCudaStream(stream), plan, tiles));
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp

// Defines cuda::Kernel, the CUDA launcher of a row-gather op, for every float type (the list
// of FDMTP_FOR_EACH_FLOAT_TYPE): LaunchGatherRows over the op's plan `Args` (see the CPU
// twin in cpu/row_gather_cpu.h). Used inside namespace fdmtp.
#define FDMTP_DEFINE_ROW_GATHER_CUDA_KERNEL(Kernel, Args) \
  namespace cuda {                                        \
  template <typename T>                                   \
  int Kernel(const Args& args, Stream stream) {           \
    return LaunchGatherRows<T>(args, stream);             \
  }                                                       \
  template int Kernel<float>(const Args&, Stream);        \
  template int Kernel<Float16>(const Args&, Stream);      \
  template int Kernel<BFloat16>(const Args&, Stream);     \
  }

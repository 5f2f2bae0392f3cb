// Two stream-ordered kernels, no scratch, no host sync, any batch size:
//   1. one block scans the items in chunks of blockDim.x (block prefix sum + running
//      carry, 64-bit, saturated at the buffers' rows) and writes the counts and the
//      inclusive offsets cu_*_offset[1..bsz];
//   2. one block per item (grid-stride) copies its rows, reading its exclusive offsets
//      from the offsets kernel 1 wrote (cu_*_offset[b], taken as 0 for b == 0).
// (Upstream runs cub::DeviceScan with a cudaMalloc/cudaFree of temp storage per call.)
#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"
#include "row_gather_cuda.cuh"

namespace fdmtp {
namespace cuda {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock)
    SpeculateGetLogitsScanKernel(SpeculateGetLogitsArgs a) {
  __shared__ int64_t scan_next[kThreadsPerBlock];
  __shared__ int64_t scan_batch[kThreadsPerBlock];
  const int tid = threadIdx.x;
  const int64_t next_limit = SpeculateGetLogitsLimit(a.logit_rows);
  const int64_t batch_limit = SpeculateGetLogitsLimit(a.draft_rows);
  // Running offsets in 64 bits, saturated at the limits (fdmtp/speculate_get_logits.h):
  // a chunk adds at most blockDim.x * 2^31 to a carry <= 2^31, far from overflow.
  int64_t carry_next = 0;
  int64_t carry_batch = 0;
  for (int64_t chunk = 0; chunk < a.bsz; chunk += blockDim.x) {
    const int64_t b = chunk + tid;
    const LogitsCounts c = b < a.bsz ? SpeculateGetLogitsCounts(a, b) : LogitsCounts{0, 0};
    BlockInclusiveScanPair<int64_t>(scan_next, scan_batch, c.next, c.batch);
    if (b < a.bsz) {
      const int64_t next_end = SpeculateGetLogitsAdvance(carry_next, scan_next[tid], next_limit);
      const int64_t next_begin =
          SpeculateGetLogitsAdvance(carry_next, scan_next[tid] - c.next, next_limit);
      const int64_t batch_end =
          SpeculateGetLogitsAdvance(carry_batch, scan_batch[tid], batch_limit);
      const int64_t batch_begin =
          SpeculateGetLogitsAdvance(carry_batch, scan_batch[tid] - c.batch, batch_limit);
      a.next_token_num[b] = static_cast<int32_t>(next_end - next_begin);
      a.batch_token_num[b] = static_cast<int32_t>(batch_end - batch_begin);
      a.cu_next_token_offset[b + 1] = static_cast<int32_t>(next_end);
      a.cu_batch_token_offset[b + 1] = static_cast<int32_t>(batch_end);
    }
    carry_next = SpeculateGetLogitsAdvance(carry_next, scan_next[blockDim.x - 1], next_limit);
    carry_batch = SpeculateGetLogitsAdvance(carry_batch, scan_batch[blockDim.x - 1], batch_limit);
    __syncthreads();  // the next chunk rewrites scan_*
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    SpeculateGetLogitsCopyKernel(SpeculateGetLogitsArgs a) {
  T* draft = static_cast<T*>(a.draft_logits);
  const T* logits = static_cast<const T*>(a.logits);
  const T* first = static_cast<const T*>(a.first_token_logits);
  for (int64_t b = blockIdx.x; b < a.bsz; b += gridDim.x) {
    const int64_t next_off = b == 0 ? 0 : a.cu_next_token_offset[b];
    const int64_t batch_off = b == 0 ? 0 : a.cu_batch_token_offset[b];
    // The offsets and counts kernel 1 wrote are saturated at the buffers' rows, so
    // batch_off + rows <= draft_rows.
    const int32_t rows = a.batch_token_num[b];
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t dst = batch_off + j;
      const LogitsSource s = SpeculateGetLogitsSource(a, b, j, next_off);
      if (dst >= a.draft_rows || s.row < 0) continue;
      BlockCopyRow<T>(draft + dst * a.vocab, (s.tensor == 1 ? first : logits) + s.row * a.vocab,
                      a.vocab);
    }
  }
}

}  // namespace

template <typename T>
int SpeculateGetLogits(const SpeculateGetLogitsArgs& args, Stream stream) {
  if (args.bsz == 0) return cudaSuccess;
  const cudaStream_t s = AsCudaStream(stream);
  FDMTP_CUDA_CALL(Launch<SpeculateGetLogitsScanKernel>(1, kThreadsPerBlock, 0, s, args));
  const int blocks = static_cast<int>(args.bsz < kMaxBlocks ? args.bsz : kMaxBlocks);
  FDMTP_CUDA_CALL(Launch<SpeculateGetLogitsCopyKernel<T>>(blocks, kThreadsPerBlock, 0, s, args));
  return cudaSuccess;
}

#define FDMTP_INSTANTIATE(T) \
  template int SpeculateGetLogits<T>(const SpeculateGetLogitsArgs&, Stream);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cuda
}  // namespace fdmtp

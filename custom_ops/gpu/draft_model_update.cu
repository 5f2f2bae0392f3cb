#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {

// One block walks the batch in chunks. In each chunk every thread reads its item's input
// seq_lens_this_time, the block scans the "active" flags into the compacted index k (plus
// the carry of earlier chunks), and only then items are updated: k never sees a value that
// another thread has already overwritten. Upstream counts while other threads rewrite the
// lengths, a race; docs/compat.md, section 2.
__global__ void DraftModelUpdateKernel(DraftModelUpdateArgs args) {
  int64_t carry = 0;
  int any_running = 0;
  for (int64_t base = 0; base < args.bsz; base += blockDim.x) {
    const int64_t b = base + threadIdx.x;
    const bool active = b < args.bsz && args.seq_lens_this_time[b] > 0;
    int64_t chunk_total = 0;
    const int64_t k = carry + BlockExclusiveSum(active ? 1 : 0, &chunk_total);
    const bool stopped = b < args.bsz && DraftModelUpdateItem(args, b, k);
    any_running = __syncthreads_or(b < args.bsz && !stopped ? 1 : 0) | any_running;
    carry += chunk_total;
  }
  if (threadIdx.x == 0) *args.not_need_stop = any_running != 0;
}

}  // namespace

int DraftModelUpdate(const DraftModelUpdateArgs& args, Stream stream) {
  FDMTP_CUDA_CALL(Launch<DraftModelUpdateKernel>(1, kScanThreads, 0, AsCudaStream(stream), args));
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp

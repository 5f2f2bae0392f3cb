#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {

// One block walks the batch in chunks; __syncthreads_or gives "some item kept" without
// atomics or scratch memory, for any batch size.
__global__ void DraftModelPreprocessKernel(DraftModelPreprocessArgs args) {
  int any_kept = 0;
  for (int64_t base = 0; base < args.bsz; base += blockDim.x) {
    const int64_t b = base + threadIdx.x;
    const bool kept = b < args.bsz && DraftModelPreprocessItem(args, b);
    any_kept = __syncthreads_or(kept ? 1 : 0) | any_kept;
  }
  if (threadIdx.x == 0) *args.not_need_stop = any_kept != 0;
}

}  // namespace

int DraftModelPreprocess(const DraftModelPreprocessArgs& args, Stream stream) {
  FDMTP_CUDA_CALL(
      Launch<DraftModelPreprocessKernel>(1, kScanThreads, 0, AsCudaStream(stream), args));
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp

#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {

// One thread per item, grid-stride: correct for any batch size (no 1024 cap).
__global__ void DraftModelPostprocessKernel(DraftModelPostprocessArgs args) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < args.bsz;
       b += stride) {
    DraftModelPostprocessItem(args, b);
  }
}

}  // namespace

int DraftModelPostprocess(const DraftModelPostprocessArgs& args, Stream stream) {
  if (args.bsz == 0) return cudaSuccess;
  FDMTP_CUDA_CALL(Launch<DraftModelPostprocessKernel>(BlocksFor(args.bsz), kThreadsPerBlock, 0,
                                                      AsCudaStream(stream), args));
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp

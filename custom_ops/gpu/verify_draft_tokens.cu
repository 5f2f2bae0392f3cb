#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {

// One thread per slot, grid-stride: correct for any batch size (upstream: one block of
// 1024). No random state: the uniforms are an input tensor.
__global__ void VerifyDraftTokensKernel(VerifyDraftTokensArgs args) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < args.max_bsz;
       b += stride) {
    VerifyDraftTokensItem(args, b);
  }
}

}  // namespace

int VerifyDraftTokens(const VerifyDraftTokensArgs& args, Stream stream) {
  if (args.max_bsz == 0) return cudaSuccess;
  FDMTP_CUDA_CALL(Launch<VerifyDraftTokensKernel>(BlocksFor(args.max_bsz), kThreadsPerBlock, 0,
                                                  AsCudaStream(stream), args));
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp

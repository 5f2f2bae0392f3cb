#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {

// One block walks the items in batch order; each item's tokens are split over the block's
// threads, and the block synchronises between items, so where hostile offsets make items
// overlap the later item's values are left, as on the CPU (any batch size).
__global__ void UpdateAttnMaskOffsetsKernel(UpdateAttnMaskOffsetsArgs args) {
  for (int64_t b = 0; b < args.bsz; ++b) {
    UpdateAttnMaskOffsetsItem(args, b, threadIdx.x, blockDim.x);
    __syncthreads();
  }
}

}  // namespace

int UpdateAttnMaskOffsets(const UpdateAttnMaskOffsetsArgs& args, Stream stream) {
  const cudaStream_t s = AsCudaStream(stream);
  if (args.token_num > 0) {
    FDMTP_CUDA_CALL(
        cudaMemsetAsync(args.attn_mask_offsets, 0, sizeof(int32_t) * 2 * args.token_num, s));
  }
  if (args.bsz == 0) return cudaSuccess;
  FDMTP_CUDA_CALL(Launch<UpdateAttnMaskOffsetsKernel>(1, kThreadsPerBlock, 0, s, args));
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp

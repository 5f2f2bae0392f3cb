#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {

// One thread per item, grid-stride: correct for any batch size (upstream: one block of 512
// threads looping over items).
__global__ void UpdateAttnMaskOffsetsKernel(UpdateAttnMaskOffsetsArgs args) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < args.bsz;
       b += stride) {
    UpdateAttnMaskOffsetsItem(args, b);
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
  UpdateAttnMaskOffsetsKernel<<<BlocksFor(args.bsz), kThreadsPerBlock, 0, s>>>(args);
  FDMTP_CUDA_CALL(cudaGetLastError());
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp

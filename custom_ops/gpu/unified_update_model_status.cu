#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {

// One thread per slot, grid-stride: any batch size (upstream: one block of 1024 and a
// block-wide count). has_running_seqs was cleared on the same stream before this launch;
// every slot that is still running stores `true`. All writers store the same byte, so
// the result (any slot running) does not depend on their order: deterministic, with no
// scratch buffer, no second reduction and no host sync.
__global__ void UnifiedUpdateModelStatusKernel(UnifiedUpdateModelStatusArgs args) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < args.max_bsz;
       b += stride) {
    if (UnifiedUpdateModelStatusItem(args, b)) {
      *reinterpret_cast<volatile bool*>(args.has_running_seqs) = true;
    }
  }
}

}  // namespace

int UnifiedUpdateModelStatus(const UnifiedUpdateModelStatusArgs& args, Stream stream) {
  // Stream-ordered clear (graph-capturable): false unless some slot is still running.
  FDMTP_CUDA_CALL(cudaMemsetAsync(args.has_running_seqs, 0, sizeof(bool), AsCudaStream(stream)));
  if (args.max_bsz == 0) return cudaSuccess;
  FDMTP_CUDA_CALL(Launch<UnifiedUpdateModelStatusKernel>(BlocksFor(args.max_bsz), kThreadsPerBlock,
                                                         0, AsCudaStream(stream), args));
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp

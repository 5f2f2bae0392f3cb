#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {

// The allocator is sequential by definition (free order, need order, eviction order); one
// thread runs it so the free list comes out in the same order as on the CPU. Upstream's
// atomics made that order vary from run to run (docs/compat.md, section 2).
__global__ void MtpStepKernel(MtpStepArgs args) { MtpStepRun(args); }

}  // namespace

int MtpStepPaddle(const MtpStepArgs& args, Stream stream) {
  FDMTP_CUDA_CALL(Launch<MtpStepKernel>(1, 1, 0, AsCudaStream(stream), args));
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp

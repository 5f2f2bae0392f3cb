// One block per logits row (grid-stride over rows); the block's threads share each of the
// row's four passes (fdmtp/speculate_get_token_penalty_multi_scores.h), with a barrier
// between passes. The row's item is the same for every thread of the block, so every thread
// reaches every barrier. No scratch memory, no host sync.
#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    SpeculateGetTokenPenaltyMultiScoresKernel(SpeculateGetTokenPenaltyMultiScoresArgs a) {
  const int64_t tid = threadIdx.x;
  const int64_t threads = blockDim.x;
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const PenaltyRow row = PenaltyRowOf(a, r);
    if (!row.active) continue;
    PenaltyMinLength<T>(a, row, r, tid, threads);
    __syncthreads();
    PenaltyScores<T>(a, row, r, tid, threads);
    __syncthreads();
    PenaltyTemperature<T>(a, row, r, tid, threads);
    __syncthreads();
    PenaltyBadWords<T>(a, row, r, tid, threads);
    __syncthreads();  // the next row of this block may be of the same item
  }
}

}  // namespace

template <typename T>
int SpeculateGetTokenPenaltyMultiScores(const SpeculateGetTokenPenaltyMultiScoresArgs& args,
                                        Stream stream) {
  if (args.rows == 0) return cudaSuccess;
  const int blocks = static_cast<int>(args.rows < kMaxBlocks ? args.rows : kMaxBlocks);
  FDMTP_CUDA_CALL(Launch<SpeculateGetTokenPenaltyMultiScoresKernel<T>>(blocks, kThreadsPerBlock, 0,
                                                                       AsCudaStream(stream), args));
  return cudaSuccess;
}

#define FDMTP_INSTANTIATE(T)                           \
  template int SpeculateGetTokenPenaltyMultiScores<T>( \
      const SpeculateGetTokenPenaltyMultiScoresArgs&, Stream);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cuda
}  // namespace fdmtp

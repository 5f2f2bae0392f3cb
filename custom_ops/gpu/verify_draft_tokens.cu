#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {

// One thread per slot, grid-stride: correct for any batch size (upstream: one block of
// 1024). No random state: the uniforms are an input tensor.
int VerifyDraftTokens(const VerifyDraftTokensArgs& args, Stream stream) {
  return LaunchPerItem<VerifyDraftTokensItem>(args.max_bsz, stream, args);
}

}  // namespace cuda
}  // namespace fdmtp

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
__device__ void UpdateSlot(const UnifiedUpdateModelStatusArgs& args, int64_t b) {
  if (UnifiedUpdateModelStatusItem(args, b)) {
    *reinterpret_cast<volatile bool*>(args.has_running_seqs) = true;
  }
}

}  // namespace

int UnifiedUpdateModelStatus(const UnifiedUpdateModelStatusArgs& args, Stream stream) {
  // Stream-ordered clear (graph-capturable): false unless some slot is still running.
  FDMTP_CUDA_CALL(cudaMemsetAsync(args.has_running_seqs, 0, sizeof(bool), AsCudaStream(stream)));
  return LaunchPerItem<UpdateSlot>(args.max_bsz, stream, args);
}

}  // namespace cuda
}  // namespace fdmtp

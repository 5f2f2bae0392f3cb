#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {

// One thread per item, grid-stride: correct for any batch size (no 1024 cap).
int DraftModelPostprocess(const DraftModelPostprocessArgs& args, Stream stream) {
  return LaunchPerItem<DraftModelPostprocessItem>(args.bsz, stream, args);
}

}  // namespace cuda
}  // namespace fdmtp

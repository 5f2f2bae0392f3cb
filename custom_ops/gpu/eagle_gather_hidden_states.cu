#include "fdmtp/kernels.h"
#include "row_gather_cuda.cuh"

namespace fdmtp {
FDMTP_DEFINE_ROW_GATHER_CUDA_KERNEL(EagleGatherHiddenStates, EagleGatherHiddenStatesArgs)
}  // namespace fdmtp

#include "fdmtp/kernels.h"
#include "row_gather_cuda.cuh"

namespace fdmtp {
namespace cuda {

template <typename T>
int EagleGetSelfHiddenStates(const EagleGetSelfHiddenStatesArgs& args, Stream stream) {
  return LaunchGatherRows<T>(args, stream);
}

#define FDMTP_INSTANTIATE(T) \
  template int EagleGetSelfHiddenStates<T>(const EagleGetSelfHiddenStatesArgs&, Stream);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cuda
}  // namespace fdmtp

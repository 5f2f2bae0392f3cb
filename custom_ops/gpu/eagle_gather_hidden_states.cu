#include "fdmtp/kernels.h"
#include "row_gather_cuda.cuh"

namespace fdmtp {
namespace cuda {

template <typename T>
int EagleGatherHiddenStates(const EagleGatherHiddenStatesArgs& args, Stream stream) {
  return LaunchGatherRows<T>(args, stream);
}

#define FDMTP_INSTANTIATE(T) \
  template int EagleGatherHiddenStates<T>(const EagleGatherHiddenStatesArgs&, Stream);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cuda
}  // namespace fdmtp

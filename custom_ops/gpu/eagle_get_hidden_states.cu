#include "fdmtp/kernels.h"
#include "row_gather_cuda.cuh"

namespace fdmtp {
namespace cuda {

template <typename T>
int EagleGetHiddenStates(const EagleGetHiddenStatesArgs& args, Stream stream) {
  return LaunchGatherRows<T>(args, stream);
}

#define FDMTP_INSTANTIATE(T) \
  template int EagleGetHiddenStates<T>(const EagleGetHiddenStatesArgs&, Stream);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cuda
}  // namespace fdmtp

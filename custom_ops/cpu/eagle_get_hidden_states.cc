#include "fdmtp/kernels.h"
#include "row_gather.h"

namespace fdmtp {
namespace cpu {

template <typename T>
void EagleGetHiddenStates(const EagleGetHiddenStatesArgs& args) {
  GatherRows<T>(args);
}

#define FDMTP_INSTANTIATE(T) template void EagleGetHiddenStates<T>(const EagleGetHiddenStatesArgs&);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cpu
}  // namespace fdmtp

#include "fdmtp/kernels.h"
#include "row_gather.h"

namespace fdmtp {
namespace cpu {

template <typename T>
void EagleGetSelfHiddenStates(const EagleGetSelfHiddenStatesArgs& args) {
  GatherRows<T>(args);
}

#define FDMTP_INSTANTIATE(T) template void EagleGetSelfHiddenStates<T>(const EagleGetSelfHiddenStatesArgs&);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cpu
}  // namespace fdmtp

#include "fdmtp/ops.h"

namespace fdmtp {

bool BuiltWithCuda() {
#if defined(FDMTP_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

bool BuiltWithXpu() {
#if defined(FDMTP_WITH_XPU)
  return true;
#else
  return false;
#endif
}

}  // namespace fdmtp

// emulator_selftest: launches the rule-breaking kernels of kernel/emulator_selftest.xpu so
// tests can check that the emulator reports them (emulated builds only).
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void emulator_selftest_local_overflow(const char* src, int64_t bytes);
FDMTP_XPU_KERNEL_DECL void emulator_selftest_barrier_mismatch();
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {

int emulator_selftest(Context* ctx, const std::string& which) {
  constexpr const char* kOp = "emulator_selftest";
  static const char source[256] = {};
  if (which == "local_overflow") {
    FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::emulator_selftest_local_overflow, source, 128);
  } else if (which == "barrier_mismatch") {
    FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::emulator_selftest_barrier_mismatch);
  } else {
    return detail::InvalidArgument(kOp, "unknown self-test '" + which + "'");
  }
  return kSuccess;
}

}  // namespace xpu
}  // namespace fdmtp

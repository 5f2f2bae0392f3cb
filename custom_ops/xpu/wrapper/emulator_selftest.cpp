// emulator_selftest: launches the rule-breaking kernels of kernel/emulator_selftest.xpu so
// tests can check that the emulator reports them (emulated builds only).
#include "emu_common/access_hooks.h"
#include "wrapper.h"

FDMTP_XPU_KERNEL(emulator_selftest_local_overflow, const char* src, int64_t bytes);
FDMTP_XPU_KERNEL(emulator_selftest_barrier_mismatch);
FDMTP_XPU_KERNEL(emulator_selftest_missing_mfence);
FDMTP_XPU_KERNEL(emulator_selftest_foreign_local);
FDMTP_XPU_KERNEL(emulator_selftest_stack_overflow, const char* src);

namespace fdmtp {
namespace xpu {

int emulator_selftest(Context* ctx, const std::string& which) {
  constexpr const char* kOp = "emulator_selftest";
  static const char source[2 * kLocalMemBytes] = {};
  const char* src = source;
  if ((which == "missing_mfence" || which == "foreign_local") &&
      !::fdmtp::emu::AccessHooksCompiledIn()) {
    return detail::InvalidArgument(
        kOp,
        "self-test '" + which +
            "' needs the access instrumentation (this build has FDMTP_EMU_CHECK_ACCESSES=OFF)");
  }
  if (which == "local_overflow") {
    FDMTP_XPU_LAUNCH(kOp, ctx, emulator_selftest_local_overflow, src, int64_t{128});
  } else if (which == "barrier_mismatch") {
    FDMTP_XPU_LAUNCH(kOp, ctx, emulator_selftest_barrier_mismatch);
  } else if (which == "missing_mfence") {
    FDMTP_XPU_LAUNCH(kOp, ctx, emulator_selftest_missing_mfence);
  } else if (which == "foreign_local") {
    FDMTP_XPU_LAUNCH(kOp, ctx, emulator_selftest_foreign_local);
  } else if (which == "stack_overflow") {
    FDMTP_XPU_LAUNCH(kOp, ctx, emulator_selftest_stack_overflow, src);
  } else {
    return detail::InvalidArgument(kOp, "unknown self-test '" + which + "'");
  }
  return kSuccess;
}

}  // namespace xpu
}  // namespace fdmtp

// unified_update_model_status: XPU plugin wrapper. Checks the kernel's capacity limits (xpu_limits.h), then
// runs cpu_wrapper (the shared per-item logic on host memory) or launches the XPU3 kernel
// of kernel/unified_update_model_status.xpu.
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void unified_update_model_status_clear(bool* has_running_seqs);
FDMTP_XPU_KERNEL_DECL void unified_update_model_status(fdmtp::UnifiedUpdateModelStatusArgs args);
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {
namespace {

constexpr const char* kOp = "unified_update_model_status";

void cpu_wrapper(const UnifiedUpdateModelStatusArgs& args) { cpu::UnifiedUpdateModelStatus(args); }

int xpu3_wrapper(Context* ctx, const UnifiedUpdateModelStatusArgs& args) {
  Context one = *ctx;  // the flag reset runs on a single core
  one.clusters = 1;
  one.cores = 1;
  FDMTP_XPU_LAUNCH(kOp, &one, fdmtp_xpu3::unified_update_model_status_clear, args.has_running_seqs);
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::unified_update_model_status, args);
  return kSuccess;
}

}  // namespace

int unified_update_model_status(Context* ctx, const UnifiedUpdateModelStatusArgs& args) {
  return detail::Run(
      ctx, kOp, [&] { cpu_wrapper(args); },
      [&] { return xpu3_wrapper(ctx, args); });
}

}  // namespace xpu
}  // namespace fdmtp

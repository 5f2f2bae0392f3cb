// mtp_step_paddle: XPU plugin wrapper. Checks the kernel's capacity limits (xpu_limits.h), then
// runs cpu_wrapper (the shared per-item logic on host memory) or launches the XPU3 kernel
// of kernel/mtp_step_paddle.xpu.
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void mtp_step_paddle(fdmtp::MtpStepArgs args);
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {
namespace {

constexpr const char* kOp = "mtp_step_paddle";

void cpu_wrapper(const MtpStepArgs& args) { cpu::MtpStepPaddle(args); }

int xpu3_wrapper(Context* ctx, const MtpStepArgs& args) {
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::mtp_step_paddle, args);
  return kSuccess;
}

}  // namespace

int mtp_step_paddle(Context* ctx, const MtpStepArgs& args) {
  return detail::Run(
      ctx, kOp, [&] { cpu_wrapper(args); },
      [&] { return xpu3_wrapper(ctx, args); });
}

}  // namespace xpu
}  // namespace fdmtp

// speculate_pre_process: XPU plugin wrapper. Checks the kernel's capacity limits (xpu_limits.h), then
// runs cpu_wrapper (the shared per-item logic on host memory) or launches the XPU3 kernel
// of kernel/speculate_pre_process.xpu.
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void speculate_pre_process_fill(fdmtp::SpeculatePreProcessArgs args);
FDMTP_XPU_KERNEL_DECL void speculate_pre_process(fdmtp::SpeculatePreProcessArgs args);
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {
namespace {

constexpr const char* kOp = "speculate_pre_process";

void cpu_wrapper(const SpeculatePreProcessArgs& args) { cpu::SpeculatePreProcess(args); }

int xpu3_wrapper(Context* ctx, const SpeculatePreProcessArgs& args) {
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::speculate_pre_process_fill, args);
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::speculate_pre_process, args);
  return kSuccess;
}

}  // namespace

int speculate_pre_process(Context* ctx, const SpeculatePreProcessArgs& args) {
  FDMTP_XPU_CHECK(detail::CheckLe(kOp, "batch size", args.bsz, "kMaxBatch", kMaxBatch));
  return detail::Run(
      ctx, kOp, [&] { cpu_wrapper(args); },
      [&] { return xpu3_wrapper(ctx, args); });
}

}  // namespace xpu
}  // namespace fdmtp

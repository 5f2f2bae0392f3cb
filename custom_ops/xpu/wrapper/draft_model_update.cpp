// draft_model_update: XPU plugin wrapper. Checks the kernel's capacity limits (xpu_limits.h), then
// runs cpu_wrapper (the shared per-item logic on host memory) or launches the XPU3 kernel
// of kernel/draft_model_update.xpu.
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void draft_model_update(fdmtp::DraftModelUpdateArgs args);
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {
namespace {

constexpr const char* kOp = "draft_model_update";

void cpu_wrapper(const DraftModelUpdateArgs& args) { cpu::DraftModelUpdate(args); }

int xpu3_wrapper(Context* ctx, const DraftModelUpdateArgs& args) {
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::draft_model_update, args);
  return kSuccess;
}

}  // namespace

int draft_model_update(Context* ctx, const DraftModelUpdateArgs& args) {
  FDMTP_XPU_CHECK(detail::CheckLe(kOp, "batch size", args.bsz, "kMaxBatch", kMaxBatch));
  return detail::Run(
      ctx, kOp, [&] { cpu_wrapper(args); },
      [&] { return xpu3_wrapper(ctx, args); });
}

}  // namespace xpu
}  // namespace fdmtp

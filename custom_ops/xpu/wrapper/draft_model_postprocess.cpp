// draft_model_postprocess: XPU plugin wrapper. Checks the kernel's capacity limits (xpu_limits.h), then
// runs cpu_wrapper (the shared per-item logic on host memory) or launches the XPU3 kernel
// of kernel/draft_model_postprocess.xpu.
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void draft_model_postprocess(fdmtp::DraftModelPostprocessArgs args);
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {
namespace {

constexpr const char* kOp = "draft_model_postprocess";

void cpu_wrapper(const DraftModelPostprocessArgs& args) { cpu::DraftModelPostprocess(args); }

int xpu3_wrapper(Context* ctx, const DraftModelPostprocessArgs& args) {
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::draft_model_postprocess, args);
  return kSuccess;
}

}  // namespace

int draft_model_postprocess(Context* ctx, const DraftModelPostprocessArgs& args) {
  FDMTP_XPU_CHECK(detail::CheckLe(kOp, "draft_tokens width (K + 1)", args.width, "kMaxDraftWidth", kMaxDraftWidth));
  return detail::Run(
      ctx, kOp, [&] { cpu_wrapper(args); },
      [&] { return xpu3_wrapper(ctx, args); });
}

}  // namespace xpu
}  // namespace fdmtp

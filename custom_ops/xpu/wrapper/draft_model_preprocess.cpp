// draft_model_preprocess: XPU plugin wrapper. Checks the kernel's capacity limits (xpu_limits.h), then
// runs cpu_wrapper (the shared per-item logic on host memory) or launches the XPU3 kernel
// of kernel/draft_model_preprocess.xpu.
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void draft_model_preprocess_clear(bool* not_need_stop);
FDMTP_XPU_KERNEL_DECL void draft_model_preprocess(fdmtp::DraftModelPreprocessArgs args);
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {
namespace {

constexpr const char* kOp = "draft_model_preprocess";

void cpu_wrapper(const DraftModelPreprocessArgs& args) { cpu::DraftModelPreprocess(args); }

int xpu3_wrapper(Context* ctx, const DraftModelPreprocessArgs& args) {
  Context one = *ctx;  // the flag reset runs on a single core
  one.clusters = 1;
  one.cores = 1;
  FDMTP_XPU_LAUNCH(kOp, &one, fdmtp_xpu3::draft_model_preprocess_clear, args.not_need_stop);
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::draft_model_preprocess, args);
  return kSuccess;
}

}  // namespace

int draft_model_preprocess(Context* ctx, const DraftModelPreprocessArgs& args) {
  return detail::Run(
      ctx, kOp, [&] { cpu_wrapper(args); },
      [&] { return xpu3_wrapper(ctx, args); });
}

}  // namespace xpu
}  // namespace fdmtp

// verify_draft_tokens: XPU plugin wrapper. Checks the kernel's capacity limits (xpu_limits.h), then
// runs cpu_wrapper (the shared per-item logic on host memory) or launches the XPU3 kernel
// of kernel/verify_draft_tokens.xpu.
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void verify_draft_tokens(fdmtp::VerifyDraftTokensArgs args);
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {
namespace {

constexpr const char* kOp = "verify_draft_tokens";

void cpu_wrapper(const VerifyDraftTokensArgs& args) { cpu::VerifyDraftTokens(args); }

int xpu3_wrapper(Context* ctx, const VerifyDraftTokensArgs& args) {
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::verify_draft_tokens, args);
  return kSuccess;
}

}  // namespace

int verify_draft_tokens(Context* ctx, const VerifyDraftTokensArgs& args) {
  return detail::Run(
      ctx, kOp, [&] { cpu_wrapper(args); },
      [&] { return xpu3_wrapper(ctx, args); });
}

}  // namespace xpu
}  // namespace fdmtp

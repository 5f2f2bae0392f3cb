// ngram_match: XPU plugin wrapper. Checks the kernel's capacity limits (xpu_limits.h), then
// runs cpu_wrapper (the shared per-item logic on host memory) or launches the XPU3 kernel
// of kernel/ngram_match.xpu.
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void ngram_match(fdmtp::NgramMatchArgs args);
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {
namespace {

constexpr const char* kOp = "ngram_match";

void cpu_wrapper(const NgramMatchArgs& args) { cpu::NgramMatch(args, 0); }

int xpu3_wrapper(Context* ctx, const NgramMatchArgs& args) {
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::ngram_match, args);
  return kSuccess;
}

}  // namespace

int ngram_match(Context* ctx, const NgramMatchArgs& args) {
  FDMTP_XPU_CHECK(detail::CheckLe(kOp, "batch size", args.bsz, "kMaxNgramBatch", kMaxNgramBatch));
  return detail::Run(
      ctx, kOp, [&] { cpu_wrapper(args); },
      [&] { return xpu3_wrapper(ctx, args); });
}

}  // namespace xpu
}  // namespace fdmtp

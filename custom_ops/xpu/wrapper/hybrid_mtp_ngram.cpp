// hybrid_mtp_ngram: XPU plugin wrapper. Checks the kernel's capacity limits (xpu_limits.h), then
// runs cpu_wrapper (the shared per-item logic on host memory) or launches the XPU3 kernel
// of kernel/hybrid_mtp_ngram.xpu.
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void hybrid_mtp_ngram(fdmtp::HybridMtpNgramArgs args);
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {
namespace {

constexpr const char* kOp = "hybrid_mtp_ngram";

void cpu_wrapper(const HybridMtpNgramArgs& args) { cpu::HybridMtpNgram(args, 0); }

int xpu3_wrapper(Context* ctx, const HybridMtpNgramArgs& args) {
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::hybrid_mtp_ngram, args);
  return kSuccess;
}

}  // namespace

int hybrid_mtp_ngram(Context* ctx, const HybridMtpNgramArgs& args) {
  FDMTP_XPU_CHECK(detail::CheckLe(kOp, "batch size", args.bsz, "kMaxNgramBatch", kMaxNgramBatch));
  return detail::Run(
      ctx, kOp, [&] { cpu_wrapper(args); },
      [&] { return xpu3_wrapper(ctx, args); });
}

}  // namespace xpu
}  // namespace fdmtp

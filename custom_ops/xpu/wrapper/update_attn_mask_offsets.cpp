// update_attn_mask_offsets: XPU plugin wrapper. Checks the kernel's capacity limits (xpu_limits.h), then
// runs cpu_wrapper (the shared per-item logic on host memory) or launches the XPU3 kernel
// of kernel/update_attn_mask_offsets.xpu.
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void update_attn_mask_offsets_zero(int32_t* attn_mask_offsets, int64_t count);
FDMTP_XPU_KERNEL_DECL void update_attn_mask_offsets(fdmtp::UpdateAttnMaskOffsetsArgs args);
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {
namespace {

constexpr const char* kOp = "update_attn_mask_offsets";

void cpu_wrapper(const UpdateAttnMaskOffsetsArgs& args) { cpu::UpdateAttnMaskOffsets(args); }

int xpu3_wrapper(Context* ctx, const UpdateAttnMaskOffsetsArgs& args) {
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::update_attn_mask_offsets_zero, args.attn_mask_offsets, 2 * args.token_num);
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::update_attn_mask_offsets, args);
  return kSuccess;
}

}  // namespace

int update_attn_mask_offsets(Context* ctx, const UpdateAttnMaskOffsetsArgs& args) {
  return detail::Run(
      ctx, kOp, [&] { cpu_wrapper(args); },
      [&] { return xpu3_wrapper(ctx, args); });
}

}  // namespace xpu
}  // namespace fdmtp

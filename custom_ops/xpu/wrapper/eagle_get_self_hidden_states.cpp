// eagle_get_self_hidden_states: XPU plugin wrapper. Checks the kernel's capacity limits (xpu_limits.h), then
// runs cpu_wrapper (the shared per-item logic on host memory) or launches the XPU3 kernel
// of kernel/eagle_get_self_hidden_states.xpu; the three float dtypes share one kernel (rows move as bytes).
#include "wrapper.h"

namespace fdmtp_xpu3 {
FDMTP_XPU_KERNEL_DECL void eagle_get_self_hidden_states(fdmtp::EagleGetSelfHiddenStatesArgs args, int64_t elem_bytes);
}  // namespace fdmtp_xpu3

namespace fdmtp {
namespace xpu {
namespace {

constexpr const char* kOp = "eagle_get_self_hidden_states";

template <typename T>
void cpu_wrapper(const EagleGetSelfHiddenStatesArgs& args) { cpu::EagleGetSelfHiddenStates<T>(args); }

template <typename T>
int xpu3_wrapper(Context* ctx, const EagleGetSelfHiddenStatesArgs& args) {
  const int64_t elem_bytes = static_cast<int64_t>(sizeof(T));
  FDMTP_XPU_LAUNCH(kOp, ctx, fdmtp_xpu3::eagle_get_self_hidden_states, args, elem_bytes);
  return kSuccess;
}

}  // namespace

template <typename T>
int eagle_get_self_hidden_states(Context* ctx, const EagleGetSelfHiddenStatesArgs& args) {
  FDMTP_XPU_CHECK(detail::CheckLe(kOp, "batch size", args.rows.bsz, "kMaxBatch", kMaxBatch));
  return detail::Run(
      ctx, kOp, [&] { cpu_wrapper<T>(args); },
      [&] { return xpu3_wrapper<T>(ctx, args); });
}

#define FDMTP_INSTANTIATE(T) template int eagle_get_self_hidden_states<T>(Context*, const EagleGetSelfHiddenStatesArgs&);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace xpu
}  // namespace fdmtp

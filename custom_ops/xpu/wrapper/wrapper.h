// Helpers of the XPU plugin functions (generated into the build folder's xpu_plugin.cpp from
// the op declarations, plus wrapper/emulator_selftest.cpp): named-limit checks, the device
// switch between the CPU kernel and the XPU3 launches, and the launch macro.
#pragma once

#include <string>

#include "xpu/plugin.h"

#if defined(FDMTP_XPU_EMULATOR)
#include "xpu/emu/kp_emu.h"
// Kernel declarations in the wrappers: plain functions under the emulator.
#define FDMTP_XPU_KERNEL_DECL
#else
#include "xpu/runtime.h"
#define FDMTP_XPU_KERNEL_DECL __attribute__((global))
#endif

namespace fdmtp {
namespace xpu {
namespace detail {

void SetLastError(const std::string& message);

// Records "<op>: <message>" and returns kInvalidArgument.
int InvalidArgument(const char* op, const std::string& message);
// Records a failed launch of `kernel` and returns kLaunchFailed.
int LaunchFailed(const char* op, const std::string& message);

// `value` (named `what`) must be <= the named limit `limit_name` = `limit`.
inline int CheckLe(const char* op, const char* what, int64_t value, const char* limit_name,
                   int64_t limit) {
  if (value <= limit) return kSuccess;
  return InvalidArgument(op, std::string(what) + " = " + std::to_string(value) +
                                 " exceeds the XPU3 kernel limit " + limit_name + " = " +
                                 std::to_string(limit));
}

// The launch shape of the single-core helper kernels (flag resets before the main kernel).
inline Context SingleCore(const Context& ctx) {
  Context one = ctx;
  one.clusters = 1;
  one.cores = 1;
  return one;
}

// The device switch of every public plugin function (FastDeploy's ctx->dev().type()).
template <typename CpuFn, typename Xpu3Fn>
int Run(const Context* ctx, const char* op, CpuFn&& cpu_fn, Xpu3Fn&& xpu3_fn) {
  switch (ctx->dev) {
    case DevType::kCpu: cpu_fn(); return kSuccess;
    case DevType::kXpu3: return xpu3_fn();
  }
  SetLastError(std::string(op) + ": no implementation for this device (WRAPPER_UNIMPLEMENTED)");
  return kUnimplemented;
}

}  // namespace detail
}  // namespace xpu
}  // namespace fdmtp

// Launches `kernel` on ctx's clusters x cores (and stream); returns kLaunchFailed from the
// enclosing function if the launch (or the emulated kernel) fails.
#if defined(FDMTP_XPU_EMULATOR)
#define FDMTP_XPU_LAUNCH(op, ctx, kernel, ...)                                         \
  do {                                                                                 \
    std::string launch_error_;                                                         \
    if (::fdmtp::xpu_emu::Launch((ctx)->clusters, (ctx)->cores, #kernel,               \
                                 [&] { kernel(__VA_ARGS__); }, &launch_error_) != 0) { \
      return ::fdmtp::xpu::detail::LaunchFailed(op, launch_error_);                    \
    }                                                                                  \
  } while (0)
#else
#define FDMTP_XPU_LAUNCH(op, ctx, kernel, ...)                                            \
  do {                                                                                    \
    const int launch_ret_ =                                                               \
        kernel<<<(ctx)->clusters, (ctx)->cores, static_cast<XPUStream>((ctx)->stream)>>>( \
            __VA_ARGS__);                                                                 \
    if (launch_ret_ != 0) {                                                               \
      return ::fdmtp::xpu::detail::LaunchFailed(                                          \
          op, std::string(#kernel " launch returned ") + std::to_string(launch_ret_));    \
    }                                                                                     \
  } while (0)
#endif

// Returns from the enclosing function when a check failed.
#define FDMTP_XPU_CHECK(expr)               \
  do {                                      \
    const int check_ret_ = (expr);          \
    if (check_ret_ != 0) return check_ret_; \
  } while (0)

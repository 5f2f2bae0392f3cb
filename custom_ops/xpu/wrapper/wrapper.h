// Helpers of the XPU plugin functions (generated into the build folder's xpu_plugin.cpp from
// the op declarations, plus wrapper/emulator_selftest.cpp): named-limit checks, the device
// switch between the CPU kernel and the XPU3 launches, and the launch macro.
#pragma once

#include <string>

#include "xpu/plugin.h"

#if defined(FDMTP_XPU_EMULATOR)
#include "xpu/emu/kp_launch.h"
// Kernel declarations in the wrappers: under the emulator, each kernel's emulator entry
// (the kernel units are device code with their own argument types, see emu/kp_launch.h).
#define FDMTP_XPU_KERNEL(name, ...) FDMTP_XPU_EMU_ENTRY_DECL(name)
#else
#include "xpu/runtime.h"
#define FDMTP_XPU_KERNEL(name, ...)               \
  namespace fdmtp_xpu3 {                          \
  __attribute__((global)) void name(__VA_ARGS__); \
  }
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

// Launches kernel fdmtp_xpu3::<kernel> on ctx's clusters x cores and ctx's stream;
// returns kLaunchFailed from the enclosing function if the launch (or the emulated kernel)
// fails. `kernel` is the bare kernel name.
#if defined(FDMTP_XPU_EMULATOR)
#define FDMTP_XPU_LAUNCH(op, ctx, kernel, ...)                                       \
  do {                                                                               \
    std::string launch_error_;                                                       \
    if (::fdmtp_kpemu::HostLaunch((ctx)->clusters, (ctx)->cores,                     \
                                  &FDMTP_XPU_EMU_ENTRY_NAME(kernel), &launch_error_, \
                                  ##__VA_ARGS__) != 0) {                             \
      return ::fdmtp::xpu::detail::LaunchFailed(op, launch_error_);                  \
    }                                                                                \
  } while (0)
#else
#define FDMTP_XPU_LAUNCH(op, ctx, kernel, ...)                                            \
  do {                                                                                    \
    const int launch_ret_ = ::fdmtp_xpu3::                                                \
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

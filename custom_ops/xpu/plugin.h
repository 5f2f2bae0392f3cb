// fastdeploy_mtp XPU plugin, in the layering of FastDeploy's Kunlun plugin
// (custom_ops/xpu_ops/src/plugin): the context and status types here, one generated
// function per declared op (fdmtp/xpu_ops.h, xpu_plugin.cpp). Each function checks its capacity
// limits (xpu_limits.h), then runs on the context's device: kCpu runs the CPU kernel (the shared
// per-item logic of include/fdmtp/ on host memory), kXpu3 launches the XPU3 kernel of
// kernel/<op>.xpu: on a Kunlun device with the real toolchain (FDMTP_WITH_XPU), or under
// the emulator (emu/kp_emu.h) on host memory in the default build.
//
// Every function returns 0 on success, else an error code; LastError() then holds a
// message naming the op and the violated limit or the failed launch.
#pragma once

#include <string>

#include "fdmtp/kernels.h"
#include "fdmtp/xpu_ops.h"  // generated: one plugin function per declared op
#include "xpu/xpu_limits.h"

namespace fdmtp {
namespace xpu {

enum class DevType { kCpu, kXpu3 };

// What FastDeploy's api::Context carries for these ops: the device kind, the launch shape
// and the XPU stream (XPUStream; nullptr = the default stream).
struct Context {
  DevType dev = DevType::kXpu3;
  int clusters = kDefaultClusters;
  int cores = kDefaultCores;
  void* stream = nullptr;
};

enum Status : int {
  kSuccess = 0,
  kInvalidArgument = 1,  // an argument or capacity check failed
  kLaunchFailed = 2,     // the kernel launch (or the emulated kernel) failed
  kUnimplemented = 3,    // no implementation for this context's device
};

// The message of the last failure on this thread.
const std::string& LastError();

// Host tensors run the XPU3 kernels under the emulator while an EmulationScope is alive on
// this thread (the framework-free module's `xpu_emulation((clusters, cores))`).
class EmulationScope {
 public:
  EmulationScope(int clusters, int cores);
  ~EmulationScope();
  EmulationScope(const EmulationScope&) = delete;
  EmulationScope& operator=(const EmulationScope&) = delete;

 private:
  const Context* previous_;
  Context context_;
};
// The active emulation context of this thread, or nullptr.
const Context* ActiveEmulation();

// Emulator self-checks (tests only): kernels that break the KP rules on purpose, to show
// the emulator reports them. which: "local_overflow", "barrier_mismatch", "missing_mfence",
// "foreign_local" or "stack_overflow".
int emulator_selftest(Context* ctx, const std::string& which);

}  // namespace xpu
}  // namespace fdmtp

// The emulators for Paddle CPU tensors: `fastdeploy_mtp.ops.emulate("cuda" | "xpu")` calls
// these C functions through ctypes, because this library holds its own copy of the
// emulation state (the framework-free module has another). While a scope is open on a
// thread, the ops called there on CPU tensors run their CUDA kernels under the CUDA
// emulator, or their XPU3 kernels under the KP emulator.
#include <cstdint>
#include <memory>
#include <variant>
#include <vector>

#include "gpu/emu/cuda_emu_rt.h"
#include "xpu/plugin.h"

namespace {

using Scope =
    std::variant<std::unique_ptr<cuda_emu_rt::Scope>, std::unique_ptr<fdmtp::xpu::EmulationScope>>;
thread_local std::vector<Scope> t_scopes;

}  // namespace

// Opens a CUDA-emulator scope on this thread (shape 0: launches as asked, 1: small blocks
// and grids). Returns 0, or 1 for a bad shape.
extern "C" __attribute__((visibility("default"))) int fdmtp_emulation_push_cuda(int shape) {
  if (shape != 0 && shape != 1) return 1;
  t_scopes.emplace_back(std::make_unique<cuda_emu_rt::Scope>(shape));
  return 0;
}

// Opens a KP-emulator scope on this thread, launching <<<clusters, cores>>>. Returns 0.
extern "C" __attribute__((visibility("default"))) int fdmtp_emulation_push_xpu(int clusters,
                                                                               int cores) {
  t_scopes.emplace_back(std::make_unique<fdmtp::xpu::EmulationScope>(clusters, cores));
  return 0;
}

// Closes the innermost scope of this thread. Returns 0, or 1 when none is open.
extern "C" __attribute__((visibility("default"))) int fdmtp_emulation_pop() {
  if (t_scopes.empty()) return 1;
  t_scopes.pop_back();
  return 0;
}

// Kernel launches run under the CUDA emulator by this library so far (tests check that an
// emulated op really ran its CUDA kernels).
extern "C" __attribute__((visibility("default"))) int64_t fdmtp_emulation_cuda_launches() {
  return cuda_emu_rt::LaunchCount();
}

// Device dispatch used by the generated op entries (and the IPC entries): run the CPU
// kernel, the CUDA launcher or the XPU plugin, or fail with a message that names the op and
// says which backend is missing.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fdmtp/dtype_dispatch.h"
#include "fdmtp/entry_api.h"
#include "fdmtp/kernels.h"
#include "fdmtp/tensor_ref.h"
#include "gpu/emu/cuda_emu_rt.h"
#include "xpu/plugin.h"

namespace fdmtp {

// A float32, float16 or bfloat16 tensor (the element types of the templated kernels).
inline void CheckFloat(const ArgChecker& check, const TensorRef& t) {
  DispatchFloat(check, t, [](auto) {});
}

// `bytes` of device scratch for a CUDA launcher from the binding's allocator; nullptr when
// none is needed (bytes == 0: the launch is skipped).
inline void* CudaWorkspace(const ArgChecker& check, ScratchAllocator* scratch, size_t bytes) {
  if (bytes == 0) return nullptr;
  if (scratch == nullptr) check.Fail("internal: no scratch allocator for a CUDA call");
  void* workspace = scratch->Allocate(bytes);
  if (workspace == nullptr) check.Fail("could not allocate the CUDA scratch");
  return workspace;
}

// Runs `cpu_fn()` or `cuda_fn()` (which returns a cudaError_t as int) for `device`.
template <typename CpuFn, typename CudaFn>
void Dispatch(const ArgChecker& check, Device device, CpuFn&& cpu_fn, CudaFn&& cuda_fn) {
  switch (device) {
    case Device::kCPU: cpu_fn(); return;
    case Device::kCUDA: {
#if defined(FDMTP_WITH_CUDA)
      const int status = cuda_fn();
      if (status != 0) {
        check.Fail(std::string("CUDA launch failed: ") + cuda::ErrorName(status) + ": " +
                   cuda::ErrorString(status));
      }
#else
      (void)cuda_fn;
      check.Fail(
          "the tensors are on a CUDA device but this build of fastdeploy_mtp has no CUDA "
          "kernels (rebuild with nvcc available, or -DFDMTP_WITH_CUDA=ON)");
#endif
      return;
    }
    case Device::kXPU:
      check.Fail(
          "the tensors are on an XPU device but this build of fastdeploy_mtp has no XPU "
          "kernels (FDMTP_WITH_XPU is OFF)");
    case Device::kOther: break;
  }
  check.Fail("the tensors are on an unsupported device");
}

// Runs an XPU plugin function (xpu_fn(xpu::Context*) returns its status) on `ctx`. The
// generated entries' xpu_fn first sets ctx->stream to the op call's stream: the stream of
// the tensors' place (Paddle: StreamOf in paddle/paddle_tensor.cc; the framework-free module:
// its `stream` argument), so XPU3 kernels launch on it, not on the null stream.
template <typename XpuFn>
void RunXpu(const ArgChecker& check, XpuFn&& xpu_fn, xpu::Context* ctx) {
  if (xpu_fn(ctx) != xpu::kSuccess) check.Fail("XPU plugin failed: " + xpu::LastError());
}

// As above, plus the XPU3 path: tensors on an XPU device run the XPU3 kernels (builds with
// FDMTP_WITH_XPU), and host tensors run them under the emulator while an
// xpu::EmulationScope is alive on this thread (the framework-free module's
// `xpu_emulation`); otherwise host tensors run cpu_fn.
template <typename CpuFn, typename CudaFn, typename XpuFn>
void Dispatch(const ArgChecker& check, Device device, CpuFn&& cpu_fn, CudaFn&& cuda_fn,
              XpuFn&& xpu_fn) {
  if (device == Device::kCPU && xpu::ActiveEmulation() != nullptr) {
    xpu::Context ctx = *xpu::ActiveEmulation();
    RunXpu(check, xpu_fn, &ctx);
    return;
  }
#if defined(FDMTP_WITH_XPU)
  if (device == Device::kXPU) {
    xpu::Context ctx;  // XPU3, the default launch shape; xpu_fn sets the tensors' stream
    RunXpu(check, xpu_fn, &ctx);
    return;
  }
#endif
  Dispatch(check, device, cpu_fn, cuda_fn);
}

// Runs `emu_fn()` (an op's CUDA launcher compiled for the CUDA emulator, returning its
// cudaError_t) with the op's tensors registered as the memory its kernels may touch; a
// failed launch fails the op with the emulator's message.
template <typename EmuFn>
void RunCudaEmulated(const ArgChecker& check, const std::vector<const TensorRef*>& tensors,
                     EmuFn&& emu_fn) {
  std::vector<std::unique_ptr<cuda_emu_rt::RangeScope>> ranges;
  for (const TensorRef* t : tensors) {
    const size_t bytes = static_cast<size_t>(t->numel()) * DTypeBytes(t->dtype);
    ranges.push_back(std::make_unique<cuda_emu_rt::RangeScope>(t->data, bytes));
  }
  cuda_emu_rt::ClearLastError();
  const int status = emu_fn();
  if (status != 0) {
    const std::string message = cuda_emu_rt::LastMessage();
    check.Fail("CUDA launch failed: " +
               (message.empty() ? "cudaError_t " + std::to_string(status) : message));
  }
}

// As above, plus the CUDA emulator: host tensors run the op's CUDA kernels under the
// emulator while a cuda_emu_rt::Scope is alive on this thread (`emulate("cuda")` in
// Python). `tensors` are every tensor of the call.
template <typename CpuFn, typename CudaFn, typename XpuFn, typename EmuFn>
void Dispatch(const ArgChecker& check, Device device, CpuFn&& cpu_fn, CudaFn&& cuda_fn,
              XpuFn&& xpu_fn, const std::vector<const TensorRef*>& tensors, EmuFn&& emu_fn) {
  if (device == Device::kCPU && cuda_emu_rt::ActiveShape() >= 0) {
    if (xpu::ActiveEmulation() != nullptr) {
      check.Fail("both the CUDA and the XPU emulators are active on this thread; use one");
    }
    RunCudaEmulated(check, tensors, emu_fn);
    return;
  }
  Dispatch(check, device, cpu_fn, cuda_fn, xpu_fn);
}

}  // namespace fdmtp

// fastdeploy_mtp._kernels: the ops without Paddle. Tensors are DLPack objects or raw
// pointer tuples (see tensor_arg.h); CUDA work is launched on `stream` (an integer
// cudaStream_t, 0 = legacy default stream) and is not synchronised.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "emu_common/access_hooks.h"
#include "fdmtp/ops.h"
#include "generated_ops.h"
#include "gpu/emu/cuda_emu_rt.h"
#include "ipc_bindings.h"
#include "xpu/plugin.h"

namespace py = pybind11;

namespace {

py::dict BuildInfo() {
  py::dict info;
  info["cuda"] = fdmtp::BuiltWithCuda();
  info["xpu"] = fdmtp::BuiltWithXpu();
  // The XPU3 kernels under the emulator (host tensors, see xpu_emulation).
  info["xpu_emulator"] = !fdmtp::BuiltWithXpu();
  // The CUDA kernels under the CUDA emulator (always built), and whether its access checks
  // (bounds, shared-memory races) are compiled in (not in the AddressSanitizer build).
  info["cuda_emulator"] = true;
  info["emulator_access_checks"] = fdmtp::emu::AccessHooksCompiledIn();
#if defined(FDMTP_CUDA_ARCHS_STRING)
  info["cuda_archs"] = FDMTP_CUDA_ARCHS_STRING;
#else
  info["cuda_archs"] = "";
#endif
  return info;
}

// (usable, reason): whether CUDA kernels can be launched in this process.
py::tuple CudaStatus() {
#if defined(FDMTP_WITH_CUDA)
  int count = 0;
  int status = fdmtp::cuda::DeviceCount(&count);
  if (status != 0) {
    return py::make_tuple(false, std::string("no usable CUDA device: ") +
                                     fdmtp::cuda::ErrorName(status) + ": " +
                                     fdmtp::cuda::ErrorString(status));
  }
  if (count == 0) return py::make_tuple(false, std::string("no CUDA device found"));
  status = fdmtp::cuda::Probe(nullptr);
  if (status != 0) {
    return py::make_tuple(false, std::string("a test kernel launch failed: ") +
                                     fdmtp::cuda::ErrorName(status) + ": " +
                                     fdmtp::cuda::ErrorString(status));
  }
  return py::make_tuple(true, std::to_string(count) + " CUDA device(s)");
#else
  return py::make_tuple(false, std::string("fastdeploy_mtp was built without CUDA kernels"));
#endif
}

// `with _kernels.xpu_emulation(clusters, cores):` runs every op called on host tensors on
// this thread through its XPU3 kernel under the emulator, launched <<<clusters, cores>>>.
class XpuEmulation {
 public:
  XpuEmulation(int clusters, int cores) : clusters_(clusters), cores_(cores) {}
  XpuEmulation& Enter() {
    if (scope_) throw fdmtp::Error("xpu_emulation: this scope is already active");
    scope_ = std::make_unique<fdmtp::xpu::EmulationScope>(clusters_, cores_);
    return *this;
  }
  void Exit(py::handle, py::handle, py::handle) { scope_.reset(); }

 private:
  int clusters_;
  int cores_;
  std::unique_ptr<fdmtp::xpu::EmulationScope> scope_;
};

// `with _kernels.cuda_emulation(shape):` runs every op called on host tensors on this
// thread through its CUDA kernels under the CUDA emulator; shape 0 launches them as the
// launchers ask, shape 1 with small blocks and grids (cuda_emu_rt::Scope).
class CudaEmulation {
 public:
  explicit CudaEmulation(int shape) : shape_(shape) {
    if (shape != 0 && shape != 1) {
      throw fdmtp::Error("cuda_emulation: shape must be 0 (as launched) or 1 (small blocks), got " +
                         std::to_string(shape));
    }
  }
  CudaEmulation& Enter() {
    if (scope_) throw fdmtp::Error("cuda_emulation: this scope is already active");
    scope_ = std::make_unique<cuda_emu_rt::Scope>(shape_);
    return *this;
  }
  void Exit(py::handle, py::handle, py::handle) { scope_.reset(); }

 private:
  int shape_;
  std::unique_ptr<cuda_emu_rt::Scope> scope_;
};

// Runs one of the CUDA emulator's self-test kernels (tests only): returns the 64 values it
// wrote, or raises with the emulator's report.
py::array_t<int64_t> CudaEmulatorSelftest(const std::string& which) {
  py::array_t<int64_t> out(64);
  int64_t* data = out.mutable_data();
  for (int i = 0; i < 64; ++i) data[i] = -1;
  const int status = fdmtp_cuda_emulated::Selftest(which.c_str(), data);
  if (status == -1) throw fdmtp::Error("_cuda_emulator_selftest: unknown kernel '" + which + "'");
  if (status != 0) throw fdmtp::Error(cuda_emu_rt::LastMessage());
  return out;
}

// Runs one of the emulator's rule-breaking kernels (tests only); raises KernelError with
// the emulator's report.
void XpuEmulatorSelftest(const std::string& which, int clusters, int cores) {
  fdmtp::xpu::Context ctx;
  ctx.clusters = clusters;
  ctx.cores = cores;
  if (fdmtp::xpu::emulator_selftest(&ctx, which) != fdmtp::xpu::kSuccess) {
    throw fdmtp::Error(fdmtp::xpu::LastError());
  }
}

}  // namespace

PYBIND11_MODULE(_kernels, m) {
  m.doc() = "fastdeploy_mtp kernels without Paddle: DLPack or raw-pointer tensors in, in place.";
  // Argument and launch errors: ValueError, with the op and argument named in the message.
  py::register_exception<fdmtp::Error>(m, "KernelError", PyExc_ValueError);
  m.def("build_info", &BuildInfo, "Backends compiled into this module: {cuda, xpu, cuda_archs}.");
  m.def("cuda_status", &CudaStatus,
        "(usable: bool, reason: str): whether CUDA kernels can run in this process.");
  py::class_<XpuEmulation>(m, "xpu_emulation",
                           "Context manager: ops on host tensors run their XPU3 kernels under "
                           "the emulator, launched with <<<clusters, cores>>> (this thread only).")
      .def(py::init<int, int>(), py::arg("clusters"), py::arg("cores"))
      .def("__enter__", &XpuEmulation::Enter, py::return_value_policy::reference)
      .def("__exit__", &XpuEmulation::Exit);
  py::class_<CudaEmulation>(m, "cuda_emulation",
                            "Context manager: ops on host tensors run their CUDA kernels under "
                            "the CUDA emulator (this thread only); shape 0 launches them as "
                            "asked, shape 1 with blocks of at most 64 threads and grids of at "
                            "most 3 blocks.")
      .def(py::init<int>(), py::arg("shape") = 0)
      .def("__enter__", &CudaEmulation::Enter, py::return_value_policy::reference)
      .def("__exit__", &CudaEmulation::Exit);
  m.def("_cuda_emulator_selftest", &CudaEmulatorSelftest, py::arg("which"),
        "Tests only: run one of the CUDA emulator's self-test kernels.");
  m.def("_cuda_emulator_launches", &cuda_emu_rt::LaunchCount,
        "Kernel launches run under the CUDA emulator in this module so far.");
  m.def("_xpu_emulator_selftest", &XpuEmulatorSelftest, py::arg("which"), py::arg("clusters"),
        py::arg("cores"), "Tests only: run a KP-rule-breaking kernel under the emulator.");
  fdmtp::pybind::DefineOps(m);  // every declared op (generated: pybind_ops.cc)
  fdmtp::pybind::DefineIpc(m);  // set_data_ipc, share_external_data, unset_data_ipc
}
